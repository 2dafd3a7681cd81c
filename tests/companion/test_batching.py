"""The companion's batching layer: many threads' appends share passes, results as if alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from specsteer.errors import SessionError
from specsteer_companion.batching import BatchingModel, BatchLimits, _Request
from specsteer_companion.server import CompanionServer, ServerConfig
from specsteer_companion.verifier import Verifier

THREADS = 8


@pytest.fixture()
def batching(tiny_batched) -> Iterator[BatchingModel]:
    model = BatchingModel(tiny_batched)
    yield model
    model.close()


def _script(number: int) -> list[tuple[str, list[int] | int]]:
    """A session's life: prompt, then appends of 1..6 tokens, each mostly rewound after."""
    rng = np.random.default_rng(number)
    prompt = rng.integers(0, 512, 5 + 3 * number).tolist()
    steps: list[tuple[str, list[int] | int]] = [("append", prompt)]
    length = len(prompt)
    for _ in range(6):
        new = rng.integers(0, 512, int(rng.integers(1, 7))).tolist()
        steps.append(("append", new))
        length += len(new)
        length -= int(rng.integers(0, len(new)))
        steps.append(("rewind", length))
    return steps


def _play(model, steps: list[tuple[str, list[int] | int]]) -> list[np.ndarray]:
    session = model.new_session()
    out = []
    for op, arg in steps:
        if op == "append":
            out.append(session.append(arg))
        else:
            session.rewind(arg)  # type: ignore[arg-type]
    session.close()
    return out


def test_concurrent_threads_equal_sequential(batching, tiny_model, monkeypatch):
    """8 threads through one BatchingModel == each script alone on ONNX Runtime GenAI."""
    scripts = [_script(n) for n in range(THREADS)]
    expected = [_play(tiny_model, s) for s in scripts]
    real = batching.model.append_batch
    first = threading.Event()

    def gathering(requests):  # hold the first pass until everybody else is queued
        if not first.is_set():
            first.set()
            deadline = time.monotonic() + 10
            while len(requests) + len(batching._pending) < THREADS and time.monotonic() < deadline:
                time.sleep(0.001)
        return real(requests)

    monkeypatch.setattr(batching.model, "append_batch", gathering)
    got: list[list[np.ndarray] | None] = [None] * THREADS
    start = threading.Barrier(THREADS)

    def run(n: int) -> None:
        start.wait()
        got[n] = _play(batching, scripts[n])

    threads = [threading.Thread(target=run, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for n in range(THREADS):
        rows = got[n]
        assert rows is not None and len(rows) == len(expected[n])
        for a, b in zip(rows, expected[n], strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
            assert (a.argmax(-1) == b.argmax(-1)).all()
    assert batching.stats.rows == sum(len(e) for e in expected)
    assert batching.stats.largest >= 2  # passes really were shared
    assert batching.stats.passes < batching.stats.rows


def _requests(lengths: list[int], model: BatchingModel) -> list[_Request]:
    return [_Request(model.model.new_session(), [1] * n) for n in lengths]


def test_plan_respects_the_limits(tiny_batched):
    model = BatchingModel(tiny_batched, BatchLimits(max_batch=3, max_tokens=20))
    try:
        plan = model.plan(_requests([5, 1, 4, 1, 30, 5, 5, 1, 1, 6], model))
    finally:
        model.close()
    sizes = [[len(r.ids) for r in batch] for batch in plan]
    # singles apart from longer rows, shortest first, <= 3 rows, <= 20 padded tokens,
    # and a row over the token cap on its own
    assert sizes == [[1, 1, 1], [1], [4, 5, 5], [5, 6], [30]]


def test_an_error_reaches_only_its_caller(batching):
    good = batching.new_session()
    bad = batching.new_session()
    results: dict[str, object] = {}
    gate = threading.Barrier(2)

    def call(name: str, session, ids: list[int]) -> None:
        gate.wait()
        try:
            results[name] = session.append(ids)
        except SessionError as exc:
            results[name] = exc

    threads = [threading.Thread(target=call, args=("good", good, [1, 2, 3])),
               threading.Thread(target=call, args=("bad", bad, [1, 99999]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert isinstance(results["bad"], SessionError)
    assert isinstance(results["good"], np.ndarray) and results["good"].shape == (3, 512)
    assert good.length == 3 and bad.length == 0


def test_closed_session_and_closed_model(tiny_batched):
    model = BatchingModel(tiny_batched)
    session = model.new_session()
    session.append([1, 2])
    session.close()
    with pytest.raises(SessionError, match="closed"):
        session.append([3])
    model.close()
    with pytest.raises(SessionError, match="closed"):
        model.new_session().append([1])


def test_server_pool_lets_every_session_wait(tiny_batched, tiny_batched_generalist, tiny_model,
                                             tiny_generalist):
    g, s = BatchingModel(tiny_batched_generalist), BatchingModel(tiny_batched)
    try:
        config = ServerConfig(workers=2, max_sessions=24)
        assert CompanionServer(Verifier(g, s), config).pool_size == 24
        assert CompanionServer(Verifier(tiny_generalist, tiny_model), config).pool_size == 2
    finally:
        g.close()
        s.close()
