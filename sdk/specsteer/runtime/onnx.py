"""ONNX Runtime GenAI implementation of the runtime seam.

One `onnxruntime_genai.Model` per loaded folder; each `OnnxSession` is a `Generator` with its own
KV cache. `append` returns the logits of every appended position and `rewind` is the generator's
exact `rewind_to`, so rejected drafts cost no recomputation of the kept prefix.
Threads default to the cores this process may run on (`default_threads`): a device's prefill
is arithmetic-bound and scales with cores. A companion, or anything running two model
processes on one machine, passes its own count (two processes spinning on the same cores
collapse).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

from specsteer.runtime.folder import (
    DEFAULT_MAX_LENGTH,
    FolderModel,
    check_ids,
    check_rewind,
    resolve_folder,
)

__all__ = ["DEFAULT_MAX_LENGTH", "OnnxModel", "OnnxSession", "default_threads", "load_model"]


def default_threads() -> int:
    """The number of CPU cores this process may use (its affinity mask, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity API (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int | None) -> int:
    """`threads` checked, or `default_threads()` for None."""
    if threads is None:
        return default_threads()
    if threads < 1:
        raise ValueError(f"threads must be >= 1, not {threads}")
    return threads


class OnnxSession:
    """One sequence with its own KV cache (a GenAI generator)."""

    def __init__(self, model: OnnxModel, max_length: int) -> None:
        params = og.GeneratorParams(model.og_model)
        params.set_search_options(max_length=max_length)
        self._generator = og.Generator(model.og_model, params)
        self._model = model
        self._length = 0
        self.max_length = max_length

    @property
    def length(self) -> int:
        return self._length

    def append(self, ids: Sequence[int]) -> np.ndarray:
        tokens = check_ids(ids, self._model.vocab_size, self._length, self.max_length)
        self._generator.append_tokens(tokens.astype(np.int32))
        self._length += int(tokens.size)
        logits = self._generator.get_output("logits")
        return np.array(logits.reshape(-1, logits.shape[-1])[-tokens.size :], dtype=np.float32)

    def rewind(self, length: int) -> None:
        check_rewind(length, self._length)
        if length == self._length:
            return
        self._generator.rewind_to(length)
        self._length = length

    def close(self) -> None:
        self._generator = None  # type: ignore[assignment]


class OnnxModel(FolderModel):
    """A compiled model folder loaded into ONNX Runtime GenAI."""

    def __init__(
        self, folder: str | Path, *, threads: int | None = None, verify: bool = False
    ) -> None:
        super().__init__(folder, verify=verify)
        threads = resolve_threads(threads)
        info = self.info
        config = og.Config(str(self.folder))
        config.clear_providers()
        options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        try:
            self.og_model = og.Model(config)
        except Exception as exc:  # onnxruntime_genai raises bare RuntimeError/OrtException
            raise info.load_error(exc) from exc
        self.threads = threads

    def new_session(self, max_length: int | None = None) -> OnnxSession:
        """An empty session; `max_length` bounds its KV cache (default 4096, at most the window)."""
        return OnnxSession(self, self.info.session_length(max_length))


def load_model(
    name_or_folder: str | Path,
    *,
    precision: str | None = None,
    threads: int | None = None,
    verify: bool = False,
) -> OnnxModel:
    """Load a registry model by name (compiled at `precision`) or any compiled folder by path.

    threads: ONNX Runtime intra-op threads; None = every core this process may use.
    """
    return OnnxModel(resolve_folder(name_or_folder, precision), threads=threads, verify=verify)
