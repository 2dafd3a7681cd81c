"""`specsteer-companion`: serve the Generalist and generic Specialist to devices; manage tokens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from specsteer.errors import SpecSteerError
from specsteer_companion.admission import ServerConfig
from specsteer_companion.cli_flags import fields_flag_group
from specsteer_companion.cli_ray import ray_app
from specsteer_companion.cli_tokens import cert_app, default_store_path, tokens_app
from specsteer_companion.vllm_engine import VllmOptions


class Engine(StrEnum):
    """Where the Generalist's passes run."""

    onnx = "onnx"
    vllm = "vllm"


if TYPE_CHECKING:
    from specsteer.runtime import LanguageModel
    from specsteer_companion.auth import TokenStore
    from specsteer_companion.batching import BatchingModel, BatchLimits
    from specsteer_companion.server import CompanionServer

app = typer.Typer(
    name="specsteer-companion",
    help="The SpecSteer cloud companion.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(tokens_app, name="tokens")
app.add_typer(cert_app, name="cert")
app.add_typer(ray_app, name="ray")


# serve's own options (its address, limits and engine settings come from their dataclasses)
Generalist = Annotated[str, typer.Option(help="Registry name or compiled folder")]
SpecialistArtifact = Annotated[str, typer.Option(
    help="The devices' Specialist artifact (P_S0); 'none' if devices send P_S0")]
SpecialistPrecision = Annotated[str | None, typer.Option(
    help="Precision of a registry --specialist (default: the one a device on this CPU runs it "
    "at, so both hold the same artifact; set it when the devices' CPUs differ: docs/models.md)")]
TokenStorePath = Annotated[Path | None, typer.Option(
    help="Token store (default: the tokens command's)")]
OpenAccess = Annotated[bool, typer.Option(
    "--open", help="Accept any device (local development only)")]
Batch = Annotated[bool, typer.Option(
    "--batch", help="Run the verification passes of concurrent sessions as one forward pass "
    "per model (raw ONNX Runtime sessions instead of ONNX Runtime GenAI)")]
MaxBatchTokens = Annotated[int, typer.Option(
    min=1, help="With --batch: padded tokens per pass (rows x longest row)")]
GeneralistEngine = Annotated[Engine, typer.Option(
    help="Where the Generalist runs: ONNX Runtime in this process, or a vLLM engine "
    "(--generalist: an HF folder or an export-hf name)")]


@app.command()
@fields_flag_group("engine", VllmOptions, "vLLM engine (--generalist-engine vllm)")
@fields_flag_group("limits", ServerConfig, "Address and limits")
def serve(
    generalist: Generalist = "qwen2.5-1.5b",
    specialist: SpecialistArtifact = "qwen2.5-0.5b",
    precision: Annotated[str, typer.Option(help="Precision of registry models")] = "int8",
    specialist_precision: SpecialistPrecision = None,
    threads: Annotated[int, typer.Option(help="Threads per model")] = 1,
    workers: Annotated[int, typer.Option(help="Concurrent verification threads")] = 1,
    tokens: TokenStorePath = None,
    open_access: OpenAccess = False,
    cert: Annotated[Path | None, typer.Option(help="TLS certificate (PEM) for wss://")] = None,
    key: Annotated[Path | None, typer.Option(help="TLS private key (PEM)")] = None,
    batch: Batch = False,
    max_batch: Annotated[int, typer.Option(min=1, help="With --batch: sessions per pass")] = 16,
    max_batch_tokens: MaxBatchTokens = 256,
    generalist_engine: GeneralistEngine = Engine.onnx,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
    limits: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
) -> None:
    """Load the models and serve devices over websockets until interrupted."""
    from specsteer.runtime.folder import resolve_folder
    from specsteer_companion.auth import TokenStore
    from specsteer_companion.batching import BatchLimits
    from specsteer_companion.server import CompanionServer
    from specsteer_companion.tls import server_ssl_context
    from specsteer_companion.verifier import Verifier

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    log = logging.getLogger("specsteer_companion")
    if open_access:
        log.warning("--open: every client is accepted without a token; use this only for local "
                    "development on a loopback address")
    with _config_errors():
        if (cert is None) != (key is None):  # half a TLS setup must never fall back to ws://
            given, missing = ("--cert", "--key") if key is None else ("--key", "--cert")
            raise SpecSteerError(f"{given} needs {missing} too: TLS takes a certificate and its "
                                 "key; the companion does not serve plain ws:// when TLS was "
                                 "asked for")
        config = ServerConfig(workers=workers, **(limits or {}))
        ssl_context = server_ssl_context(cert, key) if cert and key else None
        store = None if open_access else TokenStore(tokens or default_store_path())
        models = _Models(precision, threads,
                         BatchLimits(max_batch=max_batch, max_tokens=max_batch_tokens)
                         if batch else None)
        if generalist_engine is Engine.vllm:
            from specsteer_companion.vllm_engine import VllmScoring, resolve_model

            options = VllmOptions(**{**(engine or {}), "model": ""})
            g = VllmScoring(replace(options, model=resolve_model(generalist, options.dtype)))
        else:
            g = models.load(generalist)
        s = None if specialist == "none" else models.load(
            str(resolve_folder(specialist, specialist_precision, device=True)))
        verifier = Verifier(g, s)
    server = CompanionServer(verifier, config, ssl_context=ssl_context, **_token_checks(store))
    scheme, served = "wss" if ssl_context else "ws", (
        f"generalist={g.name} {g.sha256[:12]} specialist={s.name if s else 'none'}"
        + (f" batch={max_batch}x{max_batch_tokens}" if batch else "")
        + (" engine=vllm" if generalist_engine is Engine.vllm else ""))
    try:
        _serve_until_signalled(server, lambda port: f"{scheme}://{config.host}:{port} {served}")
    finally:
        if generalist_engine is Engine.vllm:
            g.close()  # type: ignore[union-attr]  # the engine's own processes too
    for model in models.batching:
        log.info("%s batching: %s", model.name, model.stats)


def _token_checks(store: TokenStore | None) -> dict[str, Any]:
    """The server's login and revocation checks against `store` (none: `--open`)."""
    if store is None:
        return {"authenticate": None, "check_revoked": None}
    return {"authenticate": lambda secret: info.token_id if (info := store.verify(secret))
            else None, "check_revoked": store.revoked_among}


@contextlib.contextmanager
def _config_errors() -> Iterator[None]:
    """A configuration mistake (a limit out of range, a missing model or engine) is one line
    on stderr and exit status 1, not a traceback."""
    try:
        yield
    except (SpecSteerError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


class _Models:
    """Loads the companion's ONNX Runtime models: in-process GenAI sessions, or with `batch`
    raw sessions whose concurrent passes run as one (kept to log their batching at exit)."""

    def __init__(self, precision: str, threads: int, batch: BatchLimits | None) -> None:
        self.precision, self.threads, self.batch = precision, threads, batch
        self.batching: list[BatchingModel] = []

    def load(self, name: str) -> LanguageModel:
        from specsteer.runtime import load_model
        from specsteer.runtime.ort_batched import load_batched_model
        from specsteer_companion.batching import BatchingModel

        if self.batch is None:
            return load_model(name, precision=self.precision, threads=self.threads)
        model = BatchingModel(load_batched_model(name, precision=self.precision,
                                                 threads=self.threads), self.batch)
        self.batching.append(model)
        return model


def _serve_until_signalled(server: CompanionServer, ready: Callable[[int], str]) -> None:
    """Serve until SIGINT or SIGTERM, even when the process was started with SIGINT ignored
    (any background job of a non-interactive shell, e.g. under nohup); print "companion
    ready: " and what `ready(port)` says once listening."""

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # loops without signal support (Windows) raise NotImplementedError; there Ctrl-C
            # still arrives as KeyboardInterrupt, suppressed around asyncio.run below
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await server.serve(lambda port: typer.echo(f"companion ready: {ready(port)}"), stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


@app.command()
def proxy(
    upstream: Annotated[str, typer.Option(help="The companion: ws://HOST:PORT or wss://...")],
    listen: Annotated[str, typer.Option(help="HOST:PORT the app connects to (ws://)")] = (
        "127.0.0.1:8766"),
    delay: Annotated[str, typer.Option(help="Added to every frame: 80ms, 1s")] = "0ms",
    jitter: Annotated[str, typer.Option(help="Uniform +- around the delay (never reorders)")] = (
        "0ms"),
    drop: Annotated[str, typer.Option(help="Share of frames lost: 1% or 0.01")] = "0",
    stall_after: Annotated[
        str | None, typer.Option(help="Stop forwarding this long after each connection opens")
    ] = None,
    cut_at: Annotated[
        str | None, typer.Option(help="Abort both sides this long after each connection opens")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the drop and jitter draws")] = None,
) -> None:
    """Put a faulty link between an app and a companion (docs/robustness.md)."""
    from specsteer_companion.proxy import Faults, parse_duration, parse_fraction, run_proxy

    host, _, port = listen.rpartition(":")
    try:
        faults = Faults(
            delay_s=parse_duration(delay), jitter_s=parse_duration(jitter),
            drop=parse_fraction(drop),
            stall_after_s=None if stall_after is None else parse_duration(stall_after),
            cut_at_s=None if cut_at is None else parse_duration(cut_at), seed=seed,
        )
        if not host or not port.isdigit():
            raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
        if not upstream.startswith(("ws://", "wss://")):
            raise ValueError(f"--upstream must be a ws:// or wss:// URL, got {upstream!r}")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_proxy(upstream, faults, host, int(port),
                              ready=lambda line: print(line, flush=True)))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
