"""Ending live connections whose device token was revoked, within one check period.

A token is checked at Hello; a device that holds its connection open would otherwise keep
being served after `specsteer-companion tokens revoke`. `watch_revocations` re-checks the
identities of the live connections every period and marks those revoked: an idle connection
(waiting for the device's next frame) is ended at once, a busy one by its adapter right after
the frame in flight. Shared by the single-process server and the Ray ingress, which differ only
in how a connection is listed and ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine, Iterable
from typing import Any, Protocol, TypeVar

log = logging.getLogger("specsteer_companion")
REVOKED_MESSAGE = "device token revoked"

# Token ids in, the revoked ones among them out (e.g. `TokenStore.revoked_among`).
RevocationCheck = Callable[[Collection[str]], "set[str]"]


class Revocable(Protocol):
    """A live connection as the watch sees it."""

    revoked: bool  # set by the watch; the adapter ends a busy connection after its frame

    @property
    def identity(self) -> str | None: ...  # its token id once logged in

    @property
    def busy(self) -> bool: ...  # a frame of it is being handled


Connection = TypeVar("Connection", bound=Revocable)


async def watch_revocations(live: Callable[[], Iterable[Connection]],
                            check: RevocationCheck | None, every_s: float,
                            end: Callable[[Connection], Coroutine[Any, Any, None]],
                            tidy: Callable[[], None] = lambda: None) -> None:
    """Every `every_s` (until cancelled): `tidy()`, then mark the connections of revoked
    tokens and `end` the idle ones. The check runs off the event loop; a store that fails is
    logged and tried again next period, never taking the server down."""
    loop = asyncio.get_running_loop()
    ending: set[asyncio.Task[None]] = set()  # held so that a pending end is not collected
    while True:
        await asyncio.sleep(every_s)
        tidy()
        if check is None:
            continue
        connections = list(live())
        identities = {c.identity for c in connections if c.identity}
        if not identities:
            continue
        try:
            revoked = await loop.run_in_executor(None, check, identities)
        except Exception:  # a busy or broken store: keep serving, try again next time
            log.exception("could not check for revoked tokens")
            continue
        for conn in connections:
            if conn.revoked or conn.identity not in revoked:
                continue
            conn.revoked = True
            log.info("closing a connection of revoked token %s", conn.identity)
            if not conn.busy:  # idle in recv: tell it now; a busy one is told after its frame
                task = asyncio.create_task(end(conn))
                ending.add(task)
                task.add_done_callback(ending.discard)
