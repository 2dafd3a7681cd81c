"""Shared fixtures: tiny deterministic models (built once, cached) and real registry models."""

from __future__ import annotations

import os

import pytest

from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import OnnxModel, load_model
from specsteer.runtime.ort_batched import BatchedModel


@pytest.fixture(scope="session")
def tiny_model() -> OnnxModel:
    """2-layer Llama, seed 0: the tiny Specialist."""
    return load_model(tiny_model_dir("llama", seed=0))


@pytest.fixture(scope="session")
def tiny_generalist() -> OnnxModel:
    """Same tokenizer, other weights (seed 1): the tiny Generalist."""
    return load_model(tiny_model_dir("llama", seed=1))


@pytest.fixture(scope="session")
def tiny_batched() -> BatchedModel:
    """The tiny Specialist's folder on the batchable raw-ONNX-Runtime runtime."""
    return BatchedModel(tiny_model_dir("llama", seed=0))


@pytest.fixture(scope="session")
def tiny_batched_generalist() -> BatchedModel:
    """The tiny Generalist's folder on the batchable raw-ONNX-Runtime runtime."""
    return BatchedModel(tiny_model_dir("llama", seed=1))


def real_model(name: str, precision: str | None = None) -> OnnxModel:
    """A registry model, fetched and compiled on first use (cached under $SPECSTEER_HOME)."""
    from specsteer.models.compile import compile_model
    from specsteer.models.fetch import fetch

    if os.environ.get("SPECSTEER_SKIP_REAL"):
        pytest.skip("SPECSTEER_SKIP_REAL is set")
    fetch(name)
    return load_model(compile_model(name, precision))
