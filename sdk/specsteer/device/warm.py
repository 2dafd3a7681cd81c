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

from specsteer.runtime.base import CancellableSession, LanguageModel
from specsteer.runtime.track import Track
from specsteer.workers import Workers

# Operations per second one CPU core sustains in an int8 prefill: a round, conservative figure
# (one core of the benchmark machine ran Qwen2.5-0.5B's int8 prefill at ~48 G multiply-adds/s,
# ~97 G ops/s, docs/BENCHMARKS.md "Latency"); weight bytes also overcount parameters (fp32
# embeddings), so the estimate errs towards a warm start. It only decides whether one pays.
OPS_PER_CORE = 50e9


def estimated_prefill_s(model: LanguageModel, tokens: int) -> float:
    """Seconds a prefill of `tokens` should take: 2 ops per weight byte per token (a byte is
    about a parameter at int8) over the model's threads at `OPS_PER_CORE`."""
    weight_bytes = getattr(model, "weight_bytes", 0)
    threads = getattr(model, "threads", 1) or 1
    return tokens * 2.0 * weight_bytes / (threads * OPS_PER_CORE)


class BackgroundPrefill:
    """`track.prefill()` running on a thread of `workers` (the generation's owner's: its Client
    joins it; by default its own); `join` re-raises what it raised."""

    def __init__(self, track: Track, cancel: threading.Event,
                 workers: Workers | None = None) -> None:
        self.track, self.cancel = track, cancel
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
            self.track.prefill(self.stop, self.cancel)
        except BaseException as exc:  # delivered to the decoding loop by `join`
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - started

    def start(self) -> None:
        """Let the prefill run (from now on)."""
        self.go.set()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        """Run the prefill to its end (starting it if need be); raises `GenerationCancelled`
        if it was stopped."""
        self.go.set()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abandon(self) -> None:
        """Stop the prefill at its next chunk and wait for the thread (nothing raised)."""
        self.stop.set()
        self.go.set()
        self._thread.join()
