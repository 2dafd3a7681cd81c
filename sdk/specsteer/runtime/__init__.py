"""Model runtimes behind one small seam (`base`); ONNX Runtime GenAI is the main implementation.

`ort_batched` is a second one over the same compiled folders, on raw ONNX Runtime, whose
sessions can share one forward pass (the batching companion); import it from there, so that
devices never load it.

An MLC-LLM backend would be a sibling module implementing `LanguageModel`/`Session`; PyPI's
`mlc-llm-*` packages are placeholders today, so none is shipped.
"""

from specsteer.runtime.base import LanguageModel, Session
from specsteer.runtime.onnx import OnnxModel, load_model

__all__ = ["LanguageModel", "OnnxModel", "Session", "load_model"]
