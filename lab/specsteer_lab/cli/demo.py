"""`specsteer-lab demo`: the main job, a real email in a sender's voice via SDK + companion.

A thin command over `specsteer_lab.demo` (models, the sender's history store) and
`specsteer_companion.process` (the companion subprocess); the generation is streamed and
tabulated exactly as `specsteer generate` does. Errors a user can act on become one red line
and exit code 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from specsteer.cli import options
from specsteer.cli.generate import console, legend, print_stream, stats_table
from specsteer.errors import SpecSteerError
from specsteer.options import DEMO
from specsteer.settings import Params


def register(app: typer.Typer) -> None:
    """Add the top-level `demo` command to the lab CLI."""
    app.command("demo")(demo_command)


# Cold by default: with a warm start the first ~17 tokens for the persona were the Generalist's
# "Subject: Bulb Planting Day / Dear Growers, I hope this message finds you well" and the letter
# went on in that template; cold, it opens "Hi," and signs as Wren (docs/BENCHMARKS.md, issue 14
# second pass). 96 tokens: the persona's letter with its sign-off.
DEMO_DECODING = Params(max_new_tokens=96, warm_start=False)


@options.decoding(DEMO, base=DEMO_DECODING)
def demo_command(
    user: Annotated[int, typer.Option(help="Sender index in the --data newsgroups set")] = 0,
    data: Annotated[
        Path | None,
        typer.Option(help="A newsgroups data set (newsgroups_top100_senders.json) to write as one "
                          "of its senders (--user); default: the persona in sample_apps/data"),
    ] = None,
    specialist: Annotated[str, typer.Option()] = "qwen2.5-0.5b",
    generalist: Annotated[str, typer.Option()] = "qwen2.5-1.5b",
    precision: Annotated[str, typer.Option(help="The Generalist's compiled precision")] = "int8",
    specialist_precision: Annotated[str | None, typer.Option(
        help="The Specialist's (default: the one a device runs it at, docs/models.md); the "
             "companion's P_S0 is the same artifact")] = None,
    # 640, not the email task's 768: the persona's letter at 768 (one more example in the
    # prompt) repeats a line until the token limit and loses its sign-off (measured, greedy)
    max_prompt_tokens: Annotated[
        int, typer.Option(help="Private prompt budget (its prefill is the slow part on a "
                                      "CPU); 0 = the task's, as a Client chooses it")
    ] = 640,
    decoding: dict[str, Any] | None = None,
) -> None:
    """The main job: a real email in a sender's voice via SDK + companion on real models."""
    from specsteer.client import Client
    from specsteer.runtime import load_device_model
    from specsteer_companion.process import start_companion
    from specsteer_lab import demo as demo_lib

    say = lambda msg: console.print(f"[dim]{msg}[/dim]")  # noqa: E731
    try:
        device_precision = demo_lib.device_precision(specialist, specialist_precision)
        demo_lib.prepare_models([(specialist, device_precision), (generalist, precision)], say)
        if data is None:
            store, query, gold = demo_lib.persona_store(), demo_lib.PERSONA_QUERY, None
            say(f"history: {len(store)} notes and sent emails of the persona (sample_apps/data)")
        else:
            store, shared = demo_lib.user_store(data, user)
            query, gold = shared.query, shared.gold
            say(f"history: {len(store)} earlier posts of {shared.user}")
        say("starting the companion (loads the Generalist and the generic Specialist)...")
        proc, url = start_companion(generalist, specialist, precision,
                                    args=["--specialist-precision", device_precision])
        try:
            # the device runs the very artifact the companion serves as P_S0
            client = Client(
                load_device_model(specialist, precision=device_precision), history=store,
                companion=url,
                max_prompt_tokens=max_prompt_tokens or None,
            )
            where = query.get("newsgroup") or query.get("to") or "?"
            console.print(f"[bold]Subject:[/bold] {query.get('subject')}  [dim]({where})[/dim]")
            console.print(legend())
            # --warm-start asks for one whatever the prefill is estimated at; the stats say
            # where the wait went
            given = dict(decoding or {})
            if given.get("warm_start"):
                given.setdefault("warm_start_min_s", 0.0)
            settings = options.settings_from(given, DEMO_DECODING)
            result = print_stream(client, query, "email", {"settings": settings})
            console.print(stats_table(result))
            if gold is not None:
                console.print("[bold]What the user really wrote (first 400 chars):[/bold]")
                console.print(gold[:400], markup=False)
        finally:
            proc.terminate()
            proc.wait(10)
    except SpecSteerError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
