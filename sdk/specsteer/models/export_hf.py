"""`specsteer models export-hf`: a registry model as a Hugging Face folder for serving engines.

vLLM (the companion's Generalist engine, `specsteer_companion.vllm_engine`) loads HF folders,
not GGUF files nor ONNX Runtime ones. This writes the registry GGUF dequantized to a plain
safetensors folder at a stated dtype (bf16 by default: what a GPU serves, half of fp32's
memory), without the GGUF quantization marker transformers leaves in `config.json` (vLLM:
"Unknown quantization method: gguf"), with the architecture named, plus a `specsteer.json`
manifest (name, dtype, source GGUF hash, artifact hash) so the companion can state which
weights it serves. Built in a temporary folder and renamed into place, like `compile`.
Build time only (torch, transformers: the `compile` extra); nothing touches a hub.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from specsteer.errors import ModelError, ModelNotFetched
from specsteer.models.fetch import verify
from specsteer.models.manifest import MANIFEST, folder_digest
from specsteer.models.registry import get_spec, gguf_path, home

DTYPES = ("bfloat16", "float16", "float32", "w8a8")
DEFAULT_DTYPE = "bfloat16"


def hf_dir(name: str, dtype: str = DEFAULT_DTYPE) -> Path:
    """Where the HF folder of registry model `name` at `dtype` lives in the cache."""
    return home() / "hf" / f"{get_spec(name).name}-{dtype}"


def export_hf_folder(
    name: str,
    dtype: str = DEFAULT_DTYPE,
    *,
    out: Path | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write registry model `name` as an HF folder at `dtype`; return the folder."""
    from specsteer.models.compile import _run_step

    if dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    spec = get_spec(name)
    say = progress or (lambda _msg: None)
    dest = Path(out) if out is not None else hf_dir(name, dtype)
    if (dest / MANIFEST).is_file() and not force:
        say(f"{spec.name} {dtype}: already exported at {dest}")
        return dest
    if dest.exists() and not (dest / MANIFEST).is_file() and any(dest.iterdir()) and not force:
        raise ModelError(f"{dest} exists and is not an export of ours; pass --force to replace it")
    gguf = gguf_path(spec)
    if not gguf.exists():
        raise ModelNotFetched(
            f"{spec.name} is not fetched; run `specsteer models fetch {spec.name}`")
    verify(spec, gguf)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    log = dest.parent / f"{dest.name}.log"
    log.write_text("")
    try:
        started = time.monotonic()
        say(f"{spec.name}: dequantizing the GGUF to {dtype} with transformers (log: {log})")
        _run_step([sys.executable, "-m", "specsteer.models.compile", "export", str(gguf),
                   str(work / "hf"), "--dtype", dtype], log, "GGUF export")
        write_hf_manifest(work / "hf", name=spec.name, dtype=dtype, source_sha256=spec.sha256,
                          architecture=spec.architecture, chat_template=spec.chat_template,
                          export_seconds=round(time.monotonic() - started, 1))
        if dest.exists():
            shutil.rmtree(dest)
        (work / "hf").replace(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"{spec.name} {dtype}: exported to {dest}")
    return dest


def write_hf_manifest(folder: Path, **fields: object) -> dict:
    """Record `fields`, the file sizes and the artifact hash of an HF folder."""
    config = json.loads((folder / "config.json").read_text())
    manifest = {
        "format": "hf",
        "vocab_size": config.get("vocab_size"),
        **fields,
        "files": {p.name: p.stat().st_size for p in sorted(folder.iterdir())
                  if p.is_file() and p.name != MANIFEST},
        "artifact_sha256": folder_digest(folder),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest
