"""ONNX Runtime GenAI implementation of the runtime seam.

One `onnxruntime_genai.Model` per loaded folder; each `OnnxSession` is a `Generator` with its own
KV cache. `append` returns the logits of every appended position and `rewind` is the generator's
exact `rewind_to`, so rejected drafts cost no recomputation of the kept prefix.
Threads default to 1: two model processes spinning on a 2-core machine collapse.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

from specsteer.errors import CorruptModelError, ModelNotCompiled, SessionError
from specsteer.models.manifest import check_files, read_manifest
from specsteer.models.registry import compiled_dir, get_spec
from specsteer.tokenizer import Tokenizer

DEFAULT_MAX_LENGTH = 4096


class OnnxSession:
    """One sequence with its own KV cache (a GenAI generator)."""

    def __init__(self, model: OnnxModel, max_length: int) -> None:
        params = og.GeneratorParams(model.og_model)
        params.set_search_options(max_length=max_length)
        self._generator = og.Generator(model.og_model, params)
        self._model = model
        self._length = 0
        self.max_length = max_length

    @property
    def length(self) -> int:
        return self._length

    def append(self, ids: Sequence[int]) -> np.ndarray:
        tokens = np.asarray(ids, dtype=np.int32).reshape(-1)
        if tokens.size == 0:
            raise SessionError("append needs at least one token id")
        if tokens.min() < 0 or tokens.max() >= self._model.vocab_size:
            raise SessionError(
                f"token ids must lie in [0, {self._model.vocab_size}); "
                f"got {tokens.min()}..{tokens.max()}"
            )
        if self._length + tokens.size > self.max_length:
            raise SessionError(
                f"session would hold {self._length + tokens.size} tokens, over its max_length "
                f"{self.max_length}; open the session with a larger max_length"
            )
        self._generator.append_tokens(tokens)
        self._length += int(tokens.size)
        logits = self._generator.get_output("logits")
        return np.array(logits.reshape(-1, logits.shape[-1])[-tokens.size :], dtype=np.float32)

    def rewind(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise SessionError(f"cannot rewind to {length}: session holds {self._length} tokens")
        if length == self._length:
            return
        self._generator.rewind_to(length)
        self._length = length

    def close(self) -> None:
        self._generator = None  # type: ignore[assignment]


class OnnxModel:
    """A compiled model folder loaded into ONNX Runtime GenAI."""

    def __init__(self, folder: str | Path, *, threads: int = 1, verify: bool = False) -> None:
        self.folder = Path(folder)
        manifest = read_manifest(self.folder)
        check_files(self.folder, manifest, full_hash=verify)
        self.manifest = manifest
        self.name: str = manifest["name"]
        self.precision: str = manifest["precision"]
        self.sha256: str = manifest["artifact_sha256"]
        self.vocab_size: int = int(manifest["vocab_size"])
        self.context_length: int = int(manifest["context_length"])
        genai = json.loads((self.folder / "genai_config.json").read_text())["model"]
        eos = genai.get("eos_token_id", [])
        eos_ids = eos if isinstance(eos, list) else [eos]
        self.tokenizer = Tokenizer.from_folder(
            self.folder, chat_template=manifest.get("chat_template", "chatml"), eos_ids=eos_ids
        )
        config = og.Config(str(self.folder))
        config.clear_providers()
        options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        try:
            self.og_model = og.Model(config)
        except Exception as exc:  # onnxruntime_genai raises bare RuntimeError/OrtException
            raise CorruptModelError(
                f"ONNX Runtime could not load {self.folder}: {exc}; recompile it with "
                f"`specsteer models compile {self.name} --precision {self.precision} --force`"
            ) from exc
        self.threads = threads

    def new_session(self, max_length: int | None = None) -> OnnxSession:
        """An empty session; `max_length` bounds its KV cache (default 4096, at most the window)."""
        length = min(max_length or DEFAULT_MAX_LENGTH, self.context_length)
        return OnnxSession(self, length)

    def __repr__(self) -> str:
        return f"OnnxModel({self.name!r}, {self.precision}, sha256={self.sha256[:12]})"


def load_model(
    name_or_folder: str | Path,
    *,
    precision: str | None = None,
    threads: int = 1,
    verify: bool = False,
) -> OnnxModel:
    """Load a registry model by name (compiled at `precision`) or any compiled folder by path."""
    path = Path(name_or_folder)
    if path.is_dir():
        return OnnxModel(path, threads=threads, verify=verify)
    spec = get_spec(str(name_or_folder))
    folder = compiled_dir(spec, precision or spec.default_precision)
    if not folder.exists():
        raise ModelNotCompiled(
            f"{spec.name} is not compiled at {precision or spec.default_precision}; run "
            f"`specsteer models fetch {spec.name} && specsteer models compile {spec.name}`"
        )
    return OnnxModel(folder, threads=threads, verify=verify)
