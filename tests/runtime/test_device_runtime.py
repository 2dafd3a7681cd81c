"""The device's runtime (`load_device_model`): raw ONNX Runtime, one session a pass, a pass
that a cancel stops mid-way, a KV cache kept in place between passes, a prefill whose passes
do not depend on timing and that computes the output layer for its last position only."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from helpers.ci import skip_or_fail
from helpers.session_checks import check_session_errors

from specsteer.client import Client
from specsteer.device.warm import BackgroundPrefill
from specsteer.errors import GenerationCancelled, SessionError
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import CancellableSession, DeviceModel, load_device_model
from specsteer.runtime.onnx import default_threads
from specsteer.runtime.track import STOPPABLE_CHUNK, PrefillPace, Track


@pytest.fixture(scope="module")
def device_model() -> DeviceModel:
    return load_device_model(tiny_model_dir("llama", seed=0))


def _ids(model, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, model.vocab_size, n)]


class Recording:
    """A real session that also notes the size of every pass (which the test reads)."""

    def __init__(self, session) -> None:
        self.session, self.passes, self.rows = session, [], []

    @property
    def length(self) -> int:
        return self.session.length

    def append(self, ids, rows=None):
        self.passes.append(len(ids))
        self.rows.append(rows)
        return self.session.append(ids, rows)

    def append_cancellable(self, ids, cancel, rows=None):
        self.passes.append(len(ids))
        self.rows.append(rows)
        return self.session.append_cancellable(ids, cancel, rows)

    def rewind(self, length: int) -> None:
        self.session.rewind(length)

    def close(self) -> None:
        self.session.close()


def test_the_client_runs_a_named_specialist_on_the_device_runtime():
    client = Client(str(tiny_model_dir("llama", seed=0)), history=None)
    assert isinstance(client.specialist, DeviceModel)
    assert client.specialist.threads == default_threads()
    assert isinstance(client.specialist.new_session(), CancellableSession)


def test_its_logits_are_the_genai_runtime_s(device_model, tiny_model):
    """Through every growth of the cache (256 positions, then 512, then 1024), single steps,
    rewinds and passes of the last row only."""
    ids = _ids(device_model, 700, seed=3)
    device, genai = device_model.new_session(), tiny_model.new_session()
    for part in (ids[:128], ids[128:300], ids[300:600]):
        np.testing.assert_allclose(device.append(part), genai.append(part), atol=1e-4)
    assert device.capacity == 1024
    last = device.append(ids[600:650], rows=1)
    assert last.shape == (1, device_model.vocab_size)
    np.testing.assert_allclose(last[0], genai.append(ids[600:650])[-1], atol=1e-4)
    for token in ids[650:]:
        np.testing.assert_allclose(device.append([token]), genai.append([token]), atol=1e-4)
    device.rewind(640)
    genai.rewind(640)
    np.testing.assert_allclose(device.append([7, 8, 9], rows=2), genai.append([7, 8, 9])[1:],
                               atol=1e-4)
    check_session_errors(device_model)
    with pytest.raises(SessionError, match="rows must be in"):
        device.append([1, 2], rows=3)
    assert device.length == 643


def test_the_cache_is_written_in_place(device_model):
    """Past and present are one buffer per layer: a pass adds its positions to the arrays the
    session already holds (no copy in, no copy out) until the cache must grow."""
    session = device_model.new_session()
    buffers = session._cache[0]
    session.append(_ids(device_model, 100, seed=4))
    assert session._cache[0] is buffers
    filled = buffers[0][0, :, :100]
    assert np.abs(filled).sum(axis=-1).all()  # every position written, by the pass itself
    assert not buffers[0][0, :, 100:].any()
    session.append(_ids(device_model, 200, seed=5))  # 300 > 256: grown, the 100 kept
    assert session._cache[0] is not buffers
    np.testing.assert_array_equal(session._cache[0][0][0, :, :100], filled)


def test_a_prefill_pass_computes_the_last_row_alone(device_model):
    """The graph's output layer runs on the rows asked for (`logits_to_keep`), not on every
    position: the logits the pass produced hold one row, and equal the full pass's last."""
    assert device_model.keeps_rows
    ids = _ids(device_model, 64, seed=6)
    session = device_model.new_session()
    row = session.append(ids, rows=1)
    assert session._binding.get_outputs()[0].shape() == [1, 1, device_model.vocab_size]
    full = device_model.new_session().append(ids)
    np.testing.assert_array_equal(row[0], full[-1])
    track = Track(device_model, _ids(device_model, 300, seed=7), 400, lazy=True)
    track.session = recording = Recording(track.session)
    track.prefill(threading.Event())
    assert recording.rows == [1] * 5


def test_a_cancel_set_before_the_pass_runs_nothing(device_model):
    session = device_model.new_session()
    session.append([5, 6, 7])
    stop = threading.Event()
    stop.set()
    with pytest.raises(GenerationCancelled):
        session.append_cancellable([8, 9], (None, stop))
    assert session.length == 3
    # unset events change nothing: the pass runs and equals a plain append
    rows = session.append_cancellable([8, 9], (None, threading.Event()))
    fresh = device_model.new_session()
    fresh.append([5, 6, 7])
    np.testing.assert_array_equal(rows, fresh.append([8, 9]))


