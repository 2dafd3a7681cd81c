"""The option registry: what each setting of a generation says about itself.

vLLM's config style (docs/style.md): a setting is one field of `settings.Params` whose metadata
(`option(...)`) carries its help, range or choices, scope (which side reads it) and surfaces
(where an app or a command line may set it). Every surface is made from this one definition:
the command-line flags (`cli/options.py`), the bridge's option list and JSON schema
(`bridge/schemas.py`, and from the schema the TypeScript types), the OpenAI endpoint's field
mapping (`bridge/http.py`) and the documentation tables (`tools/regenerate.py`); `Params` checks
its values against the same ranges (`check`). Adding an option is one field plus
`./dev generate`; tests fail while a generated file differs from what the registry gives.
This module holds the metadata and the generic checks only, never a particular setting.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from specsteer.tokenizer import check_text

# scope: which side reads an option
DEVICE = "device"  # the device only: never sent
COMPANION = "companion"  # sent in the session settings; only the companion reads it
BOTH = "both"  # sent, and read on the device too
SCOPES = (DEVICE, COMPANION, BOTH)

# surfaces besides `Params` / `Client` keywords, where every option is a setting
BRIDGE = "bridge"  # generate/prepare params: JSON schema, TS types, the HTTP `specsteer` field
GENERATE = "generate"  # `specsteer generate` flags
EVAL = "eval"  # `specsteer-lab eval` flags: one value for every method of a run
DEMO = "demo"  # `specsteer-lab demo` flags
SURFACES = (BRIDGE, GENERATE, EVAL, DEMO)
APP = frozenset({BRIDGE, GENERATE})  # what an app sets: the bridge, HTTP, `specsteer generate`
SDK_ONLY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Option:
    """An option's metadata: the one place its help, range and exposure are written."""

    help: str
    scope: str = DEVICE
    surfaces: frozenset[str] = APP
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # exclusive minimum
    choices: tuple[str, ...] = ()
    off_or_at_least: int | None = None  # 0 turns it off; any other value is at least this
    openai: tuple[str, ...] = ()  # chat-completions fields that set it (`bridge --http`)

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {self.scope!r}")
        unknown = set(self.surfaces) - set(SURFACES)
        if unknown:
            raise ValueError(f"unknown surfaces {sorted(unknown)}; surfaces: {SURFACES}")

    def range_text(self) -> str:
        """The allowed values in words (for messages and the docs tables); "" when any."""
        if self.choices:
            return " | ".join(self.choices)
        if self.off_or_at_least is not None:
            return f"0 (off) or >= {self.off_or_at_least}"
        low = f"({_number(self.above)}" if self.above is not None else \
            f"[{_number(self.minimum)}" if self.minimum is not None else None
        if low is not None and self.maximum is not None:
            return f"{low}, {_number(self.maximum)}]"
        if self.above is not None:
            return f"> {_number(self.above)}"
        if self.minimum is not None:
            return f">= {_number(self.minimum)}"
        return f"<= {_number(self.maximum)}" if self.maximum is not None else ""

    def problem(self, value: object) -> str | None:
        """Why `value` is outside this option's range, or None when it is inside."""
        if self.choices:
            return None if value in self.choices else f"must be one of {', '.join(self.choices)}"
        if value is None or isinstance(value, tuple | str | bool):
            return None
        if not isinstance(value, int | float) or math.isnan(value):
            return "must be a number"
        if self.off_or_at_least is not None:
            ok = value == 0 or value >= self.off_or_at_least
            return None if ok else f"must be 0 (off) or at least {self.off_or_at_least}"
        inside = (self.minimum is None or value >= self.minimum) \
            and (self.above is None or value > self.above) \
            and (self.maximum is None or value <= self.maximum)
        return None if inside else f"must be {_in_words(self.range_text())}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _in_words(text: str) -> str:
    return text if text.startswith((">", "<")) else f"in {text}"


def option(default: Any, help: str, **metadata: Any) -> Any:
    """A `Params` field with its default and its metadata (`Option`'s fields)."""
    return dataclasses.field(default=default, metadata={"option": Option(help, **metadata)})


@dataclass(frozen=True)
class Entry:
    """One registered option as the surfaces read it: name, Python type, default, metadata."""

    name: str
    type: Any
    default: Any
    option: Option

    @property
    def is_phrases(self) -> bool:
        """A list of phrases (`tuple[str, ...]`)."""
        return typing.get_origin(self.type) is tuple

    @property
    def base_type(self) -> type:
        """The type of a value given on a surface (None stripped; `str` for phrase lists)."""
        if self.is_phrases:
            return str
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        return args[0] if args else self.type


@cache
def entries(cls: type) -> tuple[Entry, ...]:
    """Every field of the settings class `cls`, in order; each must carry an `Option`."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("option")
        if not isinstance(meta, Option):
            raise TypeError(f"{cls.__name__}.{f.name} has no option(...) metadata: every "
                            "setting says its help, range and surfaces")
        found.append(Entry(f.name, hints[f.name], f.default, meta))
    return tuple(found)


def exposed(cls: type, surface: str) -> tuple[Entry, ...]:
    """The options of `cls` that `surface` offers, in field order."""
    if surface not in SURFACES:
        raise ValueError(f"unknown surface {surface!r}; surfaces: {', '.join(SURFACES)}")
    return tuple(e for e in entries(cls) if surface in e.option.surfaces)


def check(settings: object) -> None:
    """Raise ValueError naming the first field whose value is outside its option's range
    (phrase lists: a tuple of non-empty strings, each valid Unicode text)."""
    for entry in entries(type(settings)):
        value = getattr(settings, entry.name)
        if entry.is_phrases:
            if not isinstance(value, tuple) or not all(isinstance(p, str) and p for p in value):
                raise ValueError(f"{entry.name} must be a tuple of non-empty strings, "
                                 f"not {value!r}")
            for phrase in value:
                check_text(phrase, entry.name)
            continue
        problem = entry.option.problem(value)
        if problem is not None:
            raise ValueError(f"{entry.name} {problem}, not {value!r}")


def device_view(settings: Any) -> Any:
    """`settings` with every option only the companion reads at its default: what the
    device's own work (a draft made ahead, for one) depends on. A new option counts unless it
    is declared `COMPANION`."""
    reset = {e.name: e.default for e in entries(type(settings)) if e.option.scope == COMPANION}
    return dataclasses.replace(settings, **reset)


def openai_fields(cls: type) -> dict[str, str]:
    """Chat-completions field -> option name, for the options the bridge offers."""
    return {field: e.name for e in exposed(cls, BRIDGE) for field in e.option.openai}


def names(items: Iterable[Entry]) -> tuple[str, ...]:
    return tuple(e.name for e in items)


def stat(default: Any, help: str, *, factory: Any = None) -> Any:
    """A field of a stats dataclass with its help (the generated stats schema's description);
    `factory` for a mutable default."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"stat": help})
    return dataclasses.field(default=default, metadata={"stat": help})


def stat_help(cls: type) -> dict[str, str]:
    """Each field of the stats dataclass `cls` and its help; every field must carry one."""
    found = {}
    for f in dataclasses.fields(cls):
        if "stat" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} has no stat(...) help")
        found[f.name] = f.metadata["stat"]
    return found
