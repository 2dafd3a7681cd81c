"""The device's runtime (`load_device_model`): raw ONNX Runtime, one session a pass, a pass
that a cancel stops mid-way, and a prefill whose passes do not depend on timing."""

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
from specsteer.runtime import CancellableSession, load_device_model
from specsteer.runtime.onnx import default_threads
from specsteer.runtime.ort_batched import BatchedModel
from specsteer.runtime.track import STOPPABLE_CHUNK, PrefillPace, Track


@pytest.fixture(scope="module")
def device_model() -> BatchedModel:
    return load_device_model(tiny_model_dir("llama", seed=0))


def _ids(model, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, model.vocab_size, n)]


class Recording:
    """A real session that also notes the size of every pass (which the test reads)."""

    def __init__(self, session) -> None:
        self.session, self.passes = session, []

    @property
    def length(self) -> int:
        return self.session.length

    def append(self, ids):
        self.passes.append(len(ids))
        return self.session.append(ids)

    def append_cancellable(self, ids, cancel):
        self.passes.append(len(ids))
        return self.session.append_cancellable(ids, cancel)

    def rewind(self, length: int) -> None:
        self.session.rewind(length)

    def close(self) -> None:
        self.session.close()


def test_the_client_runs_a_named_specialist_on_the_device_runtime():
    client = Client(str(tiny_model_dir("llama", seed=0)), history=None)
    assert isinstance(client.specialist, BatchedModel)
    assert not client.specialist.batchable
    assert client.specialist.threads == default_threads()
    assert isinstance(client.specialist.new_session(), CancellableSession)


def test_its_logits_are_the_genai_runtime_s(device_model, tiny_model):
    ids = _ids(device_model, 300, seed=3)
    device, genai = device_model.new_session(), tiny_model.new_session()
    for part in (ids[:128], ids[128:256], ids[256:290]):
        np.testing.assert_allclose(device.append(part), genai.append(part), atol=1e-4)
    for token in ids[290:]:
        np.testing.assert_allclose(device.append([token]), genai.append([token]), atol=1e-4)
    device.rewind(295)
    genai.rewind(295)
    np.testing.assert_allclose(device.append([7, 8, 9]), genai.append([7, 8, 9]), atol=1e-4)
    check_session_errors(device_model)


def test_one_session_a_pass(device_model):
    a, b = device_model.new_session(), device_model.new_session()
    with pytest.raises(SessionError, match="one session a pass"):
        device_model.append_batch([(a, [5]), (b, [6])])
    assert (a.length, b.length) == (0, 0)


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
