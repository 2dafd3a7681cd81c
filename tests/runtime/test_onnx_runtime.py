"""The ONNX Runtime seam on tiny models: chunking, exact rewind, independent sessions, errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers.session_checks import check_session_errors

from specsteer.errors import CorruptModelError, ModelNotCompiled, TokenizerMissing
from specsteer.runtime import load_model

TEXT = "Dear team, thank you for the meeting notes. I will send the revised draft by Friday."


def _ids(model) -> list[int]:
    return model.tokenizer.encode(TEXT)


def test_chunked_append_equals_token_by_token(tiny_model):
    ids = _ids(tiny_model)
    chunked = tiny_model.new_session()
    rows = np.concatenate(
        [chunked.append(ids[:7]), chunked.append(ids[7:12]), chunked.append(ids[12:])]
    )
    single = tiny_model.new_session()
    one_by_one = np.stack([single.append([t])[0] for t in ids])
    assert rows.shape == (len(ids), tiny_model.vocab_size)
    np.testing.assert_allclose(rows, one_by_one, atol=1e-4)
    assert chunked.length == single.length == len(ids)


def test_append_rewind_equals_fresh_session(tiny_model):
    ids = _ids(tiny_model)
    session = tiny_model.new_session()
    session.append(ids[:10])
    session.append([5, 6, 7, 8])  # a rejected draft
    session.rewind(10)
    assert session.length == 10
    after = session.append(ids[10:])
    fresh = tiny_model.new_session()
    expected = fresh.append(ids)[10:]
    np.testing.assert_allclose(after, expected, atol=1e-5)


def test_sessions_are_independent(tiny_model):
    ids = _ids(tiny_model)
    a, b = tiny_model.new_session(), tiny_model.new_session()
    first = a.append(ids[:5])
    b.append(ids[::-1])
    again = tiny_model.new_session().append(ids[:5])
    np.testing.assert_allclose(first, again, atol=1e-6)
    np.testing.assert_allclose(
        a.append(ids[5:8]), tiny_model.new_session().append(ids[:8])[5:], atol=1e-4
    )


def test_two_models_differ(tiny_model, tiny_generalist):
    assert tiny_model.sha256 != tiny_generalist.sha256
    assert tiny_model.tokenizer.vocab_hash == tiny_generalist.tokenizer.vocab_hash
    ids = _ids(tiny_model)
    assert not np.allclose(
        tiny_model.new_session().append(ids), tiny_generalist.new_session().append(ids)
    )


def test_session_errors(tiny_model):
    check_session_errors(tiny_model)


@pytest.mark.slow  # torch and transformers build the reference
def test_greedy_matches_transformers_reference(tmp_path, tiny_model):
    """ORT fp32 greedy tokens == transformers on the same weights, 32 tokens."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from specsteer.models.tiny import hf_reference_dir

    recipe = tiny_model.manifest["recipe"]
    hf = AutoModelForCausalLM.from_pretrained(
        hf_reference_dir(tmp_path / "hf", recipe), dtype=torch.float32
    )
    ids = _ids(tiny_model)[:12]
    ort_tokens, session = [], tiny_model.new_session()
    logits = session.append(ids)
    for _ in range(32):
        ort_tokens.append(int(np.argmax(logits[-1])))
        logits = session.append([ort_tokens[-1]])
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=32,
            do_sample=False,
            min_new_tokens=32,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert ort_tokens == out[0, len(ids) :].tolist()


def _copy_model(tiny_model, tmp_path):
    dest = tmp_path / "model"
    shutil.copytree(tiny_model.folder, dest)
    return dest


def test_truncated_weights_are_refused(tiny_model, tmp_path):
    folder = _copy_model(tiny_model, tmp_path)
    data = next(p for p in folder.iterdir() if p.name.endswith(".data"))
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    with pytest.raises(CorruptModelError, match="truncated"):
        load_model(folder)


def test_corrupt_weights_fail_full_verification(tiny_model, tmp_path):
    folder = _copy_model(tiny_model, tmp_path)
    onnx = folder / "model.onnx"
    raw = bytearray(onnx.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    onnx.write_bytes(bytes(raw))
    with pytest.raises(CorruptModelError, match="artifact hash"):
        load_model(folder, verify=True)


def test_garbage_graph_is_a_clear_error(tiny_model, tmp_path):
    folder = _copy_model(tiny_model, tmp_path)
    onnx = folder / "model.onnx"
    onnx.write_bytes(b"\x00not an onnx graph" * (onnx.stat().st_size // 18 + 1))
    manifest = json.loads((folder / "specsteer.json").read_text())
    manifest["files"]["model.onnx"] = onnx.stat().st_size
    (folder / "specsteer.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptModelError, match="could not load"):
        load_model(folder)


def test_missing_tokenizer(tiny_model, tmp_path):
    folder = _copy_model(tiny_model, tmp_path)
    (folder / "tokenizer.json").unlink()
    manifest = json.loads((folder / "specsteer.json").read_text())
    del manifest["files"]["tokenizer.json"]
    (folder / "specsteer.json").write_text(json.dumps(manifest))
    with pytest.raises(TokenizerMissing, match="tokenizer.json is missing"):
        load_model(folder)


def test_not_compiled_folder(tmp_path):
    with pytest.raises(ModelNotCompiled, match="specsteer.json"):
        load_model(tmp_path)
