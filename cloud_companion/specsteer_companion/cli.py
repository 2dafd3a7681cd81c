"""`specsteer-companion`: serve the Generalist and generic Specialist to devices; manage tokens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from specsteer_companion.cli_tokens import cert_app, default_store_path, tokens_app

app = typer.Typer(
    name="specsteer-companion",
    help="The SpecSteer cloud companion.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(tokens_app, name="tokens")
app.add_typer(cert_app, name="cert")


@app.command()
def serve(
    generalist: Annotated[
        str, typer.Option(help="Registry name or compiled folder")
    ] = "qwen2.5-1.5b",
    specialist: Annotated[
        str,
        typer.Option(help="The devices' Specialist artifact (P_S0); 'none' if devices send P_S0"),
    ] = "qwen2.5-0.5b",
    precision: Annotated[str, typer.Option(help="Precision of registry models")] = "int8",
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8765,
    threads: Annotated[int, typer.Option(help="Threads per model")] = 1,
    workers: Annotated[int, typer.Option(help="Concurrent verification threads")] = 1,
    tokens: Annotated[
        Path | None, typer.Option(help="Token store (default: the tokens command's)")
    ] = None,
    open_access: Annotated[
        bool, typer.Option("--open", help="Accept any device (local development only)")
    ] = False,
    cert: Annotated[Path | None, typer.Option(help="TLS certificate (PEM) for wss://")] = None,
    key: Annotated[Path | None, typer.Option(help="TLS private key (PEM)")] = None,
    idle_timeout: Annotated[
        float, typer.Option(help="Seconds before an idle device is dropped")
    ] = 120.0,
    max_sessions: Annotated[int, typer.Option()] = 64,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch",
            help="Run the verification passes of concurrent sessions as one forward pass per "
            "model (raw ONNX Runtime sessions instead of ONNX Runtime GenAI)",
        ),
    ] = False,
    max_batch: Annotated[int, typer.Option(min=1, help="With --batch: sessions per pass")] = 16,
    max_batch_tokens: Annotated[
        int,
        typer.Option(min=1, help="With --batch: padded tokens per pass (rows x longest row)"),
    ] = 256,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Load the models and serve devices over websockets until interrupted."""
    from specsteer.runtime import LanguageModel, load_model
    from specsteer.runtime.ort_batched import load_batched_model
    from specsteer_companion.auth import TokenStore
    from specsteer_companion.batching import BatchingModel, BatchLimits
    from specsteer_companion.server import CompanionServer, ServerConfig
    from specsteer_companion.tls import server_ssl_context
    from specsteer_companion.verifier import Verifier

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    models: list[BatchingModel] = []

    def load(name: str) -> LanguageModel:
        if not batch:
            return load_model(name, precision=precision, threads=threads)
        limits = BatchLimits(max_batch=max_batch, max_tokens=max_batch_tokens)
        models.append(
            BatchingModel(load_batched_model(name, precision=precision, threads=threads), limits)
        )
        return models[-1]

    g = load(generalist)
    s = None if specialist == "none" else load(specialist)
    authenticate = None
    if not open_access:
        store = TokenStore(tokens or default_store_path())
        authenticate = lambda secret: info.token_id if (info := store.verify(secret)) else None  # noqa: E731
    ssl_context = server_ssl_context(cert, key) if cert and key else None
    server = CompanionServer(
        Verifier(g, s),
        ServerConfig(
            host=host,
            port=port,
            workers=workers,
            idle_timeout_s=idle_timeout,
            max_sessions=max_sessions,
        ),
        authenticate=authenticate,
        ssl_context=ssl_context,
    )
    scheme = "wss" if ssl_context else "ws"

    def ready(bound: int) -> None:
        typer.echo(
            f"companion ready: {scheme}://{host}:{bound} generalist={g.name} "
            f"{g.sha256[:12]} specialist={s.name if s else 'none'}"
            + (f" batch={max_batch}x{max_batch_tokens}" if batch else ""),
            err=False,
        )

    async def run() -> None:
        # SIGINT and SIGTERM stop the server cleanly, even when the process was started with
        # SIGINT ignored (any background job of a non-interactive shell, e.g. under nohup)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # loops without signal support (Windows) raise NotImplementedError; there Ctrl-C
            # still arrives as KeyboardInterrupt, suppressed around asyncio.run below
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await server.serve(ready, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    for model in models:
        logging.getLogger("specsteer_companion").info("%s batching: %s", model.name, model.stats)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
