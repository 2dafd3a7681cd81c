"""`specsteer models add PATH`: a model the user brings, compiled and registered by name.

A GGUF file or a Hugging Face folder of a supported architecture (`source.SUPPORTED`) is
inspected, hashed (SHA-256 of the file, or of the folder's files), recorded under a name in
$SPECSTEER_HOME/added.json and compiled by the same pipeline as the registry's models into
`onnx/NAME-PRECISION/` with a manifest (source hash, precision, its own chat template). From
then on the name works wherever a registry name does (`registry.get_spec`): `Client`, the
bridge, `specsteer-companion serve --generalist NAME`, `specsteer models list/verify/path`.
The file stays where the user keeps it; a compile checks that it has not changed.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from specsteer.errors import ModelError
from specsteer.models.fetch import source_sha256
from specsteer.models.manifest import read_manifest
from specsteer.models.registry import (
    PRECISIONS,
    ModelSpec,
    added,
    compiled_dir,
    packaged,
    record_added,
    registry,
)
from specsteer.models.source import ModelSource, inspect

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Added:
    """What `add_model` made: the registered name, its compiled folder, and a line on which
    compiled models share its tokenizer (a pair that does not goes through the byte-level path)."""

    spec: ModelSpec
    folder: Path
    tokenizer_note: str


def add_model(path: str | Path, *, name: str | None = None, precision: str = "int8",
              role: str = "", force: bool = False,
              progress: Callable[[str], None] | None = None) -> Added:
    """Inspect, register and compile the model at `path` (see the module docstring)."""
    from specsteer.models.compile import compile_model  # build-time imports, lazily

    source = inspect(path)
    name = name or source.default_name
    _check_name(name, source, force)
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    say = progress or (lambda _msg: None)
    say(f"{name}: {source.family} {source.kind} {source.path}, hashing it")
    spec = _spec(source, name, precision, role)
    previous = added().get(name)
    for old in PRECISIONS:  # a replaced model's folders were built from another source
        if previous is not None and compiled_dir(previous, old).is_dir():
            shutil.rmtree(compiled_dir(previous, old))
    record_added(spec)
    try:
        folder = compile_model(name, precision, force=True, progress=progress)
    except BaseException:
        record_added(previous, name)  # a failed add leaves the registry as it was
        raise
    spec = replace(spec, vocab_size=int(read_manifest(folder)["vocab_size"]))
    record_added(spec)
    return Added(spec, folder, tokenizer_note(spec.name, folder))


def _check_name(name: str, source: ModelSource, force: bool) -> None:
    if not _NAME.match(name):
        raise ModelError(f"name {name!r}: use lower-case letters, digits, '.', '_' and '-' "
                         "(at most 64), starting with a letter or digit")
    if name in packaged():
        raise ModelError(f"name {name!r} is a registry model's; give another with --name")
    known = added().get(name)
    if known is not None and not force:
        raise ModelError(f"{name!r} was already added (from {known.source}); pass --force to "
                         f"replace it with {source.path}")


def _spec(source: ModelSource, name: str, precision: str, role: str) -> ModelSpec:
    path = source.path.resolve()
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file()) if path.is_dir() \
        else path.stat().st_size
    return ModelSpec(
        name=name, title=source.title, role=role or f"added {source.kind}",
        architecture=source.family,
        chat_template="jinja" if source.chat_template else "none",
        packages=(), gguf_file=path.name if source.kind == "gguf" else "", size=size,
        sha256=source_sha256(path), vocab_size=0, default_precision=precision,
        source=str(path))


def tokenizer_note(name: str, folder: Path) -> str:
    """One line: which other compiled models share this model's tokenizer (same-tokenizer
    pairs), or that it shares none (its pairs use the byte-level path)."""
    from specsteer.runtime.folder import ModelFolder

    mine = ModelFolder.open(folder).tokenizer.vocab_hash
    same, other = [], []
    for spec in registry().values():
        if spec.name == name:
            continue
        compiled = [compiled_dir(spec, p) for p in PRECISIONS if compiled_dir(spec, p).is_dir()]
        if not compiled:
            continue
        try:
            theirs = ModelFolder.open(compiled[0]).tokenizer.vocab_hash
        except ModelError:
            continue
        (same if theirs == mine else other).append(spec.name)
    if same:
        return (f"tokenizer: the same as {', '.join(same)}: pairs with them run token by "
                "token")
    if other:
        return (f"tokenizer: differs from {', '.join(other)}: a pair with one of them runs "
                "through the byte-level path (docs/cross-tokenizer.md)")
    return "tokenizer: no other compiled model to compare with"
