"""Batched raw-ONNX-Runtime sessions: one pass for many sessions == each session alone (== GenAI).

Tiny models here; a short Qwen2.5 0.5B int8 check at the end (real_model, skipped when
SPECSTEER_SKIP_REAL is set or the model is not compiled).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers.ci import skip_or_fail
from helpers.session_checks import check_session_errors

from specsteer.errors import SessionError
from specsteer.runtime import load_model
from specsteer.runtime.ort_batched import BatchedModel, load_batched_model

# Sessions with different past lengths (0 = fresh) and different new-token counts (1 included).
PASTS = [0, 3, 17, 40, 1, 9]
NEWS = [5, 1, 9, 2, 7, 1]
ATOL = 1e-5  # observed: 0.0 (fp32 tiny models); the same kernels run in both cases


def _ids(model: BatchedModel, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, model.vocab_size, n).tolist()


def _alone(model, prefix: list[int], new: list[int]) -> np.ndarray:
    """Logits of `new` after `prefix`, one session, nothing else in its passes."""
    session = model.new_session()
    if prefix:
        session.append(prefix)
    return session.append(new)


def _assert_same(got: np.ndarray, want: np.ndarray, atol: float = ATOL) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.fixture()
def poisoned(tiny_batched, monkeypatch):
    """The padded tail of the batched past filled with NaN: it must never be read."""
    real = BatchedModel._batch_cache

    def nan_cache(self: BatchedModel, batch: int, past: int) -> np.ndarray:
        return np.full(real(self, batch, past).shape, np.nan, self._kv_dtype)

    monkeypatch.setattr(BatchedModel, "_batch_cache", nan_cache)
    return tiny_batched


def test_batched_equals_sequential_and_genai(poisoned, tiny_model):
    model = poisoned
    prefixes = [_ids(model, p, seed=i) for i, p in enumerate(PASTS)]
    news = [_ids(model, n, seed=100 + i) for i, n in enumerate(NEWS)]
    sessions = [model.new_session() for _ in PASTS]
    for session, prefix in zip(sessions, prefixes, strict=True):
        if prefix:
            session.append(prefix)
    batched = model.append_batch(list(zip(sessions, news, strict=True)))
    for i, (prefix, new) in enumerate(zip(prefixes, news, strict=True)):
        _assert_same(batched[i], _alone(model, prefix, new))
        _assert_same(batched[i], _alone(tiny_model, prefix, new))  # ONNX Runtime GenAI
        assert sessions[i].length == len(prefix) + len(new)


def test_rewind_then_batched_append(poisoned, tiny_model):
    model = poisoned
    base = [_ids(model, 12 + 5 * i, seed=i) for i in range(4)]
    sessions = [model.new_session() for _ in base]
    model.append_batch(list(zip(sessions, base, strict=True)))
    keep = [12, 3, 22, 0]  # rewind to different points, one to empty
    for session, k in zip(sessions, keep, strict=True):
        session.rewind(k)
        assert session.length == k
    news = [[7, 8], [9], [1, 2, 3, 4, 5, 6], [4, 4, 4]]
    batched = model.append_batch(list(zip(sessions, news, strict=True)))
    for i in range(4):
        prefix = base[i][: keep[i]]
        _assert_same(batched[i], _alone(model, prefix, news[i]))
        # GenAI splits the same tokens into other chunks: fp32 rounding only
        _assert_same(batched[i], _alone(tiny_model, prefix, news[i]), atol=1e-4)


def test_single_session_chunks_and_exact_rewind(tiny_batched, tiny_model):
    ids = _ids(tiny_batched, 30, seed=7)
    chunked = tiny_batched.new_session()
    rows = np.concatenate([chunked.append(ids[:7]), chunked.append(ids[7:12]),
                           chunked.append(ids[12:])])
    one_by_one = tiny_batched.new_session()
    singles = np.stack([one_by_one.append([t])[0] for t in ids])
    np.testing.assert_allclose(rows, singles, atol=1e-4)
    np.testing.assert_allclose(rows, tiny_model.new_session().append(ids), atol=1e-4)
    session = tiny_batched.new_session()
    session.append(ids[:10])
    session.append([5, 6, 7, 8])  # a rejected draft
    session.rewind(10)
    _assert_same(session.append(ids[10:]), _alone(tiny_batched, ids[:10], ids[10:]))


def test_cache_grows_past_its_first_capacity(tiny_batched):
    ids = _ids(tiny_batched, 300, seed=3)
    grown, other = tiny_batched.new_session(max_length=300), tiny_batched.new_session()
    for start in range(0, 280, 40):
        tiny_batched.append_batch([(grown, ids[start : start + 40]), (other, [1, 2])])
        assert grown.length <= grown.capacity <= grown.max_length
    _assert_same(grown.append(ids[280:]), _alone(tiny_batched, ids[:280], ids[280:]))


def test_row_near_the_context_window_runs_alone(tiny_batched):
    """Padding a long row's neighbour to 10 tokens would pass the window: it runs alone."""
    window = tiny_batched.context_length
    long_prefix = _ids(tiny_batched, window - 4, seed=1)
    near, fresh = tiny_batched.new_session(), tiny_batched.new_session()
    near.append(long_prefix)
    got = tiny_batched.append_batch([(near, [3, 4]), (fresh, list(range(10, 20)))])
    assert near.length == window - 2
    _assert_same(got[1], _alone(tiny_batched, [], list(range(10, 20))))
    tail = tiny_batched.new_session()
    tail.append(long_prefix)
    _assert_same(got[0], tail.append([3, 4]))


