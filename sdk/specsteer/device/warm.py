"""The device's private prefill on a thread of its own, while a warm start writes.

During a warm start the companion writes Generalist tokens from the public prompt while this
thread prefills the Specialist's private prompt (in chunks, so it stops within one chunk when
the generation ends or is cancelled). Nothing else touches the track until `join` returns.
On the device's runtime (a `CancellableSession`, raw ONNX Runtime) a pass releases Python's
GIL, so the prefill starts at once, beside the connection, hello and session opening. On a
runtime whose pass holds the GIL (ONNX Runtime GenAI) it starts once the first Generalist
token is in (`start`): running meanwhile, it would hold up those steps at every pass, and the
first token with them.
Whether a warm start pays is decided from `estimated_prefill_s`, a deterministic estimate (the
same prompt and model always decide the same way), not from a clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from specsteer.runtime.base import CancellableSession, LanguageModel
from specsteer.runtime.track import Track
from specsteer.workers import Workers

# Multiply-adds per second one CPU core sustains in a device's prefill, per precision: round,
# conservative figures measured per CPU second on the benchmark machine (Qwen2.5-0.5B, one
# thread, last-row passes; docs/BENCHMARKS.md "Prefill at the limit"); others as int8
MACS_PER_CORE = {"int8": 35e9, "w8a8": 75e9, "int4": 35e9, "fp32": 35e9}
# a folder whose manifest predates `prefill_macs_per_token`: operations per weight byte a
# token, as estimated before it (weight bytes overcount: the embedding table is a lookup)
OPS_PER_CORE = 50e9


def estimated_prefill_s(model: LanguageModel, tokens: int) -> float:
    """Seconds a prefill of `tokens` should take on the model's threads: the multiply-adds a
    token of its graph takes (recorded in its manifest) at `MACS_PER_CORE` per thread; else
    2 ops per weight byte at `OPS_PER_CORE`."""
    threads = getattr(model, "threads", 1) or 1
    macs = getattr(model, "manifest", {}).get("prefill_macs_per_token")
    if macs:
        rate = MACS_PER_CORE.get(getattr(model, "precision", "int8"), MACS_PER_CORE["int8"])
        return tokens * macs / (threads * rate)
    weight_bytes = getattr(model, "weight_bytes", 0)
    return tokens * 2.0 * weight_bytes / (threads * OPS_PER_CORE)


class BackgroundPrefill:
    """`track.prefill()` running on a thread of `workers` (the generation's owner's: its Client
    joins it; by default its own); `join` re-raises what it raised and returns what `then`
    made after the prefill on the same thread (a cold start's first draft, while the
    companion still opens the session), None without it or when stopped first."""

    def __init__(self, track: Track, cancel: threading.Event,
                 workers: Workers | None = None,
                 then: Callable[[Track, Callable[[], bool]], Any] | None = None) -> None:
        self.track, self.cancel, self.then = track, cancel, then
        self.made: Any = None
        self.stop = threading.Event()  # set when the generation ends before the switch
        self.go = threading.Event()  # set by `start` (the first token is in), or at once
        if isinstance(track.session, CancellableSession):  # its passes release the GIL
            self.go.set()
        self.seconds = 0.0
        self._error: BaseException | None = None
        self._thread = (workers or Workers()).start(self._run, "specsteer-prefill")

    def _run(self) -> None:
        self.go.wait()
        started = time.perf_counter()
        try:
            try:
                self.track.prefill(self.stop, self.cancel)
            finally:
                self.seconds = time.perf_counter() - started  # the prefill's, not `then`'s
            if self.then is not None and not self._stopped():
                self.made = self.then(self.track, self._stopped)
        except BaseException as exc:  # delivered to the decoding loop by `join`
            self._error = exc

    def _stopped(self) -> bool:
        return self.stop.is_set() or self.cancel.is_set()

    def start(self) -> None:
        """Let the prefill run (from now on)."""
        self.go.set()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> Any:
        """Run the prefill to its end (starting it if need be) and return what `then` made;
        raises `GenerationCancelled` if it was stopped."""
        self.go.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.made

    def abandon(self) -> None:
        """Stop the prefill at its next chunk and wait for the thread (nothing raised)."""
        self.stop.set()
        self.go.set()
        self._thread.join()
