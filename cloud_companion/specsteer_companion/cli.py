"""`specsteer-companion`: serve the Generalist and generic Specialist to devices; manage tokens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specsteer.errors import SpecSteerError
from specsteer_companion.cli_ray import ray_app
from specsteer_companion.cli_tokens import cert_app, default_store_path, tokens_app
from specsteer_companion.limits import (
    DEFAULT_BURST,
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    DEFAULT_MAX_SESSIONS_TOTAL,
    DEFAULT_MAX_UNAUTHENTICATED,
    DEFAULT_PREFILL_BURST,
    DEFAULT_PREFILL_TOKENS_PER_S,
    DEFAULT_RATE_PER_S,
)
from specsteer_companion.vllm_engine import DEFAULT_MAX_LOGPROBS


class Engine(StrEnum):
    """Where the Generalist's passes run."""

    onnx = "onnx"
    vllm = "vllm"


if TYPE_CHECKING:
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
    specialist_precision: Annotated[
        str | None,
        typer.Option(help="Precision of a registry --specialist (default: the one devices run "
                          "it at, so both hold the same artifact: docs/models.md)"),
    ] = None,
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
    ] = DEFAULT_IDLE_TIMEOUT_S,
    hello_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds from connecting to an accepted Hello")
    ] = DEFAULT_HELLO_TIMEOUT_S,
    max_connections: Annotated[
        int, typer.Option(min=1, help="Open connections in total (lowered to fit ulimit -n)")
    ] = DEFAULT_MAX_CONNECTIONS,
    max_connections_per_address: Annotated[
        int, typer.Option(min=1, help="Open connections from one IP address")
    ] = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    max_unauthenticated: Annotated[
        int, typer.Option(min=1, help="Connections not logged in yet (at most half the total; "
                          "when full, the oldest of the busiest address is closed)")
    ] = DEFAULT_MAX_UNAUTHENTICATED,
    rate: Annotated[
        float, typer.Option(min=0.001, help="Requests per second per connection")
    ] = DEFAULT_RATE_PER_S,
    burst: Annotated[int, typer.Option(min=1, help="Request burst per connection")] = int(
        DEFAULT_BURST
    ),
    prefill_rate: Annotated[
        float, typer.Option(min=0.001, help="Prompt tokens per second per device token")
    ] = DEFAULT_PREFILL_TOKENS_PER_S,
    prefill_burst: Annotated[
        int, typer.Option(min=1, help="Prompt-token burst per device token")
    ] = int(DEFAULT_PREFILL_BURST),
    max_sessions: Annotated[int, typer.Option(min=1, help="Open sessions in total")] = (
        DEFAULT_MAX_SESSIONS_TOTAL),
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
    generalist_engine: Annotated[
        Engine, typer.Option(help="Where the Generalist runs: ONNX Runtime in this process, or "
                             "a vLLM engine (--generalist: an HF folder or an export-hf name)")
    ] = Engine.onnx,
    engine_dtype: Annotated[str, typer.Option(help="vLLM: weight dtype (auto: the folder's)")] = (
        "auto"),
    engine_block_size: Annotated[
        int | None, typer.Option(help="vLLM: KV block size (default 32 on a CPU)")] = None,
    engine_max_logprobs: Annotated[
        int, typer.Option(help="vLLM: most candidates a verdict may carry (top_k)")] = (
        DEFAULT_MAX_LOGPROBS),
    engine_kv_cache_gib: Annotated[
        float | None, typer.Option(help="vLLM on a CPU: KV cache size in GiB")] = None,
    engine_gpu_memory: Annotated[
        float | None, typer.Option(help="vLLM on a GPU: share of its memory to use")] = None,
    engine_tensor_parallel: Annotated[int, typer.Option(min=1, help="vLLM: GPUs per engine")] = 1,
    engine_max_seqs: Annotated[
        int | None, typer.Option(help="vLLM: requests per engine step")] = None,
    engine_max_batched_tokens: Annotated[
        int | None, typer.Option(help="vLLM: tokens per engine step")] = None,
    engine_eager: Annotated[
        bool | None, typer.Option("--engine-eager/--engine-compile",
                                  help="vLLM: no torch.compile (default: eager on a CPU only)")
    ] = None,
    engine_cpus: Annotated[
        str | None, typer.Option(help="vLLM on a CPU: cores for its threads (\"1\", \"0-3\")")
    ] = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Load the models and serve devices over websockets until interrupted."""
    if (cert is None) != (key is None):  # half a TLS setup must never fall back to plain ws://
        given, missing = ("--cert", "--key") if key is None else ("--key", "--cert")
        typer.echo(f"error: {given} needs {missing} too: TLS takes a certificate and its key; "
                   "the companion does not serve plain ws:// when TLS was asked for", err=True)
        raise typer.Exit(1)
    from specsteer.runtime import LanguageModel, load_model
    from specsteer.runtime.folder import resolve_folder
    from specsteer.runtime.ort_batched import load_batched_model
    from specsteer_companion.auth import TokenStore
    from specsteer_companion.batching import BatchingModel, BatchLimits
    from specsteer_companion.server import CompanionServer, ServerConfig
    from specsteer_companion.tls import server_ssl_context
    from specsteer_companion.verifier import Verifier

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    log = logging.getLogger("specsteer_companion")
    if open_access:
        log.warning("--open: every client is accepted without a token; use this only for local "
                    "development on a loopback address")
    try:
        config = ServerConfig(
            host=host, port=port, workers=workers, idle_timeout_s=idle_timeout,
            hello_timeout_s=hello_timeout, max_connections=max_connections,
            max_connections_per_address=max_connections_per_address,
            max_unauthenticated=max_unauthenticated, requests_per_second=rate, burst=burst,
            prefill_tokens_per_second=prefill_rate, prefill_burst=prefill_burst,
            max_sessions=max_sessions)
        ssl_context = server_ssl_context(cert, key) if cert and key else None
        store = None if open_access else TokenStore(tokens or default_store_path())
    except SpecSteerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    models: list[BatchingModel] = []

    def load(name: str) -> LanguageModel:
        if not batch:
            return load_model(name, precision=precision, threads=threads)
        limits = BatchLimits(max_batch=max_batch, max_tokens=max_batch_tokens)
        models.append(
            BatchingModel(load_batched_model(name, precision=precision, threads=threads), limits)
        )
        return models[-1]

    try:
        if generalist_engine is Engine.vllm:
            from specsteer_companion.vllm_engine import VllmOptions, VllmScoring, resolve_model

            g = VllmScoring(VllmOptions(
                model=resolve_model(generalist, engine_dtype), dtype=engine_dtype,
                block_size=engine_block_size, max_logprobs=engine_max_logprobs,
                kv_cache_gib=engine_kv_cache_gib, gpu_memory_utilization=engine_gpu_memory,
                tensor_parallel_size=engine_tensor_parallel, max_num_seqs=engine_max_seqs,
                max_num_batched_tokens=engine_max_batched_tokens, eager=engine_eager,
                cpus=engine_cpus))
        else:
            g = load(generalist)
        s = None if specialist == "none" else load(
            str(resolve_folder(specialist, specialist_precision, device=True)))
        verifier = Verifier(g, s)
    except (SpecSteerError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    authenticate = None
    if store is not None:
        authenticate = lambda secret: info.token_id if (info := store.verify(secret)) else None  # noqa: E731
    server = CompanionServer(
        verifier, config, authenticate=authenticate,
        check_revoked=store.revoked_among if store is not None else None,
        ssl_context=ssl_context,
    )
    scheme, served = "wss" if ssl_context else "ws", (
        f"generalist={g.name} {g.sha256[:12]} specialist={s.name if s else 'none'}"
        + (f" batch={max_batch}x{max_batch_tokens}" if batch else "")
        + (" engine=vllm" if generalist_engine is Engine.vllm else ""))
    try:
        _serve_until_signalled(server, lambda port: f"{scheme}://{host}:{port} {served}")
    finally:
        if generalist_engine is Engine.vllm:
            g.close()  # type: ignore[union-attr]  # the engine's own processes too
    for model in models:
        log.info("%s batching: %s", model.name, model.stats)


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
