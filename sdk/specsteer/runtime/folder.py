"""What every runtime reads from a compiled folder, and the checks every session applies.

Both runtimes (ONNX Runtime GenAI in `onnx`, raw ONNX Runtime in `ort_batched`) load the same
compiled folders, so they must agree on identity (manifest, artifact hash), tokenizer, id checks
and error messages; keeping them here means a device and a batching companion can never differ
on what a folder is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specsteer.errors import CorruptModelError, ModelNotCompiled, SessionError
from specsteer.models.manifest import check_files, read_manifest
from specsteer.models.registry import compiled_dir, get_spec
from specsteer.models.w8a8 import cpu_refusal, is_current
from specsteer.tokenizer import Tokenizer

DEFAULT_MAX_LENGTH = 4096


@dataclass
class ModelFolder:
    """Identity of a compiled folder: manifest fields, tokenizer and the GenAI model config."""

    folder: Path
    manifest: dict
    name: str
    precision: str
    sha256: str
    vocab_size: int
    context_length: int
    tokenizer: Tokenizer
    genai: dict  # the "model" section of genai_config.json (layer count, input/output names)

    @classmethod
    def open(cls, folder: str | Path, *, verify: bool = False) -> ModelFolder:
        """Read and check a folder (sizes always; the full artifact hash when `verify`)."""
        path = Path(folder)
        manifest = read_manifest(path)
        check_files(path, manifest, full_hash=verify)
        if (refusal := cpu_refusal(manifest)) is not None:
            raise ModelNotCompiled(f"{path}: {refusal}")
        genai = json.loads((path / "genai_config.json").read_text())["model"]
        eos = genai.get("eos_token_id", [])
        eos_ids = eos if isinstance(eos, list) else [eos]
        tokenizer = Tokenizer.from_folder(
            path, chat_template=manifest.get("chat_template", "chatml"), eos_ids=eos_ids
        )
        return cls(
            folder=path,
            manifest=manifest,
            name=manifest["name"],
            precision=manifest["precision"],
            sha256=manifest["artifact_sha256"],
            vocab_size=int(manifest["vocab_size"]),
            context_length=int(manifest["context_length"]),
            tokenizer=tokenizer,
            genai=genai,
        )

    def load_error(self, exc: Exception) -> CorruptModelError:
        """The error for a graph ONNX Runtime refused, with the command that fixes it."""
        return CorruptModelError(
            f"ONNX Runtime could not load {self.folder}: {exc}; recompile it with "
            f"`specsteer models compile {self.name} --precision {self.precision} --force`"
        )

    @property
    def sliding_window(self) -> int:
        """Local attention window (Gemma-3 layers), 0 when every layer attends globally."""
        window = self.genai.get("decoder", {}).get("sliding_window") or {}
        return int(window.get("window_size", 0))

    def session_length(self, max_length: int | None) -> int:
        """A session's token bound: `max_length` (default 4096), at most the context window.

        Never below the sliding window: ONNX Runtime refuses a KV cache smaller than it.
        """
        wanted = max(max_length or DEFAULT_MAX_LENGTH, self.sliding_window)
        return min(wanted, self.context_length)


def check_ids(ids: object, vocab_size: int, length: int, max_length: int) -> np.ndarray:
    """Ids as a flat int array, or a SessionError saying why they cannot be appended."""
    tokens = np.asarray(ids, dtype=np.int64).reshape(-1)
    if tokens.size == 0:
        raise SessionError("append needs at least one token id")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise SessionError(
            f"token ids must lie in [0, {vocab_size}); got {tokens.min()}..{tokens.max()}"
        )
    if length + tokens.size > max_length:
        raise SessionError(
            f"session would hold {length + tokens.size} tokens, over its max_length "
            f"{max_length}; open the session with a larger max_length"
        )
    return tokens


def check_rewind(length: int, held: int) -> None:
    """Rewinding may only drop tokens."""
    if not 0 <= length <= held:
        raise SessionError(f"cannot rewind to {length}: session holds {held} tokens")


def resolve_folder(name_or_folder: str | Path, precision: str | None, *,
                   device: bool = False) -> Path:
    """A compiled folder by path, or a registry model's folder at `precision` (default: its
    own; `device`: the one a device runs it at, `ModelSpec.device_default`)."""
    path = Path(name_or_folder)
    if path.is_dir():
        return path
    spec = get_spec(str(name_or_folder))
    precision = precision or (spec.device_default if device else spec.default_precision)
    folder = compiled_dir(spec, precision)
    if not folder.exists():
        raise ModelNotCompiled(
            f"{spec.name} is not compiled at {precision}; run `specsteer models fetch "
            f"{spec.name} && specsteer models compile {spec.name} --precision {precision}`"
        )
    if precision == "w8a8" and not is_current(read_manifest(folder)):
        raise ModelNotCompiled(
            f"{spec.name} at w8a8 was rewritten by an older SDK (docs/models.md); run "
            f"`specsteer models compile {spec.name} --precision w8a8` (seconds: it rewrites "
            "the int8 folder again)"
        )
    return folder


class FolderModel:
    """What every runtime's model exposes about its compiled folder (the seam's identity part)."""

    def __init__(self, folder: str | Path, *, verify: bool = False) -> None:
        info = ModelFolder.open(folder, verify=verify)
        self.info = info
        self.folder = info.folder
        self.manifest = info.manifest
        self.name: str = info.name
        self.precision: str = info.precision
        self.sha256: str = info.sha256
        self.vocab_size: int = info.vocab_size
        self.context_length: int = info.context_length
        self.tokenizer = info.tokenizer

    @property
    def weight_bytes(self) -> int:
        """Bytes of the graph and its weights (about the parameter count at int8)."""
        return sum(f.stat().st_size for f in self.folder.iterdir() if ".onnx" in f.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.precision}, sha256={self.sha256[:12]})"

