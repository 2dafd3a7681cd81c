"""Shared fixtures: tiny deterministic models (built once, cached); real registry models are in
`helpers.real_models`."""

from __future__ import annotations

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

