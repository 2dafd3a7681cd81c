"""`specsteer-companion tokens ...` and `cert ...`: thin commands over `auth` and `tls`.

Owns argument parsing, the default store location ($SPECSTEER_COMPANION_HOME/tokens.db) and how
results are printed: the secret of a new token goes alone to stdout (so scripts can capture it)
and everything else to stderr. Must not print a secret anywhere but right after `create`, nor
hold any logic the library lacks.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from specsteer.errors import SpecSteerError
from specsteer_companion.auth import TokenInfo, TokenStore
from specsteer_companion.tls import make_self_signed

HOME_ENV = "SPECSTEER_COMPANION_HOME"
DEFAULT_HOME = "~/.local/share/specsteer-companion"

tokens_app = typer.Typer(help="Issue, list and revoke device tokens.", no_args_is_help=True)
cert_app = typer.Typer(help="TLS certificates for the companion.", no_args_is_help=True)

StoreOption = Annotated[
    Path | None,
    typer.Option("--store", help=f"Token store file [default: ${HOME_ENV}/tokens.db]"),
]


def default_store_path() -> Path:
    """$SPECSTEER_COMPANION_HOME/tokens.db, read at call time so tests and services can set it."""
    home = os.environ.get(HOME_ENV) or DEFAULT_HOME
    return Path(home).expanduser() / "tokens.db"


def _open(store: Path | None) -> TokenStore:
    try:
        return TokenStore(store or default_store_path())
    except SpecSteerError as exc:
        _fail(str(exc))


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@tokens_app.command("create")
def create(name: Annotated[str, typer.Argument(help="Device name, e.g. alice-phone")],
           store: StoreOption = None) -> None:
    """Issue a token for device NAME and print its secret (shown this once only)."""
    token_store = _open(store)
    try:
        issued = token_store.create(name)
    except SpecSteerError as exc:
        _fail(str(exc))
    typer.echo(f"created token {issued.token_id} for device {issued.device_name}", err=True)
    typer.echo("keep this secret now: it is not stored and cannot be shown again", err=True)
    typer.echo(issued.secret)


@tokens_app.command("revoke")
def revoke(id_or_name: Annotated[str, typer.Argument(help="Token id, or a device name to "
                                                          "revoke all of its tokens")],
           store: StoreOption = None) -> None:
    """Revoke a token by id, or every live token of a device by name."""
    token_store = _open(store)
    try:
        done = token_store.revoke(id_or_name)
    except SpecSteerError as exc:
        _fail(str(exc))
    if not done:
        _fail(f"no live token with id or device name {id_or_name!r}")
    typer.echo(f"revoked {id_or_name}", err=True)


@tokens_app.command("list")
def list_tokens(as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
                store: StoreOption = None) -> None:
    """List every token (never its secret): id, device, created, last used, revoked."""
    token_store = _open(store)
    try:
        infos = token_store.list()
    except SpecSteerError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps([info.to_dict() for info in infos], indent=2))
        return
    if not infos:
        typer.echo("no tokens", err=True)
        return
    rows = [("ID", "DEVICE", "CREATED", "LAST USED", "REVOKED")]
    rows += [_row(info) for info in infos]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        typer.echo("  ".join(cells).rstrip())


def _row(info: TokenInfo) -> tuple[str, str, str, str, str]:
    def when(moment: datetime | None) -> str:
        return "-" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S}Z"

    return (info.token_id, info.device_name, when(info.created_at), when(info.last_used_at),
            when(info.revoked_at))


@cert_app.command("make-self-signed")
def make_self_signed_cmd(
    directory: Annotated[Path, typer.Argument(help="Folder for the certificate and key")],
    hostname: Annotated[str, typer.Option(help="Name devices connect to")] = "localhost",
    overwrite: Annotated[bool, typer.Option(help="Replace existing files")] = False,
) -> None:
    """Write a self-signed certificate and key for local development and tests."""
    try:
        cert, key = make_self_signed(directory, hostname, overwrite=overwrite)
    except SpecSteerError as exc:
        _fail(str(exc))
    typer.echo(f"certificate: {cert}")
    typer.echo(f"key:         {key}")
    typer.echo("devices must trust the certificate file (pass it as their CA file)", err=True)
