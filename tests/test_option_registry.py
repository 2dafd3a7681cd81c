"""One definition per option: every surface comes from the `Params` fields and their metadata.

A dummy option added as one field (a subclass here, the way a developer adds one to settings.py)
reaches the command-line flags, the bridge's option list and JSON schema, the TypeScript types,
the OpenAI mapping and the docs tables; the files on disk are what the registry gives (else
`./dev generate` was not run); the metadata agrees with what the wire carries.
"""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer
from helpers.ci import skip_or_fail
from typer.testing import CliRunner

from specsteer.bridge import openai_api
from specsteer.bridge.handlers import DECODING_OPTIONS
from specsteer.bridge.schemas import decoding_options_schema
from specsteer.cli import options as cli_options
from specsteer.device.rounds import session_settings
from specsteer.options import (
    BOTH,
    BRIDGE,
    COMPANION,
    DEMO,
    EVAL,
    GENERATE,
    Entry,
    entries,
    exposed,
    names,
    openai_fields,
    option,
)
from specsteer.settings import PRESET, Params

REPO = Path(__file__).resolve().parents[1]
TOOL = runpy.run_path(str(REPO / "tools" / "regenerate.py"))


@dataclass(frozen=True)
class WithDummy(Params):
    """`Params` plus one option, added the way every option is: one field."""

    dummy_option: int = option(3, "a dummy option for the registry test", minimum=0,
                               maximum=9, surfaces=frozenset({BRIDGE, GENERATE, EVAL}),
                               openai=("dummy_field",))


def test_the_files_on_disk_are_what_the_registry_gives():
    for path, text in TOOL["surfaces"]().items():
        assert (REPO / path).read_text(encoding="utf-8") == text, \
            f"{path} differs from the registry: run ./dev generate"


def test_a_dummy_option_reaches_every_surface_from_one_field(tmp_path):
    # the SDK: checked against its range like every option
    assert WithDummy().dummy_option == 3
    with pytest.raises(ValueError, match="dummy_option must be in \\[0, 9\\], not 12"):
        WithDummy(dummy_option=12)
    # the command line: a flag on the commands whose surface it names, in their help
    got: dict[str, Any] = {}

    @cli_options.decoding(GENERATE, settings=WithDummy)
    def command(request: str, decoding: dict[str, Any] | None = None) -> None:
        got.update(decoding or {})

    app = typer.Typer()
    app.command()(command)
    assert CliRunner().invoke(app, ["hi", "--dummy-option", "5"]).exit_code == 0
    assert got == {"dummy_option": 5}
    assert "--dummy-option" in CliRunner().invoke(app, ["--help"], terminal_width=200).output
    # the bridge's options and JSON schema (which the bridge validates against)
    assert "dummy_option" in names(exposed(WithDummy, BRIDGE))
    schema = decoding_options_schema(WithDummy)
    assert schema["properties"]["dummy_option"] == {
        "type": "integer", "minimum": 0, "maximum": 9, "default": 3,
        "description": "a dummy option for the registry test"}
    jsonschema.validate({"dummy_option": 9}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"dummy_option": 10}, schema)
    # the OpenAI endpoint's fields
    assert openai_fields(WithDummy)["dummy_field"] == "dummy_option"
    # the docs tables, README's and the eval's
    written = TOOL["surfaces"](settings=WithDummy)
    assert "| `dummy_option` | `3` | [0, 9] | device | bridge, `generate`, eval |" in \
        written[Path("README.md")]
    assert "| `--dummy-option` | `3` |" in written[Path("docs/eval.md")]
    # the TypeScript types, generated from that schema in a scratch copy
    common = json.loads(written[Path("bindings/schema/v1/common.json")])
    assert common["$defs"]["decoding_options"] == schema
    assert "dummy_option?: number;" in _typescript(tmp_path, written)


def _typescript(tmp_path: Path, written: dict[Path, str]) -> str:
    """What bindings/node's generator makes of the schemas with common.json as `written`."""
    node = REPO / "bindings" / "node"
    if shutil.which("node") is None or not (node / "node_modules").is_dir():
        skip_or_fail("node and bindings/node/node_modules (npm ci) are needed for the types")
    schemas = tmp_path / "schema"
    shutil.copytree(REPO / "bindings" / "schema" / "v1", schemas)
    (schemas / "common.json").write_text(written[Path("bindings/schema/v1/common.json")],
                                         encoding="utf-8")
    script = ("import('./scripts/generate-types.mjs').then(m => m.generate(process.argv[1]))"
              ".then(s => process.stdout.write(s))")
    done = subprocess.run(["node", "--input-type=module", "-e", script, str(schemas)], cwd=node,
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def test_the_live_surfaces_read_the_registry():
    """No surface keeps a list of its own: each is what the registry says of it."""
    assert (PRESET.name, *names(exposed(Params, BRIDGE))) == DECODING_OPTIONS
    assert openai_fields(Params) == {k: v for k, v in openai_api.MAPPED.items() if k != "stop"}
    from specsteer.cli import app as device_app
    from specsteer_lab.cli import app as lab_app

    for app, command, surface in ((device_app, "generate", GENERATE),
                                  (lab_app, "eval", EVAL), (lab_app, "demo", DEMO)):
        flags = _flags(app, command)
        for entry in (PRESET, *exposed(Params, surface)):
            if surface in entry.option.surfaces:
                assert f"--{entry.name.replace('_', '-')}" in flags, (command, entry.name)


def _flags(app: typer.Typer, name: str) -> set[str]:
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {flag for param in command.params for flag in (*param.opts, *param.secondary_opts)}


def test_one_name_per_option():
    """The names an earlier release used are gone from every surface, and refused with the
    one to use (`RENAMED`)."""
    from specsteer.settings import RENAMED

    every = {e.name for e in entries(Params)}
    assert not every & set(RENAMED)
    for old, new in RENAMED.items():
        with pytest.raises(ValueError, match=f"{old} is now {new.split()[0]}"):
            Params.preset(None, **{old: 1})


def _other(entry: Entry) -> Any:
    """A valid value of `entry` other than its default."""
    meta, default = entry.option, entry.default
    if meta.choices:
        return next(c for c in meta.choices if c != default)
    if entry.is_phrases:
        return ("zz",)
    if entry.base_type is bool:
        return True if default is None else not default
    if isinstance(default, float):
        return default / 2 if default > 0 else default + 0.5
    value = default + 2  # an int: 2 also turns an off (0) n-gram rule on
    return value if meta.maximum is None or value <= meta.maximum else default - 1


def test_scope_says_what_crosses_the_wire():
    """An option scoped `companion` or `both` changes the session settings the device sends;
    a `device` one never does."""

    class _Link:
        hello_ok = None

    base = Params()
    for entry in entries(Params):
        changed = replace(base, **{entry.name: _other(entry)})
        sent = session_settings(changed, _Link()) != session_settings(base, _Link())  # type: ignore[arg-type]
        assert sent == (entry.option.scope in (COMPANION, BOTH)), entry.name
