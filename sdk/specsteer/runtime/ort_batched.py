"""Raw ONNX Runtime implementation of the seam whose sessions can share one forward pass.

ONNX Runtime GenAI gives every session its own generator, so N sessions cost N passes, each
reading all the weights. Here a session is only its KV cache (a numpy array per session), and
`BatchedModel.append_batch` appends token lists for several sessions in ONE `run`, batch
dimension = number of sessions, over the same compiled folder:

- past KV: each row's cache is copied into a [B, kv_heads, P, head] tensor, P = the longest
  past; shorter rows are right-padded (the padding is never read);
- new tokens: S = the longest list; shorter lists are right-padded with a dummy id;
- attention_mask: row b holds ones for its past_b + n_b positions, so the graph's ReduceSum
  gives GroupQueryAttention each row's true total length (seqlens_k + 1); the mask is
  P + S wide, which is the kernel's total_sequence_length bound;
- query_seqlens: GroupQueryAttention's optional input with n_b per row. Without it the CPU
  kernel refuses S > 1 with past and B > 1 ("batch_size must be 1 when sequence_length > 1 and
  past context is given", measured); with it each row's past is seqlens_k + 1 - n_b, its
  rotary positions start there, its padding rows never enter the cache, and each valid row's
  result equals that of an unpadded call. The compiled graphs leave that input unwired, so
  `_batchable_graph` wires it into every GroupQueryAttention node at load time (in memory,
  the graph only; the weights and the folder on disk are untouched);
- afterwards present[b, :, past_b : past_b + n_b] is copied into the session and
  logits[b, :n_b] returned: the dummies leave no trace.

A pass never mixes single-token rows with longer ones (`append_batch` says why), so every row's
logits equal what the session would get alone, and what ONNX Runtime GenAI gives (tested on tiny
models and Qwen2.5 0.5B int8: bit for bit). Rewind is an index move: positions after `length`
are overwritten by the next append. A session's cache grows by doubling up to its max_length.
Needs onnxruntime with GroupQueryAttention's query_seqlens input, and the onnx package (to wire
it), both part of the companion's dependencies. The device runs one session a pass on a runtime
of its own (`ort_device`: a KV cache shared between passes, cancellable passes).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specsteer.errors import CorruptModelError, ModelError, SessionError
from specsteer.runtime.folder import check_ids, resolve_folder
from specsteer.runtime.ort_graph import CachedSession, OrtGraphModel

QUERY_SEQLENS = "query_seqlens"
_QUERY_SEQLENS_SLOT = 16  # GroupQueryAttention's optional input: valid new tokens per row
_MIN_CAPACITY = 64


@functools.cache
def _supports_query_seqlens() -> bool:
    """Whether this onnxruntime's GroupQueryAttention has the query_seqlens input."""
    schemas = getattr(ort.capi._pybind_state, "get_all_operator_schema", None)
    if schemas is None:  # a build without schemas: let loading tell
        return True
    return any(
        s.name == "GroupQueryAttention" and any(i.name == QUERY_SEQLENS for i in s.inputs)
        for s in schemas()
    )


def _batchable_graph(path: Path) -> bytes:
    """The graph with `query_seqlens` wired into every GroupQueryAttention node."""
    try:
        import onnx
    except ImportError as exc:
        raise ModelError(
            "batched sessions need the onnx package: pip install 'specsteer[companion]'"
        ) from exc
    if not _supports_query_seqlens():
        raise ModelError(
            f"onnxruntime {ort.__version__} has no GroupQueryAttention query_seqlens input, "
            "which batched sessions need; upgrade onnxruntime"
        )
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    nodes = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if not nodes:
        raise CorruptModelError(f"{path} has no GroupQueryAttention node to batch")
    graph.input.append(
        onnx.helper.make_tensor_value_info(QUERY_SEQLENS, onnx.TensorProto.INT32, ["batch_size"])
    )
    for node in nodes:
        while len(node.input) <= _QUERY_SEQLENS_SLOT:
            node.input.append("")
        node.input[_QUERY_SEQLENS_SLOT] = QUERY_SEQLENS
    return model.SerializeToString()


class BatchedSession(CachedSession):
    """One sequence whose KV cache is a numpy array [layers, 2 (key, value), heads, cap, head]."""

    def __init__(self, model: BatchedModel, max_length: int) -> None:
        super().__init__(max_length)
        self._model = model
        self._kv: np.ndarray | None = model._empty_cache(0)

    @property
    def closed(self) -> bool:
        return self._kv is None

    @property
    def capacity(self) -> int:
        """Positions the cache can hold before it grows."""
        return 0 if self._kv is None else self._kv.shape[3]

    def check(self, ids: Sequence[int]) -> np.ndarray:
        """The ids as an array, or the SessionError `append` would raise (no model work)."""
        if self._kv is None:
            raise SessionError("the session is closed")
        return check_ids(ids, self._model.vocab_size, self._length, self.max_length)

    def append(self, ids: Sequence[int]) -> np.ndarray:
        """Append ids; [len(ids), vocab] float32 logits (a batch of one)."""
        return self._model.append_batch([(self, ids)])[0]

    def close(self) -> None:
        with self._lock:  # waits for a pass that holds this session
            self._kv = None

    def _reserve(self, needed: int) -> np.ndarray:
        """The cache, grown (by doubling, at most max_length) to hold `needed` positions."""
        kv = self._kv
        assert kv is not None
        if needed > kv.shape[3]:
            cap = max(_MIN_CAPACITY, kv.shape[3])
            while cap < needed:
                cap *= 2
            grown = self._model._empty_cache(min(cap, self.max_length))
            grown[:, :, :, : self._length] = kv[:, :, :, : self._length]
            self._kv = kv = grown
        return kv


