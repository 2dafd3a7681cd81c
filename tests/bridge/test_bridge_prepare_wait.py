"""The bridge's `prepare` with `wait_s`: answered once the prefill is done, so an app's "ready"
means a following `generate` runs no prompt token again (on a Specialist slowed to 0.2 s a pass,
where an answer sent at once would come long before)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from helpers.bridge_process import assert_valid
from helpers.counting import SlowModel

from specsteer.bridge import errors
from specsteer.bridge.handlers import Bridge
from specsteer.client import Client
from specsteer.history import HistoryStore

pytestmark = pytest.mark.slow  # bridge and companion processes: not in ./dev test --fast

REQUEST = {"query": "Budget for the next quarter", "task": "email"}


def _call(bridge: Bridge, method: str, params: dict[str, Any]) -> tuple[Any, Any, float]:
    """(result, error, seconds until the answer) of one call."""
    answered = threading.Event()
    answers: list[tuple[Any, Any]] = []

    def respond(result: Any, error: Any) -> None:
        answers.append((result, error))
        answered.set()

    started = time.perf_counter()
    bridge.call(1, method, params, respond)
    assert answered.wait(120)
    return *answers[0], time.perf_counter() - started


def _bridge(tiny_model) -> tuple[Bridge, SlowModel]:
    history = HistoryStore(memory=True)
    for n in range(4):
        history.add(kind="email", title=f"Budget for quarter {n}",
                    body=f"Dear team, the budget for quarter {n} stays as it is. " * 6)
    slow = SlowModel(tiny_model, delay_s=0.2)
    return Bridge(Client(slow, history=history), lambda method, params: None,
                  max_line_bytes=1 << 20), slow


def test_prepare_with_wait_answers_ready_once_the_prefill_is_done(tiny_model) -> None:
    bridge, slow = _bridge(tiny_model)
    params = {**REQUEST, "max_new_tokens": 4, "wait_s": 60}
    assert_valid("prepare", "params", params)
    result, error, waited = _call(bridge, "prepare", params)
    assert error is None and result == {"task": "email", "prefilling": True, "ready": True}
    assert_valid("prepare", "result", result)
    prompt = len(bridge.client.render(REQUEST["query"], task="email")[1].private_ids)
    assert prompt > 128 and waited >= 0.2 * (prompt // 128)  # every chunk's pass waited for
    slow.appended = 0
    result, error, _ = _call(bridge, "generate", {**REQUEST, "max_new_tokens": 4})
    assert error is None
    stats = result["stats"]
    assert stats["prefill_reused"] == prompt and stats["prefill_tokens"] == 0
    bridge.close()


def test_prepare_without_wait_answers_at_once_and_says_it_is_not_ready(tiny_model) -> None:
    bridge, _ = _bridge(tiny_model)
    result, error, waited = _call(bridge, "prepare", {**REQUEST, "max_new_tokens": 4})
    assert error is None and result["ready"] is False and waited < 0.2
    # a short wait: answered when it runs out, still not ready
    result, error, waited = _call(bridge, "prepare", {**REQUEST, "task": "reply",
                                                      "max_new_tokens": 4, "wait_s": 0.1})
    assert error is None and result["ready"] is False and 0.1 <= waited < 1.0
    for bad in (-1, 61, "5"):
        _, error, _ = _call(bridge, "prepare", {**REQUEST, "wait_s": bad})
        assert error is not None and error.code == errors.INVALID_PARAMS, bad
    bridge.close()
