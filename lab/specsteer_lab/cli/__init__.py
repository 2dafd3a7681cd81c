"""`specsteer-lab` command line: `eval` and `demo`, one module per command, thin over the lab."""

from __future__ import annotations

import typer

from specsteer_lab.cli import demo, eval

app = typer.Typer(
    name="specsteer-lab",
    help="Evaluate SpecSteer and its baselines, or run the demo (device SDK + companion).",
    no_args_is_help=True,
    add_completion=False,
)
eval.register(app)
demo.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
