"""`specsteer-companion serve`'s address, limit and engine flags come from the fields of
`ServerConfig` and `VllmOptions` (issue 27): a flagged field is a flag with the field's
default, and what is given arrives under the field's name, so a new field needs no CLI edit."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer
from typer.testing import CliRunner

from specsteer_companion.admission import ServerConfig
from specsteer_companion.cli import app
from specsteer_companion.cli_flags import fields_flag_group, flag
from specsteer_companion.vllm_engine import CPU_LONG_PREFILL, CPU_STEP_TOKENS, VllmOptions


@dataclasses.dataclass(frozen=True)
class Knobs:
    depth: int = dataclasses.field(default=3, metadata=flag("--depth", "How deep", min=1))
    mode: str | None = dataclasses.field(default=None, metadata=flag("--knob-mode", "Mode"))
    fast: bool | None = dataclasses.field(default=None, metadata=flag("--fast/--slow", "Speed"))
    hidden: float = 1.5  # no flag: a choice made in code


def _command() -> tuple[typer.Typer, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    scratch = typer.Typer()

    @scratch.command()
    @fields_flag_group("knobs", Knobs, "Knobs")
    def run(name: str = "x", knobs: dict[str, Any] | None = None) -> None:
        seen.append({"name": name, **(knobs or {})})
        Knobs(**(knobs or {}))  # what the command builds from them

    return scratch, seen


def test_a_flagged_field_is_a_flag_with_its_default_and_arrives_under_its_name() -> None:
    scratch, seen = _command()
    runner = CliRunner()
    assert runner.invoke(scratch, []).exit_code == 0
    assert seen[-1] == {"name": "x", "depth": 3, "mode": None, "fast": None}
    result = runner.invoke(scratch, ["--depth", "7", "--knob-mode", "m", "--slow", "--name", "y"])
    assert result.exit_code == 0, result.output
    assert seen[-1] == {"name": "y", "depth": 7, "mode": "m", "fast": False}
    refused = runner.invoke(scratch, ["--depth", "0"])
    assert refused.exit_code == 2 and "--depth" in refused.output  # the field's min=
    assert runner.invoke(scratch, ["--hidden", "2"]).exit_code == 2  # unflagged: no flag
    shown = runner.invoke(scratch, ["--help"]).output
    assert "How deep" in shown and "Knobs" in shown


def test_serve_offers_every_flagged_field_of_its_dataclasses_with_the_same_default() -> None:
    params = {p.name: p for p in typer.main.get_command(app).commands["serve"].params}
    for kind in (ServerConfig, VllmOptions):
        flagged = [f for f in dataclasses.fields(kind) if "flag" in f.metadata]
        assert len(flagged) >= 10, kind
        for field in flagged:
            param = params[field.name]
            assert param.default == field.default, field.name
            assert field.metadata["flag"][0].split("/")[0] in param.opts, field.name


def test_a_w8a8_folder_runs_at_fp32_around_the_int8_kernel_on_a_cpu_only():
    """vLLM has no dtype "w8a8": the folder's config names the scheme, and the engine's dtype
    is what the rest runs at: fp32 on a CPU (its "auto" picks bf16, emulated there), the
    engine's own choice on a GPU; any other dtype goes to the engine as given."""
    w8a8 = VllmOptions(model="folder", dtype="w8a8")
    assert w8a8.engine_args(on_cpu=True)["dtype"] == "float32"
    assert w8a8.engine_args(on_cpu=False)["dtype"] == "auto"
    for dtype in ("auto", "bfloat16", "float32"):
        assert VllmOptions(model="folder", dtype=dtype).engine_args(on_cpu=True)["dtype"] == dtype


def test_the_engine_serves_rounds_first_and_keeps_a_cpus_steps_short():
    """vLLM's priority scheduling (rounds before openings) everywhere; on a CPU a step of at
    most `CPU_STEP_TOKENS`, of which one opening takes at most `CPU_LONG_PREFILL`, so that no
    round waits behind a long prefill (docs/BENCHMARKS.md, the vLLM section's run 4); on a GPU
    vLLM's own step sizes; what is given goes to the engine as given."""
    cpu = VllmOptions(model="folder").engine_args(on_cpu=True)
    assert cpu["scheduling_policy"] == "priority"
    assert (cpu["max_num_batched_tokens"], cpu["long_prefill_token_threshold"]) == (
        CPU_STEP_TOKENS, CPU_LONG_PREFILL)
    gpu = VllmOptions(model="folder").engine_args(on_cpu=False)
    assert gpu["scheduling_policy"] == "priority"
    assert "max_num_batched_tokens" not in gpu and "long_prefill_token_threshold" not in gpu
    given = VllmOptions(model="folder", max_num_batched_tokens=1024, long_prefill=300,
                        rounds_first=False)
    for on_cpu in (True, False):
        args = given.engine_args(on_cpu=on_cpu)
        assert (args["max_num_batched_tokens"], args["long_prefill_token_threshold"],
                args["scheduling_policy"]) == (1024, 300, "fcfs")
