"""`specsteer bridge`: serve one Client over JSON-RPC on stdio (and OpenAI-style HTTP).

A thin command: it claims stdout for protocol frames, loads the Specialist once, opens the
history store and hands everything to `specsteer.bridge`. Logs go to stderr.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add the bridge command to the main CLI."""

    @app.command()
    def bridge(
        specialist: Annotated[
            str, typer.Option(help="Registry name or compiled folder")
        ] = "qwen2.5-0.5b",
        history: Annotated[Path | None, typer.Option(help="History store (SQLite file)")] = None,
        companion: Annotated[
            str | None, typer.Option(help="ws:// or wss:// URL; none = local")
        ] = None,
        token: Annotated[str, typer.Option(envvar="SPECSTEER_TOKEN", help="Device token")] = "",
        history_timeout_s: Annotated[
            float, typer.Option(help="Longest wait for a history file another app has locked")
        ] = 5.0,
        timeout_s: Annotated[
            float, typer.Option(help="Longest wait for any companion reply")
        ] = 30.0,
        max_line_bytes: Annotated[
            int, typer.Option(min=1024, help="Longest accepted request line")
        ] = 1 << 20,
        log_level: Annotated[str, typer.Option(help="stderr log level")] = "INFO",
    ) -> None:
        """Serve JSON-RPC 2.0 on stdin/stdout until stdin closes (docs/bindings.md)."""
        from specsteer.bridge.handlers import Bridge
        from specsteer.bridge.schemas import schema_names
        from specsteer.bridge.server import claim_stdout, serve
        from specsteer.client import Client
        from specsteer.errors import SpecSteerError
        from specsteer.history import HistoryStore

        writer = claim_stdout()
        logging.basicConfig(stream=sys.stderr, level=log_level.upper(),
                            format="%(asctime)s specsteer-bridge %(levelname)s %(message)s")
        schema_names()  # fail now, not on the first request, if the schemas are missing
        try:
            store = None if history is None \
                else HistoryStore(history, busy_timeout_s=history_timeout_s)
            client = Client(specialist, history=store, companion=companion, token=token,
                            timeout_s=timeout_s)
        except SpecSteerError as exc:
            print(f"specsteer bridge: cannot start: {exc}", file=sys.stderr)
            raise typer.Exit(3) from None
        logging.getLogger("specsteer.bridge").info(
            "ready: specialist %s, history %s, companion %s", client.specialist.name,
            history, companion)
        serve(lambda notify: Bridge(client, notify, max_line_bytes=max_line_bytes,
                                    companion=companion),
              sys.stdin.buffer, writer, max_line_bytes)
