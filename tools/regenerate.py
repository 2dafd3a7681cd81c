"""Regenerate every file made from the option registry and the stats fields (`./dev generate`).

One definition per option (`sdk/specsteer/settings.py`: each `Params` field carries its help,
range, scope and surfaces) and per stat (`DecodeStats`, `LinkStats`, `GenerationStats`); from them
this writes the bridge's `decoding_options` and `stats` schemas (bindings/schema/v1/common.json,
which the SDK packages through a link) and the options tables of README.md and docs/eval.md.
The TypeScript types follow from the schema (`npm run generate` in bindings/node, which
`./dev generate` runs next); the command-line flags, the bridge's option list and the OpenAI
mapping read the registry at run time. `--check` writes nothing and exits 1 naming each file
that differs; tests/test_option_registry.py runs the same comparison.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specsteer.bridge.schemas import generated_definitions
from specsteer.generation import GenerationStats
from specsteer.options import BRIDGE, DEMO, EVAL, GENERATE, SURFACES, Entry, entries, exposed
from specsteer.settings import PRESET, Params

ROOT = Path(__file__).resolve().parents[1]
COMMON = Path("bindings/schema/v1/common.json")
README = Path("README.md")
EVAL_DOC = Path("docs/eval.md")
_SHOWN = {BRIDGE: "bridge", GENERATE: "`generate`", EVAL: "eval", DEMO: "demo"}


def begin(name: str) -> str:
    return f"<!-- generated: {name} (tools/regenerate.py; edit settings.py, run ./dev generate) -->"


def end(name: str) -> str:
    return f"<!-- end generated: {name} -->"


def options_table(settings: type[Params] = Params) -> str:
    """Every option: its default, allowed values, the side that reads it, where it is set."""
    rows = ["| option | default | values | read by | also set from | what it does |",
            "|---|---|---|---|---|---|"]
    for entry in (PRESET, *entries(settings)):
        rows.append(f"| `{entry.name}` | {_default(entry)} | {_values(entry)} "
                    f"| {entry.option.scope} | {_surfaces(entry)} | {_cell(entry.option.help)} |")
    return "\n".join(rows)


def eval_table(settings: type[Params] = Params) -> str:
    """The decoding flags of `specsteer-lab eval`: one value for every method of a run."""
    from specsteer_lab.eval.harness import EVAL_DECODING

    rows = ["| option | default | meaning |", "|---|---|---|"]
    base = EVAL_DECODING if settings is Params else settings()
    for entry in exposed(settings, EVAL):
        flag = f"`--{entry.name.replace('_', '-')}`"
        if entry.is_phrases:
            flag += f" TEXT (repeatable) / `--no-{entry.name.replace('_', '-')}`"
        elif entry.base_type is bool:
            flag += f" / `--no-{entry.name.replace('_', '-')}`"
        rows.append(f"| {flag} | {_value(getattr(base, entry.name), entry)} "
                    f"| {_cell(entry.option.help)} (`Params.{entry.name}`) |")
    return "\n".join(rows)


def _default(entry: Entry) -> str:
    return _value(entry.default, entry)


def _value(value: Any, entry: Entry) -> str:
    if entry.is_phrases:
        return f"{len(value)} phrases" if value else "none"
    return "–" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _values(entry: Entry) -> str:
    """What an option accepts, in words."""
    if entry.is_phrases:
        return "phrases"
    if entry.base_type is bool:
        return "none \\| true \\| false" if entry.default is None else "true \\| false"
    return _cell(entry.option.range_text())


def _surfaces(entry: Entry) -> str:
    shown = [_SHOWN[s] for s in SURFACES if s in entry.option.surfaces]
    return ", ".join(shown) if shown else "SDK only"


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "any"


def replaced(text: str, name: str, body: str) -> str:
    """`text` with the block between the markers of `name` replaced by `body`."""
    head, tail = begin(name), end(name)
    if head not in text or tail not in text:
        raise SystemExit(f"the markers of the generated block {name!r} are missing")
    before, rest = text.split(head, 1)
    _, after = rest.split(tail, 1)
    return f"{before}{head}\n{body}\n{tail}{after}"


def common_json(text: str, settings: type[Params] = Params,
                stats: type[GenerationStats] = GenerationStats) -> str:
    document = json.loads(text)
    document["$defs"].update(generated_definitions(settings, stats))
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def surfaces(root: Path = ROOT, settings: type[Params] = Params,
             stats: type[GenerationStats] = GenerationStats) -> dict[Path, str]:
    """Each generated file under `root` and the content the registry gives it."""
    read = lambda path: (root / path).read_text(encoding="utf-8")  # noqa: E731
    edits: dict[Path, Callable[[str], str]] = {
        COMMON: lambda text: common_json(text, settings, stats),
        README: lambda text: replaced(text, "options", options_table(settings)),
        EVAL_DOC: lambda text: replaced(text, "eval options", eval_table(settings)),
    }
    return {path: edit(read(path)) for path, edit in edits.items()}


def main(argv: list[str]) -> int:
    stale = [path for path, text in surfaces().items()
             if (ROOT / path).read_text(encoding="utf-8") != text]
    if "--check" in argv:
        for path in stale:
            print(f"{path} differs from what the registry gives: run ./dev generate")
        return 1 if stale else 0
    for path, text in surfaces().items():
        (ROOT / path).write_text(text, encoding="utf-8")
    print(f"wrote {', '.join(map(str, stale)) or 'nothing (all up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
