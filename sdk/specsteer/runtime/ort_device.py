"""The device's runtime: one session a pass on raw ONNX Runtime, its KV cache kept in place.

What it gives a device that ONNX Runtime GenAI does not: a pass that releases Python's GIL (a
warm start's private prefill runs beside the network thread) and that a cancel stops mid-way
(`ort_graph.terminated_by`). What it shares with GenAI: the KV cache is one buffer per layer
that every pass reads and writes in place. Its `OrtValue`s are bound through `IOBinding` both
as the pass's past and as its present output, so GroupQueryAttention appends the new
positions into the same memory (`past_present_share_buffer`) and nothing is copied between
passes. The buffer grows by doubling, copied once per growth; a rewind is an index move (the
positions after `length` are written over by the next pass). A pass that fails or is
cancelled may have written past `length`, which no pass reads: the session is as it was.

`rows`: a pass returns the logits of its last `rows` positions only, computed only for those
when the folder's graph takes `logits_to_keep` (`models.logits_rows`): a prefill asks for one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specsteer.errors import SessionError
from specsteer.models.logits_rows import LOGITS_TO_KEEP
from specsteer.runtime.base import Flag
from specsteer.runtime.folder import check_ids, resolve_folder
from specsteer.runtime.onnx import resolve_threads
from specsteer.runtime.ort_graph import CachedSession, OrtGraphModel, terminated_by

_MIN_CAPACITY = 256  # positions of a new session's cache; it doubles as it fills


def _value(array: np.ndarray) -> ort.OrtValue:
    return ort.OrtValue.ortvalue_from_numpy(array)


class DeviceSession(CachedSession):
    """One sequence whose KV cache lives in bound `OrtValue`s [1, kv_heads, capacity, head]."""

    def __init__(self, model: DeviceModel, max_length: int) -> None:
        super().__init__(max_length)
        self._model = model
        self._cache: list[tuple[np.ndarray, np.ndarray]] | None = []
        self._values: list[ort.OrtValue] = []  # the cache's OrtValues, bound while they live
        self._binding = model._ort.io_binding()
        self._binding.bind_output(model._logits)  # output 0: rebound by every pass
        self._grow(0)

    @property
    def closed(self) -> bool:
        return self._cache is None

    @property
    def capacity(self) -> int:
        """Positions the cache holds before it grows."""
        return 0 if not self._cache else self._cache[0][0].shape[2]

    def append(self, ids: Sequence[int], rows: int | None = None) -> np.ndarray:
        """Append ids; float32 logits [len(ids), vocab], or of the last `rows` positions."""
        return self.append_cancellable(ids, (), rows)

    def append_cancellable(self, ids: Sequence[int], cancel: Sequence[Flag | None],
                           rows: int | None = None) -> np.ndarray:
        """`append`, stopped mid-pass once any `cancel` flag is set: `GenerationCancelled`
        within milliseconds, and the session is left as it was."""
        with self._lock:
            if self._cache is None:
                raise SessionError("the session is closed")
            tokens = check_ids(ids, self._model.vocab_size, self._length, self.max_length)
            keep = tokens.size if rows is None else rows
            if not 1 <= keep <= tokens.size:
                raise SessionError(f"rows must be in [1, {tokens.size}], not {rows}")
            if self._length + tokens.size > self.capacity:
                self._grow(self._length + tokens.size)
            with terminated_by(cancel) as options:
                logits = self._model._run(self._binding, tokens, self._length, keep, options)
            self._length += tokens.size
            return logits

    def close(self) -> None:
        with self._lock:  # waits for a pass that holds this session
            self._cache, self._values = None, []
            self._binding.clear_binding_inputs()
            self._binding.clear_binding_outputs()

    def _grow(self, needed: int) -> None:
        """A cache that holds `needed` positions (doubling, at most max_length), the held
        positions copied over and bound as every layer's past and present. Never smaller than
        a sliding window: GroupQueryAttention refuses a cache shorter than its local window."""
        assert self._cache is not None
        capacity = max(self.capacity, _MIN_CAPACITY, self._model.info.sliding_window)
        while capacity < needed:
            capacity *= 2
        grown = [self._model._empty_cache(min(capacity, self.max_length)) for _ in range(2)
                 for _ in range(self._model._layers)]
        cache = list(zip(grown[0::2], grown[1::2], strict=True))
        for (key, value), (old_key, old_value) in zip(cache, self._cache, strict=False):
            key[:, :, : self._length] = old_key[:, :, : self._length]
            value[:, :, : self._length] = old_value[:, :, : self._length]
        self._cache = cache
        self._values = self._model._bind_cache(self._binding, cache)


class DeviceModel(OrtGraphModel):
    """A compiled folder as a device runs it: one session a pass, cancellable, GIL released."""

    def new_session(self, max_length: int | None = None) -> DeviceSession:
        """An empty session; `max_length` bounds its KV cache (default 4096, at most the window)."""
        return DeviceSession(self, self.info.session_length(max_length))

    def _empty_cache(self, capacity: int) -> np.ndarray:
        return np.zeros((1, self._kv_heads, capacity, self._head_size), self._kv_dtype)

    def _bind_cache(self, binding: ort.IOBinding,
                    cache: list[tuple[np.ndarray, np.ndarray]]) -> list[ort.OrtValue]:
        """Bind each layer's buffers as its past and its present (one memory, written in
        place); returns the bound OrtValues, which must outlive the binding's use of them."""
        values = []
        for (past_key, past_value), (present_key, present_value), arrays in zip(
                self._past, self._present, cache, strict=True):
            for past, present, array in ((past_key, present_key, arrays[0]),
                                         (past_value, present_value, arrays[1])):
                value = _value(array)
                values.append(value)
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
        return values

    def _run(self, binding: ort.IOBinding, tokens: np.ndarray, past: int, keep: int,
             options: ort.RunOptions | None) -> np.ndarray:
        """One pass of `tokens` after `past` held positions; logits of the last `keep`."""
        feeds = {
            self._input_ids: tokens.astype(self._ids_dtype)[None, :],
            self._mask: np.ones((1, past + tokens.size), self._mask_dtype),
        }
        if self.keeps_rows:
            feeds[LOGITS_TO_KEEP] = np.array([keep], np.int64)
        values = {name: _value(array) for name, array in feeds.items()}  # alive for the run
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(self._logits)  # allocated by the run: its row count varies
        self._ort.run_with_iobinding(binding, options)
        logits = binding.get_outputs()[0].numpy()[0]
        return np.array(logits[-keep:], dtype=np.float32)


def load_device_model(
    name_or_folder: str | Path,
    *,
    precision: str | None = None,
    threads: int | None = None,
    verify: bool = False,
) -> DeviceModel:
    """The Specialist as a device runs it (see the module docstring).

    precision: of a registry name; None = the precision a device runs it at by default
    (`ModelSpec.device_default`: w8a8 for the registry's Specialist on a CPU with VNNI, int8
    elsewhere, docs/models.md).
    threads: intra-op threads; None = every core this process may use.
    """
    return DeviceModel(resolve_folder(name_or_folder, precision, device=True),
                       threads=resolve_threads(threads), verify=verify)
