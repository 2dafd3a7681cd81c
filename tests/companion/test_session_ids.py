"""Session ids say nothing about other devices: they are random (52 bits under a top bit, so
exact in a JSON number and always 8 bytes on the wire), not a process-wide counter that a token
holder could read other devices' sessions off (issue 28 got ids 4, 6, 8 with one victim session
between each)."""

from __future__ import annotations

from specsteer import protocol
from specsteer.link import CompanionLink
from specsteer_companion.endpoint import SESSION_ID_BITS
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

SESSION = protocol.SessionSettings(top_k=8)


def test_session_ids_are_random_not_counted(tiny_model, tiny_generalist):
    verifier = Verifier(tiny_generalist, tiny_model)
    prober, victim = (CompanionLink(LocalChannel.for_verifier(verifier)) for _ in range(2))
    for link in (prober, victim):
        link.hello()
    seen = []
    for _ in range(40):
        prober.open([1, 2, 3], SESSION)
        seen.append(prober.conn.session_id)
        victim.open([1, 2, 3], SESSION)  # another device's session between each
    assert len(set(seen)) == len(seen)
    assert all(2**(SESSION_ID_BITS - 1) <= n < 2**SESSION_ID_BITS for n in seen)
    # one length for every id (version, type, 8-byte varint, length, no candidates)
    assert {len(protocol.encode(protocol.SessionOpened(n, 3))) for n in seen} == {12}
    gaps = [abs(b - a) for a, b in zip(seen, seen[1:], strict=False)]
    assert min(gaps) > 2**20  # a counter's gaps are the sessions opened between: 1, 2, ...
    low_bits = [n % 2**(SESSION_ID_BITS - 1) for n in seen]
    assert max(low_bits) > 2**(SESSION_ID_BITS - 5)  # spread over the range, not small numbers
