"""The `specsteer.json` manifest of a compiled model folder: identity and integrity.

Written by `compile` (and by the tiny test-model builder), read by every runtime at load time.
The artifact hash is what the device and the companion compare, so that P_S0 and P_Sc come from
the very same compiled files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specsteer.errors import CorruptModelError, ModelNotCompiled

MANIFEST = "specsteer.json"
MANIFEST_VERSION = 1


def folder_digest(folder: Path) -> str:
    """SHA-256 over the names and bytes of every model file (the manifest itself excluded)."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.name == MANIFEST or not path.is_file():
            continue
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path, **fields: Any) -> dict:
    """Record sizes, the artifact hash and `fields` (name, precision, vocab_size...) in `folder`."""
    genai = json.loads((folder / "genai_config.json").read_text())["model"]
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "vocab_size": genai["vocab_size"],
        "context_length": genai["context_length"],
        **fields,
        "files": {
            p.name: p.stat().st_size
            for p in sorted(folder.iterdir())
            if p.is_file() and p.name != MANIFEST
        },
        "artifact_sha256": folder_digest(folder),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def read_manifest(folder: Path) -> dict:
    """The manifest of a compiled folder, or a clear error saying how to make one."""
    if not folder.is_dir():
        raise ModelNotCompiled(f"{folder} does not exist; run `specsteer models compile NAME`")
    path = folder / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelNotCompiled(
            f"{folder} has no {MANIFEST}: it was not made by `specsteer models compile`"
        ) from None
    except json.JSONDecodeError as exc:
        raise CorruptModelError(f"{path} is damaged ({exc}); recompile the model") from exc


def check_files(folder: Path, manifest: dict, *, full_hash: bool = False) -> None:
    """Every recorded file present with its size (cheap); optionally the full artifact hash."""
    for name, size in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            raise CorruptModelError(f"{path} is missing; recompile the model with --force")
        if path.stat().st_size != size:
            raise CorruptModelError(
                f"{path} has {path.stat().st_size} bytes, expected {size}: truncated or damaged; "
                "recompile the model with --force"
            )
    if full_hash and folder_digest(folder) != manifest["artifact_sha256"]:
        raise CorruptModelError(f"{folder} does not match its recorded artifact hash; recompile")
