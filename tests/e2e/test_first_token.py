"""The first token from the opening: SessionOpened carries the first position's candidates, and
a greedy device holding P_S0 settles its first token from them as the opening ends, one
verification earlier than the round's verdict. The text must be the method's, byte for byte:
the round still runs, and its verdict must agree."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.budget_mail import two_mails

from specsteer import protocol, steer
from specsteer.client import Client
from specsteer.device import rounds
from specsteer.errors import ProtocolError
from specsteer.history import HistoryStore
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier, VerifierSession

pytestmark = pytest.mark.slow  # tiny-model generations

SUBJECTS = ("Budget for the next quarter", "Meeting notes", "The garden's spring plan",
            "Re: parking on Fridays")


@pytest.fixture()
def store() -> HistoryStore:
    return two_mails()


@pytest.fixture()
def verifier(tiny_model, tiny_generalist) -> Verifier:
    return Verifier(tiny_generalist, tiny_model)


@pytest.fixture()
def outcomes(monkeypatch) -> list[bool | None]:
    """What each first ratio test on the opening's candidates answered, in order."""
    answers: list[bool | None] = []
    test = steer.first_ratio_test

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        answers.append(test(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(steer, "first_ratio_test", recorded)
    return answers


def _client(tiny_model, verifier, store, tap=None) -> Client:
    return Client(tiny_model, history=store, tap=tap,
                  companion=lambda: LocalChannel.for_verifier(verifier))


def _logged_rounds(monkeypatch, log: list[str]) -> None:
    """Log each token as the rounds yield it, in the thread that reads the frames."""
    original = rounds.SteeredRounds.round

    def round_(self):  # type: ignore[no-untyped-def]
        made = original(self)
        while True:
            try:
                item = next(made)
            except StopIteration as stop:
                return stop.value
            log.append("token")
            yield item

    monkeypatch.setattr(rounds.SteeredRounds, "round", round_)


def test_the_first_token_comes_before_the_first_verdict(tiny_model, verifier, store,
                                                        monkeypatch, outcomes):
    """Where the candidates settle the test, the first token is yielded before the first
    Verdict is read; where they cannot (None), after it."""
    log: list[str] = []
    _logged_rounds(monkeypatch, log)
    tap = lambda d, f: log.append(type(protocol.decode(f, protocol.Limits())).__name__)  # noqa: E731
    client = _client(tiny_model, verifier, store, tap)
    for subject in SUBJECTS:
        for gamma in (0.5, 0.05):
            log.clear()
            result = client.generate(subject, max_new_tokens=16, warm_start=False, gamma=gamma)
            assert not result.stats.degraded
            assert log.index("SessionOpened") < log.index("token")
            early = log.index("token") < log.index("Verdict")
            assert early == (outcomes[-1] is not None), (subject, gamma, outcomes[-1], log[:8])
            assert log.count("token") == len(result.tokens)  # none yielded twice
    assert any(o is not None for o in outcomes), outcomes


def test_the_text_is_the_one_without_the_openings_candidates(tiny_model, verifier, store,
                                                             monkeypatch, outcomes):
    """Accepted or rejected from the candidates, every first token and every text is what the
    verdict alone gives; both outcomes occur over these prompts and thresholds."""
    client = _client(tiny_model, verifier, store)
    runs = [(subject, gamma) for subject in SUBJECTS for gamma in (0.5, 0.9, 0.05)]
    early = [client.generate(s, max_new_tokens=12, warm_start=False, gamma=g) for s, g in runs]
    assert True in outcomes and False in outcomes, outcomes
    monkeypatch.setattr(VerifierSession, "opening_candidates", lambda self: None)
    before = len(outcomes)
    late = [client.generate(s, max_new_tokens=12, warm_start=False, gamma=g) for s, g in runs]
    assert len(outcomes) == before  # no candidates: the device waited for every verdict
    for run, a, b in zip(runs, early, late, strict=True):
        assert (a.tokens, a.provenance) == (b.tokens, b.provenance), run
        assert not a.stats.degraded and not b.stats.degraded


def test_a_verdict_that_contradicts_the_opening_stops_the_collaboration(tiny_model, verifier,
                                                                        store, monkeypatch):
    """A companion whose opening says "reject" (every candidate far below) while its verdict
    accepts: the device does not go on from a text the method did not write; with
    offline="fail" the generation raises, by default it goes on locally after that token."""
    real = VerifierSession.opening_candidates

    def understated(self):  # type: ignore[no-untyped-def]
        first = real(self)
        return steer.SparseSteer(first.ids, np.full(len(first.ids), -60.0, np.float16))

    monkeypatch.setattr(VerifierSession, "opening_candidates", understated)
    client = _client(tiny_model, verifier, store)
    with pytest.raises(ProtocolError, match="SessionOpened"):
        client.generate(SUBJECTS[0], max_new_tokens=8, warm_start=False, gamma=1e-6,
                        offline="fail")
    result = client.generate(SUBJECTS[0], max_new_tokens=8, warm_start=False, gamma=1e-6)
    assert result.stats.degraded and result.provenance[0] == "recovered"


def test_only_sessions_that_can_use_them_get_candidates(tiny_model, verifier, store):
    """P_S0 on the companion, sampling, speculative or a resume: SessionOpened carries none
    (the device could not settle the test), and the companion refuses to send them there."""
    frames: list[bytes] = []
    client = _client(tiny_model, verifier, store,
                     tap=lambda d, f: frames.append(f) if d == "down" else None)

    def opened() -> protocol.SessionOpened:
        found = [m for m in (protocol.decode(f, protocol.Limits()) for f in frames)
                 if isinstance(m, protocol.SessionOpened)]
        frames.clear()
        return found[-1]

    client.generate(SUBJECTS[0], max_new_tokens=4, warm_start=False)
    assert 1 <= len(opened().ids) <= 64
    for options in ({"s0_on_device": False}, {"temperature": 0.7, "seed": 1},
                    {"method": "speculative"}):
        client.generate(SUBJECTS[0], max_new_tokens=4, warm_start=False, **options)
        assert opened().ids == (), options
    conn = protocol.CompanionConnection()
    settings = protocol.SessionSettings(protocol.Mode.SPECSTEER, s0_on_device=False)
    conn.receive_frame(protocol.encode(protocol.Hello("", "")))
    conn.accept_hello(companion_version="t", generalist_sha256="", specialist_sha256="",
                      vocab_size=100)
    conn.receive_frame(protocol.encode(protocol.OpenSession((1, 2), settings)))
    with pytest.raises(ProtocolError, match="only for a new greedy SPECSTEER"):
        conn.session_opened(1, ids=(3,), values=(-1.0,))
