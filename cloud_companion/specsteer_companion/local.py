"""An in-process frame channel to a companion endpoint: the same bytes as the network, no socket.

Used by tests (in-process == networked, frame audits) and by the evaluation harness, which
still counts every byte a real deployment would send.
"""

from __future__ import annotations

from collections import deque

from specsteer.errors import CompanionUnavailable
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.verifier import Verifier


class LocalChannel:
    """FrameChannel that hands each frame to a CompanionEndpoint in this process.

    The companion's work runs when the device waits for the reply (not when it sends), so the
    device's time accounting puts it on the companion's side, as over a network.
    """

    def __init__(self, endpoint: CompanionEndpoint) -> None:
        self.endpoint = endpoint
        self._outbox: deque[bytes] = deque()
        self._inbox: deque[bytes] = deque()
        self.closed = False

    @classmethod
    def for_verifier(cls, verifier: Verifier, **endpoint_options: object) -> LocalChannel:
        return cls(CompanionEndpoint(verifier, **endpoint_options))  # type: ignore[arg-type]

    def send(self, frame: bytes) -> None:
        if self.closed or self.endpoint.closed:
            raise CompanionUnavailable("the in-process companion connection is closed")
        self._outbox.append(frame)

    def recv(self, timeout: float) -> bytes:
        while not self._inbox and self._outbox:
            self._inbox.extend(self.endpoint.handle(self._outbox.popleft()))
        if self._inbox:
            return self._inbox.popleft()
        raise CompanionUnavailable("the in-process companion sent nothing (connection closed)")

    def poll(self) -> bytes | None:
        """Only what has already been computed: an in-process companion never works ahead."""
        return self._inbox.popleft() if self._inbox else None

    def close(self) -> None:
        self.closed = True
        self.endpoint.release()
