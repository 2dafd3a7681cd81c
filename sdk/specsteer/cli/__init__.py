"""`specsteer` command line: a thin layer over the library, one module per command group.

Device commands only (models, history, generate); evaluation and the demo, which need the
companion too, are `specsteer-lab` (`specsteer_lab.cli`).
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="specsteer",
    help="Personalized on-device generation steered by a cloud Generalist.",
    no_args_is_help=True,
    add_completion=False,
)

# (module, group name); a module defines `app` (a group) or `register(app)` (top-level commands).
_GROUPS = [("models", "models"), ("history", "history"), ("generate", None), ("bridge", None)]

for _module_name, _group in _GROUPS:
    _module = importlib.import_module(f"specsteer.cli.{_module_name}")
    if _group is not None:
        app.add_typer(_module.app, name=_group)
    else:
        _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
