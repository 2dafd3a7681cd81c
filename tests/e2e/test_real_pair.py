"""SpecSteer on the real same-tokenizer pair: Qwen2.5-Coder 0.5B (device) → 1.5B (companion).

A privacy test: it never skips in CI (CI=true makes a missing model a failure), and its sender
comes from the shared newsgroups data when present, else from the repository's slice of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.privacy_audit import assert_canary_not_sent
from helpers.real_models import real_model

from specsteer.client import Client
from specsteer.history import HistoryStore, load_shared_user
from specsteer_companion.local import LocalChannel
from specsteer_companion.server import CompanionServer
from specsteer_companion.verifier import Verifier
from specsteer_lab.eval.data import EvalError, shared_file

pytestmark = pytest.mark.real_model
CANARY = "XKQ-CANARY-0917-bittern"
REPO_SLICE = Path(__file__).resolve().parents[1] / "lab" / "data" / "newsgroups_slice.json"


@pytest.fixture(scope="module")
def pair():
    return real_model("qwen2.5-0.5b"), real_model("qwen2.5-1.5b")


@pytest.fixture(scope="module")
def sender():
    try:
        data = shared_file("email")
    except EvalError:
        data = REPO_SLICE
    user = load_shared_user(data, 1)
    store = HistoryStore(memory=True)
    store.add_many(user.records)
    store.add(kind="email", title=user.query.get("subject", ""), body=f"Remember {CANARY}.")
    return user, store


def test_real_pair_networked_equals_in_process_and_keeps_the_canary(pair, sender):
    specialist, generalist = pair
    user, store = sender
    verifier = Verifier(generalist, specialist)
    frames: list[tuple[str, bytes]] = []
    local = Client(
        specialist,
        history=store,
        max_prompt_tokens=384,
        companion=lambda: LocalChannel.for_verifier(verifier),
        tap=lambda d, f: frames.append((d, f)),
    )
    # no pipelining and no warm start: how far a device drafts ahead depends on when the
    # verdict lands, and when a warm start switches on when the prefill ends, so rounds (and
    # bytes) are only reproducible across transports without them
    expected = local.generate(
        user.query, task=user.task, max_new_tokens=24, gamma=0.1, offline="fail", pipeline=False,
        warm_start=False,
    )
    assert CANARY in expected.prompt.with_context
    assert_canary_not_sent(specialist.tokenizer, frames, CANARY)
    assert expected.stats.bytes_up == sum(len(f) for d, f in frames if d == "up")
    assert expected.stats.drafted > 0 and 0 < expected.stats.acceptance_rate <= 1
    assert expected.text.strip()
    with CompanionServer(verifier).running() as url:
        remote = Client(specialist, history=store, companion=url, max_prompt_tokens=384)
        got = remote.generate(
            user.query, task=user.task, max_new_tokens=24, gamma=0.1, offline="fail",
            pipeline=False, warm_start=False,
        )
    assert got.tokens == expected.tokens
    assert (got.stats.bytes_up, got.stats.bytes_down) == (
        expected.stats.bytes_up,
        expected.stats.bytes_down,
    )


def test_real_identical_models_accept_every_draft(pair):
    specialist, _ = pair
    verifier = Verifier(specialist, specialist)
    client = Client(specialist, companion=lambda: LocalChannel.for_verifier(verifier))
    result = client.generate(
        "Write one sentence about the sea.",
        task="email",
        max_new_tokens=24,
        gamma=1.0,
        offline="fail",
        # the companion scores both from one float row, so the ratio is exactly 1; from the
        # device, logp_S0 crosses the wire as fp16 and would tie only to its rounding
        s0_on_device=False,
    )
    assert result.stats.drafted > 0
    assert result.stats.accepted == result.stats.drafted