def test_the_device_prefill_runs_fixed_passes_whatever_the_pace(device_model):
    """With a cancel to watch, a pace that would size 8-token passes is not used: the passes
    are a fixed size, so where they fall (and the cache's float rounding) never depends on
    timing."""
    prompt = _ids(device_model, 300, seed=5)
    pace = PrefillPace(seconds=0.1, low=8, high=128)
    track = Track(device_model, prompt, 400, lazy=True, chunk=128, pace=pace)
    track.session = recording = Recording(track.session)
    track.prefill(threading.Event())
    assert recording.passes == [STOPPABLE_CHUNK] * 4 + [300 - 4 * STOPPABLE_CHUNK]
    assert recording.rows == [1] * 5
    # without a cancel to watch nothing can stop a pass mid-way: the pace sizes them
    paced = Track(device_model, prompt, 400, lazy=True, chunk=128, pace=PrefillPace(low=8))
    paced.session = recording = Recording(paced.session)
    paced.prefill()
    assert recording.passes[0] == 8


def test_a_warm_start_prefills_from_the_start_on_the_device_runtime(device_model, tiny_model):
    """Its passes release the GIL, so the private prefill need not wait for the first
    Generalist token; on GenAI it waits for `start`."""
    prompt = _ids(device_model, 200, seed=9)
    device = BackgroundPrefill(Track(device_model, prompt, 300, lazy=True), threading.Event())
    genai = BackgroundPrefill(Track(tiny_model, prompt, 300, lazy=True), threading.Event())
    try:
        assert device.go.is_set()
        assert not genai.go.is_set()
        deadline = time.monotonic() + 30
        while not device.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert device.done() and device.track.pending == 0
        assert genai.track.pending == 200
    finally:
        device.abandon()
        genai.abandon()


@pytest.mark.real_model
def test_a_cancel_stops_a_long_qwen_pass_mid_way():
    """Qwen2.5 0.5B int8: a 512-token pass (about 2 s on one core here) stopped 0.1 s in
    ends long before it would have, and leaves the session exactly as it was."""
    from specsteer.models.registry import compiled_dir, get_spec

    if os.environ.get("SPECSTEER_SKIP_REAL"):
        pytest.skip("SPECSTEER_SKIP_REAL is set")
    if not compiled_dir(get_spec("qwen2.5-0.5b"), "int8").is_dir():
        skip_or_fail("qwen2.5-0.5b int8 is not compiled (specsteer models compile qwen2.5-0.5b)")
    model = load_device_model("qwen2.5-0.5b", precision="int8", threads=1)
    ids = _ids(model, 600, seed=1)
    whole = model.new_session()
    whole.append(ids[:16])
    started = time.perf_counter()
    expected = whole.append(ids[16:528])
    full_s = time.perf_counter() - started

    session = model.new_session()
    session.append(ids[:16])
    stop = threading.Event()
    timer = threading.Timer(0.1, stop.set)
    timer.start()
    started = time.perf_counter()
    with pytest.raises(GenerationCancelled):
        session.append_cancellable(ids[16:528], (stop,))
    stopped_s = time.perf_counter() - started
    timer.join()
    assert stopped_s < full_s / 2, (stopped_s, full_s)
    assert session.length == 16
    np.testing.assert_array_equal(session.append(ids[16:528]), expected)


class _FiresOnCall:
    """A stop condition that fires from its `n`-th call on (counting every caller)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls >= self.n


def test_a_bets_pass_stopped_by_the_verdict_leaves_a_draft_a_later_call_finishes(device_model):
    """`draft(stop=)` hands the condition to each pass after the first: a stop that fires as a
    pass starts (here: its second call, the pass's own look before running) ends the draft
    before that pass's token, the track as it was before it; `draft(into=)` then finishes it
    to exactly the uninterrupted draft. Drafting that only looked between passes would run
    the pass and keep its token."""
    from specsteer.device.drafting import draft

    prompt = _ids(device_model, 12, seed=3)
    eos = frozenset()
    whole = Track(device_model, prompt, 64)
    expected = draft(whole, 4, 0.0, None, eos)

    track = Track(device_model, prompt, 64)
    stop = _FiresOnCall(2)  # 1: the look before the second token's pass; 2: that pass's own
    cut = draft(track, 4, 0.0, None, eos, stop=stop)
    assert cut.tokens == expected.tokens[:1] and len(cut.rows) == 2
    assert track.length == len(prompt) + 1  # the stopped pass left nothing behind
    np.testing.assert_array_equal(track.row, cut.rows[-1])
    finished = draft(track, 4, 0.0, None, eos, into=cut)
    assert finished.tokens == expected.tokens
    for got, want in zip(finished.rows, expected.rows, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_users_cancel_during_a_bets_pass_is_a_cancel_not_a_verdict(device_model):
    """The user stopped the generation while a bet's pass ran and the verdict landed too:
    the generation is cancelled, not a draft cut short for the next round."""
    from specsteer.device.drafting import draft

    track = Track(device_model, _ids(device_model, 12, seed=4), 64)
    cancel = threading.Event()
    fires = _FiresOnCall(2)

    def stop() -> bool:
        if fires():  # the second token's pass: the user pressed stop, the verdict landed
            cancel.set()
            return True
        return False

    with pytest.raises(GenerationCancelled):
        draft(track, 4, 0.0, None, frozenset(), stop=stop, cancel=cancel)
