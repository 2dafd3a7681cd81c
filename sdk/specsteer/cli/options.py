"""Options shared by the device commands that run a `Client` (generate, bridge): one definition.

Typer reads the help text and the environment variable from these `Annotated` types.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
