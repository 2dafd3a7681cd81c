"""`specsteer` command line: a thin layer over the library, one module per command group."""

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
_GROUPS = [
    ("models", "models"), ("history", "history"), ("generate", None), ("eval", None),
    ("bridge", None),
]

for _module_name, _group in _GROUPS:
    try:
        _module = importlib.import_module(f"specsteer.cli.{_module_name}")
    except ModuleNotFoundError as exc:  # a group not written yet must not break the others
        if exc.name != f"specsteer.cli.{_module_name}":
            raise
        continue
    if _group is not None:
        app.add_typer(_module.app, name=_group)
    else:
        _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
