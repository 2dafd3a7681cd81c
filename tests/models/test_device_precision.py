"""The precision a device runs the registry's Specialist at, and every part that must agree on it.

w8a8 (int8 activations) prefills about 2.8x int8 on one core; it became the device default after
its fidelity run (docs/BENCHMARKS.md, "The device's precision") on CPUs with VNNI, where its
+-127 weights are exact; elsewhere the +-63 weights put the texts below int8's, and a device
runs int8. The companion's P_S0 must be the devices' very artifact, so the companion, the Ray
replicas and the demo resolve it the same way.
"""

from __future__ import annotations

import pytest

from specsteer.errors import ModelNotCompiled
from specsteer.models import w8a8
from specsteer.models.registry import compiled_dir, get_spec, packaged
from specsteer.runtime.folder import resolve_folder
from specsteer_companion.ray_config import parse_config
from specsteer_lab import demo as demo_lib


@pytest.fixture
def vnni(monkeypatch):
    """This CPU as one with VNNI (w8a8's +-127 weights exact), whatever the test machine has."""
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: True)


@pytest.fixture
def no_vnni(monkeypatch):
    """This CPU as one without VNNI (AVX2 only, Apple's or any other that Linux's flags do not
    name), whatever the test machine has."""
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: False)


@pytest.mark.parametrize("has_vnni", [True, False])
def test_the_registry_specialist_runs_at_w8a8_on_a_vnni_device_and_int8_elsewhere(
        monkeypatch, has_vnni):
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: has_vnni)
    spec = get_spec("qwen2.5-0.5b")
    assert spec.device_default == ("w8a8" if has_vnni else "int8")
    assert spec.default_precision == "int8"  # the companion's Generalist-side default is kept
    # only the measured model changed: every other model runs on a device at its own default
    others = {name: s.device_default for name, s in packaged().items() if name != spec.name}
    assert others == {name: s.default_precision for name, s in packaged().items()
                      if name != spec.name}


def test_without_vnni_a_device_loads_the_int8_folder_by_name(no_vnni, monkeypatch, tmp_path):
    """What a Client given the name runs on such a CPU: the int8 folder, though a w8a8 one
    (+-63, exact there but further from int8's texts) is compiled beside it."""
    import shutil

    from specsteer.models.tiny import tiny_model_dir
    from specsteer.runtime import load_device_model

    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    spec = get_spec("qwen2.5-0.5b")
    int8, folder = compiled_dir(spec, "int8"), compiled_dir(spec, "w8a8")
    shutil.copytree(tiny_model_dir("llama", seed=0), int8)  # stands in for the compiled int8
    from specsteer.models.compile import compile_model

    compile_model("qwen2.5-0.5b", "w8a8")
    assert folder.is_dir()
    assert resolve_folder("qwen2.5-0.5b", None, device=True) == int8
    model = load_device_model("qwen2.5-0.5b")
    assert model.info.folder == int8
    assert load_device_model("qwen2.5-0.5b", precision="w8a8").info.folder == folder  # asked


def test_a_device_asks_for_the_w8a8_folder_and_says_how_to_build_it(vnni, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    with pytest.raises(ModelNotCompiled, match="--precision w8a8"):
        resolve_folder("qwen2.5-0.5b", None, device=True)
    with pytest.raises(ModelNotCompiled, match="--precision int8"):
        resolve_folder("qwen2.5-0.5b", None)  # not a device: the registry's own default
    with pytest.raises(ModelNotCompiled, match="--precision int8"):
        resolve_folder("qwen2.5-0.5b", "int8", device=True)  # asked for: kept


def test_the_demo_runs_the_device_default_unless_asked(monkeypatch):
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: True)
    assert demo_lib.device_precision("qwen2.5-0.5b", None) == "w8a8"
    assert demo_lib.device_precision("qwen2.5-0.5b", "int8") == "int8"
    assert demo_lib.device_precision("qwen2.5-1.5b", None) == "int8"
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: False)
    assert demo_lib.device_precision("qwen2.5-0.5b", None) == "int8"
    assert demo_lib.device_precision("qwen2.5-0.5b", "w8a8") == "w8a8"  # asked: kept


def test_ray_replicas_load_the_devices_artifact_as_p_s0(vnni, monkeypatch, tmp_path):
    from specsteer.models.tiny import tiny_model_dir
    from specsteer_companion.ray_app import _load_verifier

    generalist = str(tiny_model_dir("llama", seed=1))  # built in the real cache first
    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))  # no Qwen folder compiled
    models = {"generalist": generalist, "specialist": "qwen2.5-0.5b"}
    config = parse_config({"models": models, "open_access": True})
    assert config.models.specialist_precision is None
    with pytest.raises(ModelNotCompiled, match="--precision w8a8"):  # what devices run
        _load_verifier(config)
    config = parse_config({"models": {**models, "specialist_precision": "int8"},
                           "open_access": True})
    with pytest.raises(ModelNotCompiled, match="--precision int8"):  # asked for: kept
        _load_verifier(config)


