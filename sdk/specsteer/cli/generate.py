"""`specsteer generate`: a thin command over `Client`, streaming tokens coloured by provenance.

The stream and stats rendering (`legend`, `print_stream`, `stats_table`) is public so other
command lines over `Client` (the lab's `specsteer-lab demo`) show generations the same way.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from specsteer.cli import options
from specsteer.client import NO_TOKEN, Client, GenerationStats, Result
from specsteer.errors import SpecSteerError
from specsteer.options import GENERATE

COLOURS = {
    "draft": "green",
    "recovered": "yellow",
    "bonus": "cyan",
    "generalist": "magenta",
    "local": "white",
}
console = Console(highlight=False)


def legend() -> str:
    """One line of Rich markup naming each provenance in its colour."""
    return "  ".join(f"[{c}]{name}[/{c}]" for name, c in COLOURS.items())


def print_stream(
    client: Client, query: dict[str, Any] | str, task: str, options: dict[str, Any]
) -> Result:
    """Stream one generation to the console, each piece in its provenance's colour."""
    stream = client.stream(query, task=task, **options)
    for piece in stream:
        console.print(
            piece.text,
            style=COLOURS.get(piece.provenance, "white"),
            end="",
            soft_wrap=True,
            markup=False,
        )
    console.print()
    return stream.result


def _warm_start(s: GenerationStats) -> str:
    if s.switch_s is not None:
        return f"{s.warm_tokens} Generalist tokens, Draft-Verify-Recover from {s.switch_s:.2f} s"
    if s.warm_tokens:
        return f"{s.warm_tokens} Generalist tokens, the end came before the prefill was done"
    return "no"


def first_token_wait(s: GenerationStats) -> str:
    """Where the wait for the first token went: retrieval, the device's prefill, the
    companion's session (hello, its prefill of the public request) and what came after it (the
    first round's verdict, or only the device's own test on the session's candidates)."""
    first = s.first_token_s or 0.0
    parts = [f"retrieval {s.retrieval_s * 1e3:.0f} ms"]
    opened = s.session_ready_s
    if s.warm_tokens and opened is not None:
        parts.append(f"companion session {opened:.2f} s, then the Generalist's first token "
                     f"{first - opened:.2f} s (the device prefilled {s.prefill_s:.2f} s meanwhile)")
    elif opened is not None:
        ready = max(s.prefill_s, opened)
        made = (f" (its {s.drafted_beside_opening}-token draft made beside the session)"
                if s.drafted_beside_opening else "")
        parts.append(f"device prefill {s.prefill_s:.2f} s beside the companion session "
                     f"{opened:.2f} s, then the first token {max(first - ready, 0.0):.2f} s"
                     f"{made}")
    else:
        parts.append(f"device prefill {s.prefill_s:.2f} s, then the first token "
                     f"{max(first - s.prefill_s, 0.0):.2f} s")
    return f"{s.retrieval_s + first:.2f} s: " + "; ".join(parts)


def stats_table(result: Result) -> Table:
    """The generation's stats as a two-column table."""
    s = result.stats
    table = Table(title="generation stats", show_header=False)
    rows = [
        ("method", s.method),
        ("tokens", str(s.tokens)),
        ("rounds", str(s.rounds)),
        ("acceptance", f"{s.acceptance_rate:.1%} ({s.accepted}/{s.drafted} drafts)"),
        ("tokens/s", f"{s.tokens_per_s:.2f}"),
        ("time to first token", f"{s.first_token_s or 0:.2f} s"),
        ("where it went", first_token_wait(s)),
        ("retrieval", f"{s.retrieval_s * 1e3:.1f} ms"),
        ("device prefill", f"{s.prefill_s:.2f} s ({s.prefill_tokens} prompt tokens; "
                           f"{s.prefill_reused} reused from prepare/earlier)"),
        ("companion session", "opened ahead (prepare)" if s.session_reused else "not ahead"),
        ("warm start", _warm_start(s)),
        ("device compute", f"{s.device_s:.2f} s"),
        ("companion + network", f"{s.wait_s:.2f} s"),
        ("total", f"{s.total_s:.2f} s"),
        ("bytes up / down", f"{s.bytes_up} / {s.bytes_down} ({s.bytes_per_token:.1f} B/token)"),
        ("offline-degraded", f"{s.degraded}: {s.offline_reason}" if s.degraded else "False"),
        ("history records used", ", ".join(s.records) or "-"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


def register(app: typer.Typer) -> None:
    """Add the generate command to the main CLI."""

    @app.command()
    @options.decoding(GENERATE)
    def generate(
        request: Annotated[str, typer.Argument(help="What to write (a subject, title or text)")],
        task: Annotated[str, typer.Option(help="Task template")] = "email",
        specialist: options.Specialist = "qwen2.5-0.5b",
        history: options.History = None,
        companion: options.Companion = None,
        token: options.Token = "",
        allow_insecure: options.AllowInsecure = False,
        as_json: Annotated[bool, typer.Option("--json")] = False,
        decoding: dict[str, Any] | None = None,
    ) -> None:
        """Write personalized text with the local Specialist, steered by a companion if given."""
        settings = dict(decoding or {})
        query = request  # a plain string fills the task's first field
        try:
            client = Client(specialist, history=history, companion=companion,
                            token=token or NO_TOKEN,
                            allow_insecure=allow_insecure)
            if as_json:
                result = client.generate(query, task=task, **settings)
                print(json.dumps({"text": result.text, "provenance": result.provenance,
                                  "stats": result.stats.to_json()}))
            else:
                console.print(legend())
                console.print(stats_table(print_stream(client, query, task, settings)))
        except (SpecSteerError, ValueError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from None
