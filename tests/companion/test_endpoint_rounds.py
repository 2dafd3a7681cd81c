"""`CompanionEndpoint` rounds with P_S0 on the device: the Generalist scores a Draft's ids when
they arrive, before the DraftS0 with P_S0's values does, and answers once both are in; the
answer is the one-shot `VerifierSession.verify`'s; a connection that ends in between frees it."""

from __future__ import annotations

import numpy as np
import pytest

from specsteer import protocol
from specsteer.protocol import DeviceConnection, SessionSettings
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.verifier import Verifier

PROMPT = [5, 9, 14, 3, 27, 8]


@pytest.fixture()
def verifier(tiny_model, tiny_generalist) -> Verifier:
    return Verifier(tiny_generalist, tiny_model)


def _pump(device: DeviceConnection, endpoint: CompanionEndpoint) -> list[bytes]:
    """Hand the device's queued frames to the endpoint one by one; its replies to the device."""
    replies = []
    for frame in device.data_to_send():
        for reply in endpoint.handle(frame):
            replies.append(reply)
            device.receive_frame(reply)
    return replies


def _opened(verifier: Verifier) -> tuple[DeviceConnection, CompanionEndpoint]:
    device, endpoint = DeviceConnection(), CompanionEndpoint(verifier)
    device.hello("", "", client_name="test")
    _pump(device, endpoint)
    device.open_session(PROMPT, SessionSettings(s0_on_device=True, gamma=0.5))
    _pump(device, endpoint)
    assert device.state is protocol.State.SESSION
    return device, endpoint


def test_the_generalist_scores_the_ids_before_p_s0s_values_arrive(verifier):
    device, endpoint = _opened(verifier)
    assert endpoint.session is not None
    passes: list[int] = []
    score = endpoint.session.g.score

    def counted(ids, first, top_k):  # type: ignore[no-untyped-def]
        passes.append(len(ids))
        return score(ids, first, top_k)

    endpoint.session.g.score = counted  # type: ignore[method-assign]
    reference = verifier.open(protocol.OpenSession(PROMPT, device.session.settings))
    committed: list[int] = []
    for draft in ([11, 12, 13, 14], [20, 21], [30]):
        device.send_draft(draft, committed_ids=committed)
        assert _pump(device, endpoint) == []  # no verdict before P_S0's values
        assert passes[-1] == len(committed) + len(draft)  # the Generalist already ran
        values = np.linspace(-3.0, -0.5, len(draft))
        device.send_draft_s0(values)
        [reply] = _pump(device, endpoint)
        verdict = protocol.decode(reply, device.limits)
        assert isinstance(verdict, protocol.Verdict)
        expected = reference.verify(committed, draft, protocol.DraftS0(0, values).logp_s0)
        assert verdict.accepted == expected.accepted
        assert list(verdict.ids) == sorted(int(i) for i in expected.candidates.ids)
        committed = [int(verdict.ids[0])]
    assert len(passes) == 3 and endpoint.rounds == 3
    reference.close()


def test_a_connection_that_ends_between_the_draft_and_its_values_frees_the_session(verifier):
    device, endpoint = _opened(verifier)
    session = endpoint.session
    assert session is not None
    closed: list[bool] = []
    close = session.close
    session.close = lambda: (closed.append(True), close())[1]  # type: ignore[method-assign]
    device.send_draft([11, 12])
    assert _pump(device, endpoint) == []
    assert endpoint.scored is not None
    endpoint.release()  # the socket dropped: its values never come
    assert endpoint.session is None and endpoint.scored is None and closed == [True]
