"""In-process frame channels to a companion endpoint: the same bytes as the network, no socket.

`LocalChannel` computes when the device waits for a reply (tests: in-process == networked,
frame audits); `ConcurrentChannel` computes on its own thread, beside the device, behind an
emulated network delay (the evaluation harness: the timing of a companion on another machine).
Both count every byte a real deployment would send.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

from specsteer.errors import CompanionTimedOut, CompanionUnavailable
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


class ConcurrentChannel:
    """FrameChannel to a CompanionEndpoint on a thread of its own, as a companion on another
    machine: it computes while the device works (the draft of the next round, the private
    prefill beside the session's opening), and every frame spends `one_way_s` on the way in
    each direction (an emulated network: a request and its reply pay twice that).

    Frames are handled one at a time, in order, as over one connection. `close` waits for the
    frame in hand, then frees the session, so a closed channel leaves no work behind.
    """

    def __init__(self, endpoint: CompanionEndpoint, one_way_s: float = 0.0) -> None:
        if one_way_s < 0:
            raise ValueError(f"one_way_s must be >= 0, not {one_way_s!r}")
        self.endpoint = endpoint
        self.one_way_s = one_way_s
        self.closed = False
        self._requests: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        self._replies: deque[tuple[float, bytes]] = deque()  # (when it arrives, frame)
        self._failure: BaseException | None = None
        self._changed = threading.Condition()
        self._worker = threading.Thread(target=self._serve, name="specsteer-local-companion",
                                        daemon=True)
        self._worker.start()

    @classmethod
    def for_verifier(cls, verifier: Verifier, one_way_s: float = 0.0,
                     **endpoint_options: object) -> ConcurrentChannel:
        return cls(CompanionEndpoint(verifier, **endpoint_options),  # type: ignore[arg-type]
                   one_way_s)

    def _serve(self) -> None:
        try:
            while (request := self._requests.get()) is not None:
                arrives, frame = request
                if (early := arrives - time.monotonic()) > 0:
                    time.sleep(early)
                replies = self.endpoint.handle(frame)
                back = time.monotonic() + self.one_way_s
                with self._changed:
                    self._replies.extend((back, reply) for reply in replies)
                    self._changed.notify_all()
        except BaseException as exc:  # handed to the device's next recv, never lost
            with self._changed:
                self._failure = exc
                self._changed.notify_all()
        finally:
            self.endpoint.release()

    def send(self, frame: bytes) -> None:
        if self.closed or self.endpoint.closed or self._failure is not None:
            raise CompanionUnavailable("the in-process companion connection is closed")
        self._requests.put((time.monotonic() + self.one_way_s, frame))

    def recv(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                now = time.monotonic()
                if self._replies and self._replies[0][0] <= now:
                    return self._replies.popleft()[1]
                if not self._replies:
                    if self._failure is not None:
                        raise self._failure
                    if self.closed or (self.endpoint.closed and self._requests.empty()):
                        raise CompanionUnavailable(
                            "the in-process companion sent nothing (connection closed)")
                if now >= deadline:
                    raise CompanionTimedOut(f"the in-process companion did not answer in "
                                            f"{timeout:g} s")
                until = self._replies[0][0] if self._replies else deadline
                self._changed.wait(min(until, deadline) - now)

    def poll(self) -> bytes | None:
        """A reply that has arrived, if any (the companion may be working on the next)."""
        with self._changed:
            if self._replies and self._replies[0][0] <= time.monotonic():
                return self._replies.popleft()[1]
            return None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._requests.put(None)
            with self._changed:
                self._changed.notify_all()
        if self._worker is not threading.current_thread():
            self._worker.join()
