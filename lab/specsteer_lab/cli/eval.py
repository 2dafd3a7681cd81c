"""`specsteer-lab eval`: run SpecSteer and the baselines on per-user data and write a report.

A thin mapping onto `specsteer_lab.eval`: load examples, load both models, run the harness with a
progress bar (ETA), then write DIR/results.jsonl, DIR/report.md, DIR/summary.json (the report's
numbers) and DIR/quality_vs_speed.png.
Re-running with the same --out resumes: rows already in results.jsonl are skipped.
Errors a user can act on become one red line and exit code 1.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from specsteer.cli import options
from specsteer.errors import SpecSteerError
from specsteer.history.prompts import DEFAULT_MIN_EXAMPLE_TOKENS
from specsteer.options import EVAL
from specsteer_lab.eval.harness import EVAL_DECODING, Companion


def register(app: typer.Typer) -> None:
    """Add the top-level `eval` command to the lab CLI."""
    app.command("eval")(eval_command)


@options.decoding(EVAL, base=EVAL_DECODING)
def eval_command(
    task: Annotated[str, typer.Option(help="Task: email, abstract, title, tweet (shared data) "
                                           "or review, topic with --data.")],
    more_methods: Annotated[list[str] | None, typer.Argument(
        hidden=True, help="Further method names after --methods (space-separated).")] = None,
    data: Annotated[Path | None, typer.Option(
        help="A LaMP/LongLaMP-format JSON list or JSONL file (default: the shared data set).")
    ] = None,
    users: Annotated[int, typer.Option(min=1, help="Evaluate the first N users.")] = 5,
    methods: Annotated[list[str] | None, typer.Option(
        help="Methods, space- or comma-separated: slm slm_rag llm speculative light_costeer "
             "costeer specsteer@1.0 specsteer@0.5 specsteer@0.1 (default: all of these); "
             "specsteer:fast runs a preset's gamma and candidate count.")
    ] = None,
    specialist: Annotated[str, typer.Option(help="Specialist: registry name or compiled folder.")
                          ] = "qwen2.5-0.5b",
    generalist: Annotated[str, typer.Option(help="Generalist: registry name or compiled folder.")
                          ] = "qwen2.5-1.5b",
    precision: Annotated[str | None, typer.Option(
        help="The Generalist's compiled precision (default: the registry's).")] = None,
    specialist_precision: Annotated[str | None, typer.Option(
        help="The Specialist's, run on the device runtime as a Client runs it (default: the "
             "precision a device runs it at, docs/models.md); P_S0 is the same artifact")
    ] = None,
    retrieve_k: Annotated[int, typer.Option(min=0, help="BM25 records in the private context."
                                            )] = 5,
    rtt_ms: Annotated[float, typer.Option(
        min=0, help="Emulated network round trip: half delays each request, half each reply.")
    ] = 0.0,
    max_prompt_tokens: Annotated[int | None, typer.Option(
        min=64, help="Budget of the private prompt (default: the task's measured budget).")
    ] = None,
    min_example_tokens: Annotated[int, typer.Option(
        min=0, help="Leave lower-ranked history examples out rather than cut one below this.")
    ] = DEFAULT_MIN_EXAMPLE_TOKENS,
    user_length: Annotated[bool, typer.Option(
        help="Every method generates within the user's length policy (min/max new tokens from "
             "the history), capped by --max-new-tokens.")] = True,
    threads: Annotated[int, typer.Option(min=1, help="ONNX Runtime threads per model.")] = 1,
    companion: Annotated[Companion, typer.Option(
        help="Where the companion runs: process (`specsteer-companion serve` in a child "
             "process over a websocket, on its own core: a deployment's timing) or thread (in "
             "this process: quicker to start, but the Generalist's passes hold the GIL, so "
             "device and companion overlap less than on two machines).")
    ] = Companion.process,
    out: Annotated[Path, typer.Option(help="Results folder (resumed when it exists).")
                   ] = Path("eval-results"),
    decoding: dict[str, Any] | None = None,
) -> None:
    """Evaluate SpecSteer and the baselines: ROUGE, acceptance, speed and bytes per token."""
    from specsteer.runtime import load_device_model, load_model
    from specsteer.runtime.folder import ModelFolder, resolve_folder
    from specsteer_lab.eval import data as data_lib
    from specsteer_lab.eval import harness as harness_lib
    from specsteer_lab.eval import report as report_lib
    from specsteer_lab.eval.harness import DEFAULT_METHODS, RESULTS, EvalConfig

    err = Console(stderr=True, soft_wrap=True, highlight=False)
    if more_methods and not methods:
        err.print(f"error: unexpected arguments {more_methods}; methods go after --methods",
                  style="red", markup=False)
        raise typer.Exit(2)
    try:
        specs = harness_lib.parse_methods([*(methods or DEFAULT_METHODS), *(more_methods or [])])
        config = EvalConfig.of(task, retrieve_k=retrieve_k, rtt_ms=rtt_ms,
                               max_prompt_tokens=max_prompt_tokens,
                               min_example_tokens=min_example_tokens, user_length=user_length,
                               **(decoding or {}))
        examples = data_lib.load_examples(task, data, users)
        err.print(f"{len(examples)} users × {len(specs)} methods; loading {specialist} and "
                  f"{generalist}", style="dim", markup=False)
        # the Specialist as a device runs it (its runtime and default precision): the speed
        # and the text are what a Client's user gets
        device = load_device_model(specialist, precision=specialist_precision, threads=threads)
        if companion is Companion.thread:
            cloud: Any = load_model(generalist, precision=precision, threads=threads)
        else:  # the companion process loads it: here its identity (name, hash, tokenizer)
            cloud = ModelFolder.open(resolve_folder(generalist, precision))
        with ExitStack() as stack:
            connect = None if companion is Companion.thread else stack.enter_context(
                harness_lib.companion_process(str(cloud.folder), str(device.folder),
                                              cloud.precision, threads, rtt_ms))
            harness = harness_lib.Harness(device, cloud, config, connect)
            harness_lib.check_run_config(out, harness_lib.run_config(
                harness, None if data is None else str(data.resolve())))
            results = out / RESULTS
            planned = {(e.user, s.label) for e in examples for s in specs}
            _run_with_progress(err, harness, examples, specs, results, planned)
        rows = [r for r in harness_lib.read_results(results)
                if harness_lib.row_key(r) in planned]
        plot = report_lib.plot_quality_vs_speed(rows, out / "quality_vs_speed.png")
        text = report_lib.render_report(rows, harness_lib.run_config(harness, None), plot.name)
        (out / "report.md").write_text(text, encoding="utf-8")
        summary = report_lib.report_json(rows, harness_lib.run_config(harness, None))
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n",
                                          encoding="utf-8")
    except SpecSteerError as exc:
        err.print(f"error: {exc}", style="red", markup=False)
        raise typer.Exit(1) from None
    typer.echo(report_lib.markdown_table(report_lib.summarize(rows)))
    typer.echo(f"\nwrote {results}, {out / 'report.md'}, {out / 'summary.json'}, {plot}")


def _run_with_progress(err: Console, harness: Any, examples: list[Any], specs: list[Any],
                       results: Path, planned: set[tuple[str, str]]) -> None:
    """Run every planned (user, method) not yet in `results`, with a progress bar and ETA (one
    line per generation when stderr is a log, not a terminal)."""
    from specsteer_lab.eval import harness as harness_lib

    already = len(planned & {harness_lib.row_key(r) for r in harness_lib.read_results(results)})
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        job = bar.add_task("evaluating", total=len(planned), completed=already)
        started, fresh = time.monotonic(), [0]

        def advance(example: Any, spec: Any, row: dict | None) -> None:
            if row is None:
                return  # counted in `already`
            bar.update(job, advance=1, description=f"{example.user[:24]} · {spec.label}")
            fresh[0] += 1
            if not err.is_terminal:  # logs get one line per generation instead of a bar
                spent = time.monotonic() - started
                left = len(planned) - already - fresh[0]
                err.print(f"[{already + fresh[0]}/{len(planned)}] {example.user} · "
                          f"{spec.label}: {row['tokens']} tokens, ROUGE-L "
                          f"{row['rougeL'] * 100:.1f}, elapsed {spent:.0f} s, ETA "
                          f"{spent / fresh[0] * left:.0f} s", markup=False)

        for _ in harness_lib.run_eval(harness, examples, specs, results, progress=advance):
            pass