def test_closed_session_fails_alone(tiny_batched):
    a, b, c = (tiny_batched.new_session() for _ in range(3))
    tiny_batched.append_batch([(a, [1, 2, 3]), (b, [4, 5]), (c, [6])])
    b.close()
    with pytest.raises(SessionError, match="closed"):
        b.append([1])
    with pytest.raises(SessionError, match="closed"):
        tiny_batched.append_batch([(a, [7]), (b, [8])])
    assert a.length == 3  # the refused batch ran nothing
    got = tiny_batched.append_batch([(a, [7, 8]), (c, [9])])
    _assert_same(got[0], _alone(tiny_batched, [1, 2, 3], [7, 8]))
    _assert_same(got[1], _alone(tiny_batched, [6], [9]))


def test_session_errors(tiny_batched):
    session = check_session_errors(tiny_batched)
    with pytest.raises(SessionError, match="only once"):
        tiny_batched.append_batch([(session, [1]), (session, [2])])
    assert session.length == 3
    assert tiny_batched.append_batch([]) == []


def test_same_identity_as_genai(tiny_batched, tiny_model):
    assert (tiny_batched.sha256, tiny_batched.vocab_size, tiny_batched.context_length) == (
        tiny_model.sha256, tiny_model.vocab_size, tiny_model.context_length)
    assert tiny_batched.tokenizer.vocab_hash == tiny_model.tokenizer.vocab_hash


@pytest.mark.real_model
def test_qwen_batched_equals_sequential():
    """Qwen2.5 0.5B int8: a batch of chat prompts, then drafts of 1..5 tokens, == one by one."""
    from specsteer.models.registry import compiled_dir, get_spec

    if os.environ.get("SPECSTEER_SKIP_REAL"):
        pytest.skip("SPECSTEER_SKIP_REAL is set")
    if not compiled_dir(get_spec("qwen2.5-0.5b"), "int8").is_dir():
        skip_or_fail("qwen2.5-0.5b int8 is not compiled (specsteer models compile qwen2.5-0.5b)")
    model = load_batched_model("qwen2.5-0.5b", precision="int8")
    tok = model.tokenizer
    prompts = [tok.encode(t) for t in ("Write one sentence about the sea.",
                                       "Explain in two sentences why the sea has tides.", "Hi")]
    drafts = [[11, 279, 9396], [1207], [13, 576, 3491, 374, 220]]
    sessions = [model.new_session() for _ in prompts]
    first = model.append_batch(list(zip(sessions, prompts, strict=True)))
    second = model.append_batch(list(zip(sessions, drafts, strict=True)))
    for i in range(3):
        alone = model.new_session()
        _assert_same(first[i], alone.append(prompts[i]), atol=1e-4)
        _assert_same(second[i], alone.append(drafts[i]), atol=1e-4)
    del model
    genai = load_model("qwen2.5-0.5b", precision="int8")
    for i in range(3):
        session = genai.new_session()
        _assert_same(first[i], session.append(prompts[i]), atol=1e-4)
        _assert_same(second[i], session.append(drafts[i]), atol=1e-4)
