"""The offline policy: what a generation does when the companion is unreachable or fails.

It covers what may come back by itself (a refused connection, a timeout, a dropped link, a
companion at its limits), never `CompanionRefused` (a wrong token, other models, another
protocol version, a certificate that does not verify): those are raised at once in every mode.

`Reconnector` holds the policy and its backoff; a probe runs `connect` on a thread of its own
(one of the owner's `Workers`, which the Client joins when it closes), so a stalled companion
never freezes the token stream.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from specsteer.errors import (
    CompanionError,
    CompanionRefused,
    CompanionUnavailable,
    ConfigError,
    ProtocolError,
)
from specsteer.link import CompanionLink
from specsteer.workers import Workers

# what the policy handles; `CompanionRefused` (a subclass of some of them) is caught first and
# raised
LINK_ERRORS = (CompanionUnavailable, CompanionError, ProtocolError)


@dataclass(frozen=True)
class OfflinePolicy:
    """What to do when the companion is unreachable or fails.

    "degrade": go on with the local Specialist (with context) and keep trying to reconnect
    with exponential backoff, resuming collaborative decoding in the same generation;
    "fail": raise CompanionUnavailable; "wait(SECONDS)": block, retrying, up to SECONDS, then
    fail.
    """

    mode: str = "degrade"
    wait_s: float = 0.0
    first_retry_s: float = 0.5
    max_retry_s: float = 8.0

    @classmethod
    def parse(cls, text: str | OfflinePolicy) -> OfflinePolicy:
        if isinstance(text, OfflinePolicy):
            return text
        spec = text.strip().lower() if isinstance(text, str) else ""
        if spec in ("degrade", "fail"):
            return cls(spec)
        if spec.startswith("wait(") and spec.endswith(")"):
            with contextlib.suppress(ValueError):
                seconds = float(spec[5:-1])
                if math.isfinite(seconds) and seconds >= 0:
                    return cls("wait", seconds)
        raise ConfigError(f"offline must be 'degrade', 'fail' or 'wait(SECONDS)' with SECONDS >= "
                          f"0, not {text!r}")


@dataclass(frozen=True)
class ModeChange:
    """The generation switched between collaborative and local decoding (after `tokens`)."""

    mode: str  # "collaborative" | "local"
    tokens: int
    reason: str


class Reconnector:
    """Connections to the companion under an `OfflinePolicy`, with exponential backoff."""

    def __init__(self, policy: OfflinePolicy, connect: Callable[[], CompanionLink] | None,
                 workers: Workers) -> None:
        self.policy = policy
        self.connect_fn = connect
        self.workers = workers
        self.retry_in = policy.first_retry_s
        self.next_retry = 0.0
        self.probe: Future[CompanionLink] | None = None

    def connect(self) -> CompanionLink:
        if self.connect_fn is None:
            raise CompanionUnavailable("no companion configured")
        return self.connect_fn()

    def wait(self, reason: str) -> CompanionLink:
        """Block, retrying with backoff, until connected or the policy's wait is over."""
        deadline = time.monotonic() + self.policy.wait_s
        delay = self.policy.first_retry_s
        while True:
            try:
                return self.connect()
            except CompanionRefused:  # waiting cannot fix it
                raise
            except LINK_ERRORS as exc:
                reason = str(exc)
            if time.monotonic() + delay > deadline:
                waited = f"{self.policy.wait_s:g} s"
                raise CompanionUnavailable(f"no companion within {waited}: {reason}")
            time.sleep(delay)
            delay = min(delay * 2, self.policy.max_retry_s)

    def went_local(self) -> None:
        """Restart the backoff: the first probe comes `first_retry_s` from now."""
        self.retry_in = self.policy.first_retry_s
        self.next_retry = time.monotonic() + self.retry_in

    def poll(self) -> CompanionLink | None:
        """A new link if a background probe just succeeded; starts probes when due."""
        if self.connect_fn is None:
            return None
        if self.probe is None:
            if time.monotonic() >= self.next_retry:
                self.probe = self._start_probe()
            return None
        if not self.probe.done():
            return None
        finished, self.probe = self.probe, None
        try:
            return finished.result()
        except CompanionRefused:
            raise
        except LINK_ERRORS:
            self.retry_in = min(self.retry_in * 2, self.policy.max_retry_s)
            self.next_retry = time.monotonic() + self.retry_in
            return None

    def _start_probe(self) -> Future[CompanionLink]:
        future: Future[CompanionLink] = Future()

        def run() -> None:
            try:
                future.set_result(self.connect())
            except BaseException as exc:  # delivered to the decoding loop through the future
                future.set_exception(exc)

        self.workers.start(run, "specsteer-reconnect")
        return future

    def close(self) -> None:
        """A late reconnect nobody will use is closed when it lands."""
        if self.probe is not None:
            self.probe.add_done_callback(_close_quietly)


def _close_quietly(future: Future[CompanionLink]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()
