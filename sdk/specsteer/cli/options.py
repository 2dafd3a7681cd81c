"""Options shared by the commands: the device's connection options, written once, and the
decoding flags, generated from the option registry (`specsteer.options`).

Typer reads the help text and the environment variable from these `Annotated` types.
`decoding(surface)` adds a flag for every `Params` option a command offers, so a new option
reaches `specsteer generate`, `specsteer-lab eval` and the demo with no edit here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer

from specsteer.options import Entry, exposed
from specsteer.settings import PRESET, PRESETS, Params

Specialist = Annotated[str, typer.Option(help="Registry name or compiled folder")]
History = Annotated[Path | None, typer.Option(help="History store (SQLite file)")]
Companion = Annotated[str | None, typer.Option(help="ws:// or wss:// URL; none = local")]
Token = Annotated[str, typer.Option(envvar="SPECSTEER_TOKEN", help="Device token")]
AllowInsecure = Annotated[
    bool,
    typer.Option(
        "--allow-insecure",
        help="Send --token over plain ws:// to another host (refused by default: anyone on the "
        "path could read the token and the prompt; use wss://). Trusted private networks only",
    ),
]

Command = TypeVar("Command", bound=Callable[..., Any])
PANEL = "Decoding (Params)"


def decoding(surface: str, base: Params | None = None,
             settings: type[Params] = Params) -> Callable[[Command], Command]:
    """A decorator adding one flag per option of `settings` that `surface` offers (and
    `--preset` where it does) to a typer command, which gets those given as one dict keyword,
    `decoding` (a flag left out is not in it: the preset, then `base`, decide). Phrase lists
    take `--NAME TEXT` (repeatable, replacing the default list) and `--no-NAME` (the rule
    off). `base`: the command's own defaults where they are not the SDK's, shown in the help."""
    shown = base if base is not None else settings()
    entries = [*([PRESET] if surface in PRESET.option.surfaces else []),
               *exposed(settings, surface)]

    flags = [flag for entry in entries for flag in _flags(entry, shown)]
    return flag_group("decoding", flags, lambda given: _options(entries, given))


def flag_group(keyword: str, flags: list[inspect.Parameter],
               collect: Callable[[dict[str, Any]], Any]) -> Callable[[Command], Command]:
    """A decorator putting `flags` in place of a typer command's `keyword` parameter: the
    command gets `collect({flag name: value given})` as `keyword`. How a group of options
    defined elsewhere (a registry, a config dataclass) becomes flags without restating them."""

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        kept = [p for p in signature.parameters.values() if p.name != keyword]

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            given = {flag.name: kwargs.pop(flag.name) for flag in flags}
            return command(*args, **{keyword: collect(given)}, **kwargs)

        run.__signature__ = signature.replace(parameters=[*kept, *flags])  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return decorate


def settings_from(options: dict[str, Any], base: Params) -> Params:
    """`base` with the `options` a command was given on top (a preset first, when given);
    a value out of range is a `typer.BadParameter` naming the option."""
    options = dict(options)
    preset = PRESETS[options.pop("preset")] if "preset" in options else {}
    try:
        return base.updated(**{**preset, **options})
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _flags(entry: Entry, shown: Params) -> list[inspect.Parameter]:
    """The command-line parameters of one option."""
    default = entry.default if entry is PRESET else getattr(shown, entry.name)
    help_text = entry.option.help
    if entry.is_phrases:
        listed = f"{len(default)} phrases" if default else "none"
        flags = [_keyword(entry.name, list[str] | None, typer.Option(
            help=f"{help_text} (default: {listed}; repeat the flag for several)",
            rich_help_panel=PANEL))]
        if default:
            flags.append(_keyword(f"no_{entry.name}", bool, typer.Option(
                f"--no-{entry.name.replace('_', '-')}", help=f"Turn {entry.name} off",
                rich_help_panel=PANEL), False))
        return flags
    kind: Any = entry.base_type
    if entry.option.choices:
        kind = Literal[entry.option.choices]  # type: ignore[valid-type]
    decls = ()
    if kind is bool:
        flag = entry.name.replace("_", "-")
        decls = (f"--{flag}/--no-{flag}",)
    shown_default = "none" if default is None else str(default).lower() if kind is bool \
        else default
    return [_keyword(entry.name, kind | None, typer.Option(
        *decls, help=f"{help_text} (default: {shown_default})", rich_help_panel=PANEL))]


def _keyword(name: str, kind: Any, info: Any, default: Any = None) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, info])


def _options(entries: list[Entry], given: dict[str, Any]) -> dict[str, Any]:
    """The flags given, as `Params` keywords (phrase lists as tuples, `--no-NAME` as ())."""
    options: dict[str, Any] = {}
    for entry in entries:
        value = given.get(entry.name)
        if entry.is_phrases:
            off = given.get(f"no_{entry.name}", False)
            if off and value:
                raise typer.BadParameter(f"give --{entry.name.replace('_', '-')} or --no-"
                                         f"{entry.name.replace('_', '-')}, not both")
            value = () if off else None if value is None else tuple(value)
        if value is not None:
            options[entry.name] = value
    return options
