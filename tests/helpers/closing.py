"""Whether an in-process companion link was closed, session included."""

from __future__ import annotations

import time

from specsteer_companion.local import LocalChannel


def closed_in_time(channel: LocalChannel, bound_s: float = 10.0) -> bool:
    """Whether the channel and its companion session are closed. Closing may run on a thread
    of its own (a cancelled or replaced session): wait for it, with a generous bound that
    only a leak reaches."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if channel.closed and channel.endpoint.session is None:
            return True
        time.sleep(0.01)
    return False
