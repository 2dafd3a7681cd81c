"""`specsteer models add`: a model the user brings (GGUF file or Hugging Face folder) compiled,
registered by name and run like a registry model; anything else refused in one line.

The supported architectures are each added here from a tiny random-weight Hugging Face folder
and compared with transformers on the same weights (fp32: the same logits); a GGUF file is
added from the SmolLM2 file the registry fetches, as if it were the user's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specsteer.client import Client
from specsteer.errors import ModelError, UnknownModelError
from specsteer.models import registry
from specsteer.models.add import add_model
from specsteer.models.fetch import source_sha256
from specsteer.models.manifest import check_files, read_manifest
from specsteer.models.source import SUPPORTED, inspect
from specsteer.models.tiny import tiny_hf_folder
from specsteer.runtime import load_device_model, ort_device
from specsteer.tokenizer import Message

REPO = Path(__file__).resolve().parents[2]
# a template of the Gemma kind (not ChatML), so a test can tell the model's own was used
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
            "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def _write_gguf(path: Path, arch: str, **meta: str) -> Path:
    """A real GGUF file (the gguf package's writer) with a vocabulary array and one tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(meta.pop("name", f"tiny {arch}"))
    writer.add_token_list([f"tok{i}" for i in range(300)])  # an array to skip
    for key, value in meta.items():
        writer.add_string(key, value)
    writer.add_tensor("w", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_header_is_read_for_its_architecture_name_and_template(tmp_path):
    source = inspect(_write_gguf(tmp_path / "m.gguf", "qwen2", name="My Qwen 0.5B",
                                 **{"tokenizer.chat_template": TEMPLATE}))
    assert (source.kind, source.family, source.title) == ("gguf", "qwen2", "My Qwen 0.5B")
    assert source.chat_template == TEMPLATE and source.default_name == "my-qwen-0.5b"
    assert inspect(_write_gguf(tmp_path / "b.gguf", "llama")).chat_template is None


@pytest.mark.parametrize(("arch", "why"), [
    ("mamba", "state-space"), ("qwen2moe", "mixture-of-experts"), ("t5", "encoder"),
    ("gpt2", "does not build"), ("falcon", "does not build"),
])
def test_an_unsupported_architecture_is_refused_in_one_line(tmp_path, arch, why):
    with pytest.raises(ModelError) as refused:
        inspect(_write_gguf(tmp_path / "m.gguf", arch))
    message = str(refused.value)
    assert why in message and "\n" not in message
    assert f"supported: {', '.join(SUPPORTED)}" in message


def test_what_is_not_a_model_is_refused_in_one_line(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    empty = tmp_path / "empty"
    empty.mkdir()
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    gpt2 = tmp_path / "gpt2"
    shutil.copytree(weightless, gpt2)
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (gpt2 / "model.safetensors").write_bytes(b"")
    cases = {text: "is not a model: neither a GGUF file", empty: "has a config.json",
             weightless: "holds no weights", tmp_path / "missing": "does not exist",
             gpt2: "'GPT2LMHeadModel' model"}
    for path, expected in cases.items():
        with pytest.raises(ModelError, match=expected) as refused:
            inspect(path)
        assert "\n" not in str(refused.value)


def test_the_command_answers_a_bad_path_with_one_red_line(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0" * 64)
    env = {**os.environ, "SPECSTEER_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "sdk"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "specsteer", "models", "add",
                           str(tmp_path / "x.bin")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'x.bin'} is not a model: neither a GGUF file nor a Hugging Face "
        "folder (a folder with config.json and its weights)"]
    assert not (tmp_path / "home" / registry.ADDED).exists()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _with_template(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    (dest / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return dest


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mistral", "qwen3", "phi3", "gemma2", "gemma3"])
def test_each_supported_architecture_is_added_and_runs_as_transformers_does(home, tmp_path,
                                                                            monkeypatch, arch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _with_template(tiny_hf_folder(arch), tmp_path / f"my-{arch}")
    made = add_model(folder, name=f"tiny-{arch}", precision="fp32")
    manifest = read_manifest(made.folder)
    check_files(made.folder, manifest, full_hash=True)
    assert (manifest["source_sha256"], manifest["source"]) == (source_sha256(folder),
                                                               str(folder))
    assert (manifest["precision"], manifest["architecture"]) == ("fp32", arch)
    assert manifest["chat_template"] == "jinja"
    assert registry.get_spec(f"tiny-{arch}").source == str(folder)

    model = load_device_model(f"tiny-{arch}", threads=1)  # by name, like a registry model
    ids = list(range(5, 165))  # past the gemma models' 64-token sliding window
    with torch.no_grad():
        reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(
            torch.tensor([ids])).logits[0].numpy()
    got = model.new_session().append(ids)
    np.testing.assert_allclose(got, reference, atol=5e-3, rtol=1e-3)  # float32 order
    if model.info.sliding_window:  # a cache is never smaller than the window, grown or not
        monkeypatch.setattr(ort_device, "_MIN_CAPACITY", model.info.sliding_window // 2)
        session = model.new_session()
        assert session.capacity == model.info.sliding_window
        for at in range(0, len(ids), 50):
            np.testing.assert_allclose(session.append(ids[at: at + 50]), reference[at: at + 50],
                                       atol=5e-3, rtol=1e-3)
    chat = [Message("system", "Be brief."), Message("user", "Hello"),
            Message("assistant", "Hi."), Message("user", "Write a note.")]
    expected = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        [{"role": m.role, "content": m.content} for m in chat], tokenize=False,
        add_generation_prompt=True)
    assert model.tokenizer.render_chat(chat) == expected
    assert "<start_of_turn>model\n" in expected


@pytest.mark.slow
def test_an_added_pair_serves_by_name_in_the_companion_client_and_bridge(home, tmp_path):
    """Two added models of one tokenizer: the companion serves them by name, a Client drafts
    with one by name, the bridge loads it by name; a changed source is refused."""
    from specsteer_companion.process import start_companion

    sys.path.insert(0, str(REPO / "tests" / "bridge"))
    from helpers.bridge_process import BridgeProcess

    add_model(tiny_hf_folder("qwen3", seed=0), name="my-small")
    generalist = add_model(tiny_hf_folder("qwen3", seed=1), name="my-large")
    assert generalist.tokenizer_note == ("tokenizer: the same as my-small: pairs with them "
                                         "run token by token")
    listed = json.loads(subprocess.run(
        [sys.executable, "-m", "specsteer", "models", "list", "--json"], capture_output=True,
        text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO / "sdk")}).stdout)
    mine = {row["name"]: row for row in listed if row["name"].startswith("my-")}
    assert set(mine) == {"my-small", "my-large"}
    assert mine["my-small"]["gguf"]["state"] == "added" and "int8" in mine["my-small"]["compiled"]

    proc, url = start_companion("my-large", "my-small", "int8")
    try:
        result = Client("my-small", companion=url).generate("Budget for next quarter",
                                                              max_new_tokens=12)
    finally:
        proc.terminate()
        proc.wait(10)
    assert not result.stats.degraded and result.stats.drafted > 0

    bridge = BridgeProcess("--specialist", "my-small", log=tmp_path / "bridge.log")
    try:
        answer = bridge.call("generate", {"query": "Budget", "max_new_tokens": 4})
    finally:
        assert bridge.close() == 0
    assert answer["result"]["stats"]["tokens"] > 0

    (Path(registry.get_spec("my-small").source) / "extra.txt").write_text("changed")
    with pytest.raises(ModelError, match="changed since it was added as my-small"):
        from specsteer.models.compile import compile_model

        compile_model("my-small", "fp32")


@pytest.fixture(scope="module")
def qwen2_folder() -> Path:
    """The tiny Qwen2 HF folder from the shared test-model cache (built there once), not from
    the test's empty home, where it was rebuilt on every run (~9 s)."""
    return tiny_hf_folder("qwen2")


def test_a_name_is_checked_before_anything_is_built(qwen2_folder, home, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(qwen2_folder, folder)
    for name, why in (("qwen2.5-0.5b", "a registry model's"), ("Bad Name", "lower-case")):
        with pytest.raises(ModelError, match=why):
            add_model(folder, name=name)
    assert registry.added() == {}
    with pytest.raises(UnknownModelError, match="unknown model 'm'"):
        registry.get_spec("m")


@pytest.mark.real_model
@pytest.mark.slow
def test_a_gguf_file_is_added_by_path_as_the_users_own(tmp_path, monkeypatch):
    """SmolLM2's GGUF (fetched by the registry, then copied where a user keeps files) added
    under a name of its own, into a fresh cache: its chat template is the file's, rendered as
    transformers renders it from the file, its tokenizer the registry build's, and it
    generates by name."""
    from helpers.real_models import real_model
    from transformers import AutoTokenizer

    registered = real_model("smollm2-135m")  # the registry's, in the cache in use
    gguf = registry.gguf_path(registry.get_spec("smollm2-135m"))
    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    mine = tmp_path / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    mine.parent.mkdir()
    shutil.copy2(gguf, mine)

    made = add_model(mine, name="my-smollm")
    manifest = read_manifest(made.folder)
    assert manifest["source_sha256"] == source_sha256(mine) == registry.get_spec(
        "my-smollm").sha256
    assert manifest["chat_template"] == "jinja"
    client = Client("my-smollm")
    chat = [Message("user", "Write a note about the garden.")]
    expected = AutoTokenizer.from_pretrained(mine.parent, gguf_file=mine.name).apply_chat_template(
        [{"role": "user", "content": "Write a note about the garden."}], tokenize=False,
        add_generation_prompt=True)
    assert client.specialist.tokenizer.render_chat(chat) == expected
    assert client.specialist.tokenizer.vocab_hash == registered.tokenizer.vocab_hash
    result = client.generate("Garden notes", task="note", max_new_tokens=8)
    assert result.stats.tokens > 0 and result.text.strip()


def test_an_added_file_that_changed_is_refused_and_never_replaced(home, tmp_path):
    """`fetch` of an added model verifies the user's own file and never deletes or downloads
    over it (a registry GGUF that fails its hash is fetched again; the user's is theirs)."""
    from specsteer.errors import ModelHashMismatch, ModelNotFetched
    from specsteer.models.fetch import fetch

    path = _write_gguf(tmp_path / "mine.gguf", "qwen2")
    spec = registry.ModelSpec(
        name="mine", title="mine", role="added gguf", architecture="qwen2",
        chat_template="none", packages=(), gguf_file=path.name, size=path.stat().st_size,
        sha256=source_sha256(path), vocab_size=0, default_precision="int8", source=str(path))
    registry.record_added(spec)
    assert fetch("mine") == path
    with path.open("ab") as f:
        f.write(b"more")
    with pytest.raises(ModelHashMismatch, match="changed since it was added as mine"):
        fetch("mine")
    assert path.read_bytes().endswith(b"more")  # still there, untouched
    path.unlink()
    with pytest.raises(ModelNotFetched, match="which is gone"):
        fetch("mine")
    registry.record_added(None, "mine")
    assert "mine" not in registry.registry()


def test_a_damaged_record_of_added_models_is_a_clear_error(home):
    home.mkdir(parents=True)
    (home / registry.ADDED).write_text("{not json")
    with pytest.raises(UnknownModelError, match="added.json is damaged"):
        registry.get_spec("qwen2.5-0.5b")