class BatchedModel(OrtGraphModel):
    """A compiled folder in a raw `onnxruntime.InferenceSession`; sessions batch into one run."""

    def _graph(self, path: Path) -> bytes:
        return _batchable_graph(path)

    def new_session(self, max_length: int | None = None) -> BatchedSession:
        """An empty session; `max_length` bounds its KV cache (default 4096, at most the window)."""
        return BatchedSession(self, self.info.session_length(max_length))

    def _empty_cache(self, capacity: int) -> np.ndarray:
        shape = (self._layers, 2, self._kv_heads, capacity, self._head_size)
        return np.empty(shape, self._kv_dtype)

    def append_batch(
        self, requests: Sequence[tuple[BatchedSession, Sequence[int]]]
    ) -> list[np.ndarray]:
        """Append each request's ids to its session; one [len(ids), vocab] array per request.

        Rows run in at most two forward passes: one for the single-token appends, one for the
        longer ones. ONNX Runtime computes a pass of one new token per row (S = 1) with other
        kernels than S > 1, and at int8 their logits differ slightly (docs/BENCHMARKS.md), so
        mixing them would make a session's logits depend on who shared its pass; kept apart,
        every row equals what the same session would get alone (and from GenAI). A longer row
        whose padding would reach past the context window runs alone. Any invalid request
        (closed session, bad ids, over max_length, a session twice) raises SessionError
        before any model work.
        """
        if not requests:
            return []
        sessions = [session for session, _ in requests]
        if len({id(s) for s in sessions}) != len(sessions):
            raise SessionError("a session can appear only once in a batch")
        with contextlib.ExitStack() as held:
            for session in sorted(sessions, key=id):  # one global order: no deadlock
                held.enter_context(session._lock)
            rows = [(session, session.check(ids)) for session, ids in requests]
            out: list[np.ndarray] = [np.empty(0, np.float32)] * len(rows)
            for group in self._groups(rows):
                results = self._run([rows[i] for i in group])
                for i, logits in zip(group, results, strict=True):
                    out[i] = logits
            return out

    def _groups(self, rows: list[tuple[BatchedSession, np.ndarray]]) -> list[list[int]]:
        """Row indices per pass: single tokens together, longer ones together, misfits alone."""
        singles = [i for i, (_, tokens) in enumerate(rows) if tokens.size == 1]
        longer = [i for i, (_, tokens) in enumerate(rows) if tokens.size > 1]
        width = max((rows[i][1].size for i in longer), default=0)
        fit = [i for i in longer if rows[i][0].length + width <= self.context_length]
        alone = [[i] for i in longer if i not in fit]
        return [g for g in (singles, fit) if g] + alone

    def _run(self, rows: list[tuple[BatchedSession, np.ndarray]]) -> list[np.ndarray]:
        """One forward pass over `rows` (validated, locked); see the module docstring."""
        b = len(rows)
        width = max(tokens.size for _, tokens in rows)
        pasts = [session.length for session, _ in rows]
        past = max(pasts)
        ids = np.full((b, width), self._pad_id, self._ids_dtype)
        mask = np.zeros((b, past + width), self._mask_dtype)
        counts = np.array([tokens.size for _, tokens in rows], np.int32)
        kv = self._batch_cache(b, past)
        for r, (session, tokens) in enumerate(rows):
            ids[r, : tokens.size] = tokens
            mask[r, : pasts[r] + tokens.size] = 1
            if pasts[r]:
                assert session._kv is not None
                kv[:, :, r, :, : pasts[r]] = session._kv[:, :, :, : pasts[r]]
        feeds = {self._input_ids: ids, self._mask: mask, QUERY_SEQLENS: counts}
        for layer, (key, value) in enumerate(self._past):
            feeds[key] = kv[layer, 0]
            feeds[value] = kv[layer, 1]
        outputs = [self._logits, *(name for pair in self._present for name in pair)]
        logits, *present = self._ort.run(outputs, feeds)
        results = []
        for r, (session, tokens) in enumerate(rows):
            start, n = pasts[r], tokens.size
            cache = session._reserve(start + n)
            new = slice(start, start + n)
            for layer in range(self._layers):
                cache[layer, 0, :, new] = present[2 * layer][r, :, new]
                cache[layer, 1, :, new] = present[2 * layer + 1][r, :, new]
            session._length = start + n
            results.append(np.array(logits[r, :n], dtype=np.float32))
        return results

    def _batch_cache(self, batch: int, past: int) -> np.ndarray:
        """[layers, 2, batch, heads, past, head]: each [layer, k/v] slice is one contiguous input.

        Uninitialised on purpose: a row's positions after its own past are never read (a test
        fills them with NaN to make sure).
        """
        shape = (self._layers, 2, batch, self._kv_heads, past, self._head_size)
        return np.empty(shape, self._kv_dtype)


def load_batched_model(
    name_or_folder: str | Path,
    *,
    precision: str | None = None,
    threads: int = 1,
    verify: bool = False,
) -> BatchedModel:
    """Like `load_model`, on raw ONNX Runtime with batchable sessions (a batching companion)."""
    return BatchedModel(resolve_folder(name_or_folder, precision), threads=threads,
                        verify=verify)
