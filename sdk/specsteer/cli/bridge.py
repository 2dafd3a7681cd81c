"""`specsteer bridge`: serve one Client over JSON-RPC on stdio (and OpenAI-style HTTP).

A thin command: it claims stdout for protocol frames, loads the Specialist once, opens the
history store and hands everything to `specsteer.bridge`. Logs go to stderr.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from specsteer.cli import options


def register(app: typer.Typer) -> None:
    """Add the bridge command to the main CLI."""

    @app.command()
    def bridge(
        specialist: options.Specialist = "qwen2.5-0.5b",
        history: options.History = None,
        companion: options.Companion = None,
        token: options.Token = "",
        allow_insecure: options.AllowInsecure = False,
        history_timeout_s: Annotated[
            float, typer.Option(help="Longest wait for a history file another app has locked")
        ] = 5.0,
        timeout_s: Annotated[
            float, typer.Option(help="Longest wait for any companion reply")
        ] = 30.0,
        max_line_bytes: Annotated[
            int, typer.Option(min=1024, help="Longest accepted request line")
        ] = 1 << 20,
        http: Annotated[
            str | None, typer.Option(help="Also serve OpenAI-style HTTP on HOST:PORT (loopback)")
        ] = None,
        http_token_file: Annotated[
            Path | None, typer.Option(help="Bearer token file (default $SPECSTEER_HOME/"
                                      "bridge-token; created with a random token if missing)")
        ] = None,
        allow_remote: Annotated[
            bool, typer.Option(help="Let --http bind a non-loopback address")
        ] = False,
        stdio: Annotated[
            bool, typer.Option(help="Serve JSON-RPC on stdio; --no-stdio (with --http) serves "
                               "until SIGINT/SIGTERM")
        ] = True,
        audit_frames: Annotated[
            bool, typer.Option(help="Notify `companion.frame` for every frame to or from the "
                               "companion, decoded (a 'what left this device' view)")
        ] = False,
        log_level: Annotated[str, typer.Option(help="stderr log level")] = "INFO",
    ) -> None:
        """Serve JSON-RPC 2.0 on stdin/stdout until stdin closes (docs/bindings.md)."""
        from specsteer.bridge.schemas import schema_names
        from specsteer.bridge.server import claim_stdout, serve, serve_until_signal

        writer = claim_stdout()
        logging.basicConfig(stream=sys.stderr, level=log_level.upper(),
                            format="%(asctime)s specsteer-bridge %(levelname)s %(message)s")
        schema_names()  # fail now, not on the first request, if the schemas are missing
        if not stdio and http is None:
            raise typer.BadParameter("--no-stdio needs --http")
        address, bearer = _http_endpoint(http, allow_remote, http_token_file)
        taps: list[Callable[[str, bytes], None]] = []  # the Bridge's, once it exists
        client = _client(specialist, history, history_timeout_s, companion, token, timeout_s,
                         allow_insecure, taps if audit_frames else None)
        make_bridge = _bridges(client, taps, address, bearer, http=http,
                               max_line_bytes=max_line_bytes, companion=companion,
                               audit_frames=audit_frames)
        if stdio:
            serve(make_bridge, sys.stdin.buffer, writer, max_line_bytes)
        else:
            serve_until_signal(make_bridge, writer)


def _http_endpoint(http: str | None, allow_remote: bool,
                   token_file: Path | None) -> tuple[tuple[str, int] | None, str]:
    """The --http address and its bearer token (none without --http); exit 2 when wrong."""
    from specsteer.bridge.http import parse_address, read_token
    from specsteer.models.registry import home

    if http is None:
        return None, ""
    try:
        return parse_address(http, allow_remote), read_token(token_file or home() /
                                                               "bridge-token")
    except (ValueError, OSError) as exc:
        print(f"specsteer bridge: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None


def _client(specialist: str, history: Path | None, history_timeout_s: float,
            companion: str | None, token: str, timeout_s: float, allow_insecure: bool,
            taps: list[Callable[[str, bytes], None]] | None) -> Any:
    """The bridge's one Client (models loaded once); `taps`: the frame audits, when asked for.
    Exit 3 when it cannot start."""
    from specsteer.client import NO_TOKEN, Client
    from specsteer.errors import SpecSteerError
    from specsteer.history import HistoryStore

    try:
        store = None if history is None \
            else HistoryStore(history, busy_timeout_s=history_timeout_s)
        client = Client(specialist, history=store, companion=companion,
                        token=token or NO_TOKEN, timeout_s=timeout_s, allow_insecure=allow_insecure,
                        tap=(lambda d, f: [tap(d, f) for tap in taps]) if taps is not None
                        else None)
    except SpecSteerError as exc:
        print(f"specsteer bridge: cannot start: {exc}", file=sys.stderr)
        raise typer.Exit(3) from None
    logging.getLogger("specsteer.bridge").info(
        "ready: specialist %s, history %s, companion %s", client.specialist.name, history,
        companion)
    return client


def _bridges(client: Any, taps: list[Callable[[str, bytes], None]],
             address: tuple[str, int] | None, bearer: str, *, http: str | None,
             max_line_bytes: int, companion: str | None,
             audit_frames: bool) -> Callable[..., Any]:
    """What the server calls to make the Bridge (with its HTTP endpoint, when asked for)."""
    from specsteer.bridge.handlers import Bridge
    from specsteer.bridge.http import OpenAIServer

    def make_bridge(notify: Callable[[str, dict[str, Any]], None]) -> Bridge:
        bridge = Bridge(client, notify, max_line_bytes=max_line_bytes, companion=companion,
                        audit_frames=audit_frames)
        taps.append(bridge.audit_frame)
        if address is not None:
            try:
                server = OpenAIServer(address, bridge, bearer)
            except OSError as exc:
                print(f"specsteer bridge: cannot serve --http {http}: {exc}", file=sys.stderr)
                raise typer.Exit(2) from None
            server.start()
            bridge.http_url = server.url
            logging.getLogger("specsteer.bridge").info("http ready: %s", server.url)
        return bridge

    return make_bridge