def test_the_sample_apps_run_the_device_default(vnni, monkeypatch, tmp_path):
    import sys
    from pathlib import Path

    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "sample_apps"))
    sys.modules.pop("companion", None)
    from companion import models

    generalist = compiled_dir(get_spec("qwen2.5-1.5b"), "int8")
    int8, w8a8_folder = (compiled_dir(get_spec("qwen2.5-0.5b"), p) for p in ("int8", "w8a8"))
    for folder in (generalist, int8):
        folder.mkdir(parents=True)
    with pytest.raises(SystemExit, match="qwen2.5-0.5b"):  # its int8 folder is not the one
        models(tiny=False)
    w8a8_folder.mkdir(parents=True)
    assert models(tiny=False) == (str(w8a8_folder), str(generalist))
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: False)  # the same cache on such a CPU
    assert models(tiny=False) == (str(int8), str(generalist))


def test_an_older_sdks_w8a8_folder_is_refused_by_name_and_compile_rewrites_it(vnni, monkeypatch,
                                                                              tmp_path):
    """A w8a8 folder from an earlier rewrite (version 1: seven elementwise passes a layer,
    ~30 % slower prefill) computes the same function, so nothing would say it is stale: a
    device loading it by name is told to recompile, and `models compile` rewrites it from the
    int8 folder (no GGUF needed) instead of calling it compiled."""
    import shutil

    from specsteer.models.compile import compile_model
    from specsteer.models.manifest import read_manifest, write_manifest
    from specsteer.models.tiny import tiny_model_dir

    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    spec = get_spec("qwen2.5-0.5b")
    int8, folder = compiled_dir(spec, "int8"), compiled_dir(spec, "w8a8")
    shutil.copytree(tiny_model_dir("llama", seed=0), int8)  # stands in for the compiled int8
    w8a8.rewrite_folder(int8, folder)
    old = "onnxruntime-genai 0.18.0 int8 + specsteer w8a8 rewrite"  # what version 1 wrote
    write_manifest(folder, name=spec.name, precision="w8a8", chat_template="chatml",
                   builder=old)
    with pytest.raises(ModelNotCompiled, match="older SDK.*compile qwen2.5-0.5b --precision w8a8"):
        resolve_folder("qwen2.5-0.5b", None, device=True)
    said: list[str] = []
    assert compile_model("qwen2.5-0.5b", "w8a8", progress=said.append) == folder
    assert any("older SDK's rewrite" in line for line in said)
    assert w8a8.is_current(read_manifest(folder))
    assert resolve_folder("qwen2.5-0.5b", None, device=True) == folder
    said.clear()
    compile_model("qwen2.5-0.5b", "w8a8", progress=said.append)  # current now: kept as it is
    assert any("already compiled" in line for line in said), said


def test_compile_rewrites_with_the_weights_this_cpu_multiplies_exactly(monkeypatch, tmp_path):
    """+-127 weights on a VNNI CPU, +-63 elsewhere, recorded in the manifest; a folder made
    for VNNI is rewritten by `models compile` on a CPU without it (and refused at load)."""
    import shutil

    from specsteer.models.compile import compile_model
    from specsteer.models.manifest import read_manifest
    from specsteer.models.tiny import tiny_model_dir

    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    spec = get_spec("qwen2.5-0.5b")
    int8, folder = compiled_dir(spec, "int8"), compiled_dir(spec, "w8a8")
    shutil.copytree(tiny_model_dir("llama", seed=0), int8)  # stands in for the compiled int8
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: True)
    compile_model("qwen2.5-0.5b", "w8a8")
    assert read_manifest(folder)[w8a8.LEVELS_FIELD] == 127
    assert resolve_folder("qwen2.5-0.5b", None, device=True) == folder
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: False)  # the folder carried elsewhere
    from specsteer.runtime.folder import ModelFolder

    with pytest.raises(ModelNotCompiled, match="VNNI"):
        ModelFolder.open(folder)
    said: list[str] = []
    compile_model("qwen2.5-0.5b", "w8a8", progress=said.append)
    assert any("for a CPU with VNNI" in line for line in said), said
    assert read_manifest(folder)[w8a8.LEVELS_FIELD] == 63
    ModelFolder.open(folder)
