"""Cross-session batching: the verification passes of many devices share one forward pass.

`BatchingModel` wraps a `BatchedModel` (raw ONNX Runtime, batchable sessions) behind the
ordinary `LanguageModel` seam, so `VerifierSession` and `CrossVerifierSession` are unchanged:
their sessions' `append` puts (session, ids) on the model's queue and blocks, as it blocked
on the forward pass before. One worker thread per model takes every pending request, runs them
in as few `append_batch` passes as the limits allow, and hands each caller its logits.

There is no batching window: a request that finds the worker idle runs at once (one device
waits no longer than without batching), and requests that arrive while a pass runs share the
next pass. Under load the pass size therefore follows the number of waiting devices, and each
pass reads the weights once for all of them. `rewind` and `close` act on the session directly:
its owner is never inside `append` while it calls them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from specsteer.errors import SessionError
from specsteer.runtime.ort_batched import BatchedModel, BatchedSession

log = logging.getLogger("specsteer_companion")


@dataclass(frozen=True)
class BatchLimits:
    """Caps on one pass, with the reason for each default.

    max_batch: sessions per pass. 16 covers the load benchmark's largest level; more rows per
        pass add attention and KV-copy work linearly while the weight read is already shared.
    max_tokens: padded tokens per pass (rows x longest row). A verification row is K + 1..K + 2
        tokens, so 256 lets 16 sessions verify together with drafts up to 16, while a prompt
        prefill (hundreds of tokens) runs on its own instead of padding every short row to its
        length; it also bounds a pass's logits to 256 x vocab floats (155 MB for Qwen2.5).
    """

    max_batch: int = 16
    max_tokens: int = 256

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_tokens < 1:
            raise ValueError("max_batch and max_tokens must be at least 1")


@dataclass
class BatchStats:
    """What the worker did (logged at shutdown): passes run, rows served, largest pass."""

    passes: int = 0
    rows: int = 0
    largest: int = 0

    def record(self, rows: int) -> None:
        self.passes += 1
        self.rows += rows
        self.largest = max(self.largest, rows)


@dataclass
class _Request:
    session: BatchedSession
    ids: list[int]
    future: Future[np.ndarray] = field(default_factory=Future)


class QueuedSession:
    """A session of a `BatchingModel`: appends go through the model's queue."""

    def __init__(self, model: BatchingModel, inner: BatchedSession) -> None:
        self._model = model
        self.inner = inner

    @property
    def length(self) -> int:
        return self.inner.length

    def append(self, ids: Sequence[int]) -> np.ndarray:
        """Queue the ids and wait for the pass that runs them; [len(ids), vocab] logits."""
        return self._model.submit(self.inner, ids)

    def rewind(self, length: int) -> None:
        self.inner.rewind(length)

    def close(self) -> None:
        self.inner.close()


class BatchingModel:
    """A `LanguageModel` whose sessions' appends from many threads share forward passes."""

    def __init__(self, model: BatchedModel, limits: BatchLimits | None = None) -> None:
        self.model = model
        self.limits = limits or BatchLimits()
        self.name = model.name
        self.precision = model.precision
        self.sha256 = model.sha256
        self.vocab_size = model.vocab_size
        self.context_length = model.context_length
        self.tokenizer = model.tokenizer
        self.stats = BatchStats()
        self._pending: list[_Request] = []
        self._wake = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(
            target=self._serve, name=f"batch-{model.name}", daemon=True
        )
        self._worker.start()

    def new_session(self, max_length: int | None = None) -> QueuedSession:
        """An empty session; `max_length` bounds its KV cache (default 4096, at most the window)."""
        return QueuedSession(self, self.model.new_session(max_length))

    def submit(self, session: BatchedSession, ids: Sequence[int]) -> np.ndarray:
        """Append `ids` to `session` in the next pass; blocks until it ran."""
        request = _Request(session, list(ids))
        with self._wake:
            if self._closed:
                raise SessionError(f"the batching model {self.name} is closed")
            self._pending.append(request)
            self._wake.notify()
        return request.future.result()

    def close(self) -> None:
        """Stop the worker after the requests already queued."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._worker.join()

    def plan(self, requests: list[_Request]) -> list[list[_Request]]:
        """Split pending requests into passes within the limits, shortest rows first.

        Single-token rows never share a pass with longer ones (the runtime would split them
        anyway, see `BatchedModel.append_batch`). Sorting by length packs similar rows together,
        so little is spent on padding; a row longer than max_tokens runs alone.
        """
        batches: list[list[_Request]] = []
        current: list[_Request] = []
        for request in sorted(requests, key=lambda r: len(r.ids)):
            width = len(request.ids)
            full = len(current) >= self.limits.max_batch
            full |= (len(current) + 1) * width > self.limits.max_tokens
            full |= bool(current) and (len(current[0].ids) == 1) != (width == 1)
            if current and full:
                batches.append(current)
                current = []
            current.append(request)
        if current:
            batches.append(current)
        return batches

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if not self._pending:  # closed and drained
                    return
                pending, self._pending = self._pending, []
            for batch in self.plan(pending):
                self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        """One pass; if it fails, each request alone, so an error reaches only its own caller."""
        try:
            results = self.model.append_batch([(r.session, r.ids) for r in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            log.debug("a batch of %d failed (%s); running its rows one by one", len(batch), exc)
            for request in batch:
                self._run([request])
            return
        self.stats.record(len(batch))
        for request, logits in zip(batch, results, strict=True):
            request.future.set_result(logits)
