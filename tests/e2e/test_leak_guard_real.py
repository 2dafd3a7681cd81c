"""The leak guard on the real pair (Qwen2.5-Coder 0.5B device -> 1.5B companion), through
`Client`, judged only from the frames that went up.

The history holds a message that the Specialist copies word for word when asked for a message
with the same subject, with an e-mail address and a phone number in it. `allow` sends the copy
(so the checks can see a leak); `redact` and `hold` send no id completing a window of 8 ids of
the private prompt that the public prompt lacks, neither the address's local part nor its
domain name in any case, and not the phone number's local digits (looked for in all digits
sent, run together, so that a number respaced or split over messages is seen too). The first
run of this test found `redact` sending " @quillfeather" and "+442079 4 0958": the Specialist,
turned away from the copy, respelled it. With windows longer than the whole
message (`leak_guard_n=64`) only the pattern detector is left to stop the address and the
number: they still never go up.
Never skipped in CI (`helpers.real_models` fails there when a model is missing).
"""

from __future__ import annotations

import re

import pytest
from helpers.privacy_audit import copied_ids_sent, private_windows, text_sent
from helpers.real_models import real_model

from specsteer.client import Client
from specsteer.history import HistoryStore
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

pytestmark = pytest.mark.real_model
SUBJECT = "Quarterly budget review"
LOCAL_PART, DOMAIN_NAME = "marta.kowalczyk", "quillfeather"
EMAIL = f"{LOCAL_PART}@{DOMAIN_NAME}.org"
PHONE = "+44 20 7946 0958"
LOCAL_NUMBER = "79460958"  # its digits after the area code, looked for in the digits sent
RECORDS = [
    (SUBJECT, "Dear team, the quarterly budget review moves to Thursday at 10:00 in room 4B. "
              f"If you cannot attend, write to {EMAIL} or call me on {PHONE}. "
              "Best regards, Marta"),
    ("Offsite agenda", "Hi all, the offsite agenda is attached. Questions to "
                       f"{EMAIL} or {PHONE}. Best regards, Marta"),
]
N = 8


@pytest.fixture(scope="module")
def pair():
    """The compiled pair (a missing model fails in CI, helpers.real_models)."""
    return real_model("qwen2.5-0.5b"), real_model("qwen2.5-1.5b")


def _generate(pair, policy: str | None, n: int = N):
    """policy None: the default settings (no leak_guard given)."""
    specialist, generalist = pair
    history = HistoryStore(memory=True)
    for title, body in RECORDS:
        history.add(kind="email", title=title, body=body)
    verifier = Verifier(generalist, specialist)
    frames: list[tuple[str, bytes]] = []
    client = Client(specialist, history=history, max_prompt_tokens=384,
                    companion=lambda: LocalChannel.for_verifier(verifier),
                    tap=lambda d, f: frames.append((d, f)))
    guard = {} if policy is None else {"leak_guard": policy}
    result = client.generate(SUBJECT, max_new_tokens=72, gamma=0.1, offline="fail",
                             pipeline=False, warm_start=False, leak_guard_n=n, **guard)
    _, prompt = client.render(SUBJECT)
    private = private_windows(list(prompt.private_ids), list(prompt.public_ids), N)
    return result, copied_ids_sent(frames, private), text_sent(specialist.tokenizer, frames)


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


@pytest.fixture(scope="module")
def allowed(pair):
    return _generate(pair, "allow")


def test_allow_sends_the_copied_history_so_the_checks_can_see_it(allowed):
    result, copied, sent = allowed
    assert result.stats.leak_flagged > 0 and result.stats.leak_redacted == 0
    assert copied > 0
    # (the companion turned the domain into example.com, but the drafts had sent part of it)
    assert f"{LOCAL_PART}@quill" in sent and "4420" + LOCAL_NUMBER in _digits(sent)


@pytest.mark.parametrize("policy", ["redact", "hold"])
@pytest.mark.parametrize("n", [N, 64], ids=["ngrams-and-patterns", "patterns-alone"])
def test_redact_and_hold_send_no_private_window_address_or_number(pair, allowed, policy, n):
    result, copied, sent = _generate(pair, policy, n)
    assert result.stats.leak_flagged > 0
    if n == N:  # with n=64 a window of 8 may go up: only the patterns are on trial
        assert copied == 0
    # in any case or spacing: the text sent, lower-cased, and its digits run together
    assert LOCAL_PART not in sent.lower() and DOMAIN_NAME not in sent.lower()
    assert LOCAL_NUMBER not in _digits(sent)
    if policy == "hold":
        assert result.stats.leak_held > 0 and result.provenance[-1] == "local"
    else:
        assert result.stats.leak_redacted > 0 and "local" not in result.provenance


def test_the_default_settings_keep_the_copy_on_the_device(pair, allowed):
    """Private by default: the copy `allow` sends never goes up with no leak_guard given, and
    the companion goes on steering past it (the default is redact: nothing written locally)."""
    result, copied, sent = _generate(pair, None)
    assert result.stats.leak_flagged > 0 and result.stats.leak_redacted > 0
    assert result.stats.leak_held == 0 and "local" not in result.provenance
    assert copied == 0
    assert LOCAL_PART not in sent.lower() and LOCAL_NUMBER not in _digits(sent)
