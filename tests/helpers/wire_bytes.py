"""Hand-built frame bytes for tests: an encoder written apart from `specsteer.protocol`'s, so a
test that builds a frame with it does not trust the code under test."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """Unsigned LEB128, minimal encoding."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
