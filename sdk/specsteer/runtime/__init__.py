"""Model runtimes behind one small seam (`base`), over the same compiled folders.

- `onnx` (ONNX Runtime GenAI): `load_model`, what the eval harness and the companion's
  single-session verifier use.
- `ort_device` (raw ONNX Runtime): `load_device_model`, the Client's Specialist: one session
  a pass, as compiled (no `onnx` package), chosen for the device because its pass releases
  Python's GIL (a warm start's prefill does not hold up the Generalist's tokens, nor a UI
  thread its cancel) and a cancel stops it mid-pass, so the device's prefill runs fixed-size
  passes (the same float rounding on every CPU) and still stops within milliseconds; its KV
  cache stays in place between passes, and a prefill pass computes the output layer for its
  last position only.
- `ort_batched` (raw ONNX Runtime): sessions that share one forward pass (the batching
  companion, `load_batched_model`).

An MLC-LLM backend would be a sibling module implementing `LanguageModel`/`Session`; PyPI's
`mlc-llm-*` packages are placeholders today, so none is shipped.
"""

from __future__ import annotations

from specsteer.runtime.base import CancellableSession, LanguageModel, Session
from specsteer.runtime.onnx import OnnxModel, load_model
from specsteer.runtime.ort_device import DeviceModel, load_device_model

__all__ = ["CancellableSession", "DeviceModel", "LanguageModel", "OnnxModel", "Session",
           "load_device_model", "load_model"]
