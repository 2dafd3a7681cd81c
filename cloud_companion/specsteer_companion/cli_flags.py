"""Command-line flags generated from a config dataclass: a field that carries `flag(...)`
metadata becomes an option of `specsteer-companion serve` with the field's own default, so a
limit or an engine setting is defined once, next to the code that reads it (and the Ray
config file, which fills the same dataclasses, cannot drift from the flags)."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

Command = TypeVar("Command", bound=Callable[..., Any])


def flag(decl: str, help: str, **option: Any) -> dict[str, Any]:
    """Field metadata that makes the field a flag: `decl` is "--name" (or "--on/--off" for a
    bool), `option` more `typer.Option` keywords (`min=`)."""
    return {"flag": (decl, help, option)}


def fields_flag_group(keyword: str, kind: type, panel: str) -> Callable[[Command], Command]:
    """A decorator giving a typer command one flag per flagged field of the dataclass `kind`;
    the command gets `{field: value}` of them all as `keyword`."""
    import typer

    from specsteer.cli.options import flag_group

    hints = typing.get_type_hints(kind)
    flags = []
    for field in dataclasses.fields(kind):
        if "flag" not in field.metadata:
            continue
        decl, help_text, option = field.metadata["flag"]
        info = typer.Option(decl, help=help_text, rich_help_panel=panel, **option)
        flags.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY,
                                       default=field.default,
                                       annotation=Annotated[hints[field.name], info]))
    return flag_group(keyword, flags, dict)
