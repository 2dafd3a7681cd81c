"""Model runtimes behind one small seam (`base`), over the same compiled folders.

- `onnx` (ONNX Runtime GenAI): `load_model`, what the eval harness and the companion's
  single-session verifier use.
- `ort_batched` (raw ONNX Runtime): sessions that share one forward pass (the batching
  companion, `load_batched_model`), and `load_device_model`, the Client's Specialist: one
  session a pass, as compiled (no `onnx` package), chosen for the device because its pass
  releases Python's GIL (a warm start's prefill does not hold up the Generalist's tokens, nor
  a UI thread its cancel) and a cancel stops it mid-pass, so the device's prefill runs
  fixed-size passes (the same float rounding on every CPU) and still stops within milliseconds.

An MLC-LLM backend would be a sibling module implementing `LanguageModel`/`Session`; PyPI's
`mlc-llm-*` packages are placeholders today, so none is shipped.
"""

from __future__ import annotations

from pathlib import Path

from specsteer.runtime.base import CancellableSession, LanguageModel, Session
from specsteer.runtime.folder import resolve_folder
from specsteer.runtime.onnx import OnnxModel, load_model, resolve_threads
from specsteer.runtime.ort_batched import BatchedModel

__all__ = ["CancellableSession", "LanguageModel", "OnnxModel", "Session", "load_device_model",
           "load_model"]


def load_device_model(
    name_or_folder: str | Path,
    *,
    precision: str | None = None,
    threads: int | None = None,
    verify: bool = False,
) -> BatchedModel:
    """The Specialist as a device runs it: raw ONNX Runtime, cancellable passes.

    threads: intra-op threads; None = every core this process may use.
    """
    return BatchedModel(resolve_folder(name_or_folder, precision),
                        threads=resolve_threads(threads), verify=verify, batchable=False)
