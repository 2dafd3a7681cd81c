"""The companion on Ray Serve: a websocket ingress in front of N verifier replicas.

Owns the two deployments and how a session stays on its replica. A `VerifierReplica` loads the
models once and holds, per device connection, one `CompanionEndpoint` (protocol state machine,
auth, KV caches: the very class the single-process server runs). The `Ingress`, one replica for
the whole cluster by design, accepts the device's websocket and admits it and its frames through
the single-process server's `AdmissionGate`, so for the whole cluster: connections per address,
in total and before login (the oldest of the busiest address shed when full), Hello deadline,
idle time, frame size, requests per connection, prompt tokens per device, sessions per device
and in total; and it ends the live connections of revoked tokens (`revocation`). The gate
decodes each frame once; the ingress forwards the message to the replica holding that
connection, tagged with its connection id: `ray_routing.SessionAffinityRouter` sends every
request of an id to the replica it placed the first one on, and the replica keeps the id's
endpoint in Serve's multiplexed-model cache (`max_sessions` per replica, least recently used
evicted). Should a frame land on a replica without its state (its replica died or evicted it),
or a replica die or stall, the ingress closes the websocket, and the device resumes the session
on a fresh connection (`protocol.Resume`), which lands wherever the router puts the new id. TLS
terminates at Serve's proxy (`http_options`).
"""

# No `from __future__ import annotations`: FastAPI must see the real `WebSocket` annotation
# of the ingress's method, and the class travels to its replica by value (cloudpickle), where
# a string annotation could no longer be resolved.
import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import ray
from fastapi import FastAPI, WebSocket
from ray import serve
from ray.serve.config import AutoscalingConfig, HTTPOptions, RequestRouterConfig

from specsteer import protocol
from specsteer.protocol import ErrorCode, Limits, Message
from specsteer_companion import logthrottle
from specsteer_companion.admission import AdmissionGate, Entry, Refusal
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.ray_config import RayCompanionConfig
from specsteer_companion.ray_routing import SessionAffinityRouter
from specsteer_companion.revocation import REVOKED_MESSAGE, RevocationCheck, watch_revocations
from specsteer_companion.server import THROTTLE, TIMEOUTS
from specsteer_companion.verifier import Verifier

log = logging.getLogger("specsteer_companion.ray")
RESUME_CLOSE = 1011  # websocket close code of a lost replica: the device resumes elsewhere
STATS_REQUESTS = 8  # /stats requests the ingress serves beside its full count of websockets


@dataclass(frozen=True)
class Reply:
    """A replica's answer to one frame."""

    frames: list[bytes]
    replica: str  # full id of the replica (its actor name)
    identity: str | None = None
    closed: bool = False  # the endpoint closed the connection (Error or Close)
    lost: bool = False  # this replica holds no state for the connection: resume elsewhere
    resumed: bool = False  # the frame rebuilt a session (Resume)
    limits: Limits | None = None  # what the endpoint decodes with now (the ingress does it)


def _authenticator(config: RayCompanionConfig):  # type: ignore[no-untyped-def]
    if config.open_access:
        return None
    from specsteer_companion.auth import TokenStore

    store = TokenStore(config.tokens)  # type: ignore[arg-type]
    return lambda secret: info.token_id if (info := store.verify(secret)) else None


def _load_verifier(config: RayCompanionConfig) -> Verifier:
    from specsteer.runtime import load_model

    m = config.models
    if m.engine == "vllm":  # one engine per replica, sized by the replica's GPUs
        from specsteer_companion.vllm_engine import VllmScoring

        g = VllmScoring(m.vllm_options())
    else:
        g = load_model(m.generalist, precision=m.precision, threads=m.threads)
    s = None if m.specialist == "none" else load_model(m.specialist, precision=m.precision,
                                                        threads=m.threads)
    return Verifier(g, s, m.max_session_tokens)


def build_app(config: RayCompanionConfig):  # type: ignore[no-untyped-def]
    """The Serve application (ingress bound to the verifier deployment) for `config`."""
    v = config.verifier
    autoscaling = AutoscalingConfig(
        min_replicas=v.min_replicas, max_replicas=v.max_replicas,
        initial_replicas=v.initial_replicas, target_ongoing_requests=v.target_ongoing_requests,
        upscale_delay_s=v.upscale_delay_s, downscale_delay_s=v.downscale_delay_s)

    @serve.deployment(
        autoscaling_config=autoscaling, max_ongoing_requests=v.max_ongoing_requests,
        ray_actor_options={"num_cpus": v.num_cpus, "num_gpus": v.num_gpus},
        request_router_config=RequestRouterConfig(request_router_class=SessionAffinityRouter),
        health_check_period_s=v.health_check_period_s,
        health_check_timeout_s=v.health_check_timeout_s)
    class VerifierReplica:
        """Models loaded once; one endpoint per device connection routed here."""

        def __init__(self) -> None:
            self.verifier = _load_verifier(config)
            # a thread per frame in flight: with an engine that batches sessions (vLLM) they
            # all wait for its steps at once (asyncio's default pool has cores + 4 threads)
            self.pool = ThreadPoolExecutor(max_workers=v.max_ongoing_requests,
                                           thread_name_prefix="verify")
            self.authenticate = _authenticator(config)
            self.replica = serve.get_replica_context().replica_id.to_full_id_str()
            self.counts: Counter[str] = Counter()

        @serve.multiplexed(max_num_models_per_replica=v.max_sessions)
        async def endpoint(self, connection: str) -> _HeldEndpoint:
            self.counts["connections"] += 1
            return _HeldEndpoint(CompanionEndpoint(self.verifier, authenticate=self.authenticate))

        async def handle(self, message: Message, size: int) -> Reply:
            """One frame of the connection, decoded by the ingress (with `Reply.limits`)."""
            held = await self.endpoint(serve.get_multiplexed_model_id())
            endpoint = held.endpoint
            fresh = endpoint.conn.state is protocol.State.START
            if fresh and not isinstance(message, protocol.Hello):
                self.counts["lost"] += 1
                return Reply([], self.replica, lost=True)
            resumes = endpoint.resumes
            frames = await asyncio.get_running_loop().run_in_executor(  # model work off the loop
                self.pool, endpoint.handle_message, message, size)
            resumed = endpoint.resumes > resumes
            self.counts["resumes"] += resumed
            self.counts["frames"] += 1
            return Reply(frames, self.replica, endpoint.identity, endpoint.closed,
                         resumed=resumed, limits=endpoint.conn.limits)

        async def release(self) -> None:
            """The device's connection ended: free its KV caches now."""
            held = await self.endpoint(serve.get_multiplexed_model_id())
            held.endpoint.release()

        def stats(self) -> dict[str, object]:
            return {"replica": self.replica, **self.counts}

        def check_health(self) -> None:
            """Serve restarts a replica whose models no longer run a token."""
            self.verifier.check()

    return _ingress(config).bind(VerifierReplica.bind())


def _ingress(config: RayCompanionConfig):  # type: ignore[no-untyped-def]
    """The ingress deployment of `config`: one replica, a FastAPI app with the websocket."""
    i = config.ingress
    app = FastAPI()

    # Each open websocket is one ongoing request of the ingress for its whole life: Serve's
    # default (5) would leave every device past the fifth waiting at the proxy for a slot (its
    # handshake timing out), so the ingress takes all it may admit, and refuses the rest itself.
    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": i.num_cpus},
                      max_ongoing_requests=i.max_connections + STATS_REQUESTS)
    @serve.ingress(app)
    class Ingress:
        """Websocket front, one replica for the cluster (`_Relay` does the work)."""

        def __init__(self, verifiers) -> None:  # type: ignore[no-untyped-def]
            logthrottle.install(THROTTLE)  # a flood's refusals log a bounded number of lines
            self.verifiers = verifiers
            self.relay = _Relay(config)

        @app.get("/stats")
        def stats(self) -> dict[str, object]:
            """What the ingress routed and refused: sessions and resumes per verifier replica."""
            return self.relay.stats()

        @app.websocket("/")
        async def connect(self, ws: WebSocket) -> None:
            await self.relay.connect(ws, self.verifiers)

    return Ingress


class _Relay:
    """The ingress's state (the admission gate, for the whole cluster) and the life of one
    device websocket: admitted or refused, each frame through the gate to the replica holding
    the connection, the replies back, revocation."""

    def __init__(self, config: RayCompanionConfig) -> None:
        self.ingress = config.ingress
        self.gate = AdmissionGate(config.ingress)
        self.check_revoked = _revocation_check(config)
        self.watch: asyncio.Task[None] | None = None
        self.per_replica: Counter[str] = Counter()  # sessions opened per replica
        self.resumed: Counter[str] = Counter()
        self.lost = 0

    def stats(self) -> dict[str, object]:
        return {"sessions": dict(self.per_replica), "resumes": dict(self.resumed),
                "lost": self.lost, "refused": self.gate.refused, "shed": self.gate.shed,
                "open_connections": self.gate.open_connections(),
                "unauthenticated": self.gate.unauthenticated,
                "open_sessions": self.gate.open_sessions()}

    async def connect(self, ws: WebSocket, verifiers) -> None:  # type: ignore[no-untyped-def]
        peer = ws.client.host if ws.client else "?"
        conn = _Connection(ws, asyncio.current_task())
        admission = self.gate.connect(peer, owner=conn)
        for shed in admission.shed:
            log.warning("closed a connection from %s that had not logged in, to make room "
                        "for a new one", shed.peer)
            shed.owner.shed()
        if admission.entry is None:
            log.warning("refused a connection from %s: %s", peer, admission.refused)
            return await ws.close(code=1013, reason="too many connections")
        if self.watch is None:  # started here: the replica's event loop runs by now
            self.watch = asyncio.create_task(watch_revocations(
                lambda: list(self.gate.live), self.check_revoked,
                self.ingress.revocation_check_s, _end_revoked, tidy=self.gate.tidy))
        handle = verifiers.options(multiplexed_model_id=uuid.uuid4().hex)
        try:
            await ws.accept()  # in here: a device gone mid-handshake gives its slot back
            await self._serve(admission.entry, handle)
        except asyncio.CancelledError:
            if not conn.was_shed:
                raise
        finally:
            self.gate.disconnect(admission.entry)
            with contextlib.suppress(Exception):
                handle.release.remote()
            with contextlib.suppress(Exception):
                await ws.close()

    async def _serve(self, entry: Entry, handle) -> None:  # type: ignore[no-untyped-def]
        ws, limits = entry.owner.ws, Limits()
        while True:
            try:
                message = await asyncio.wait_for(ws.receive(), self.gate.wait_s(entry))
            except TIMEOUTS:
                return await _refuse(ws, self.gate.timed_out(entry))
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("bytes")
            checked = self.gate.check(entry, message.get("text") if frame is None else frame,
                                      limits)
            if isinstance(checked, Refusal):
                return await _refuse(ws, checked)
            reply = await self._forward(entry, handle, checked, len(frame or b""))
            if reply is None or reply.lost:
                self.lost += 1
                return await ws.close(code=RESUME_CLOSE, reason="verifier lost: resume")
            limits = reply.limits or limits
            if entry.identity is None and reply.identity is not None and not reply.closed:
                self.gate.logged_in(entry, reply.identity)
            if isinstance(checked, protocol.OpenSession | protocol.Resume):
                self.per_replica[reply.replica] += 1
                if reply.resumed:
                    self.resumed[reply.replica] += 1
            for out in reply.frames:
                await ws.send_bytes(out)
            if reply.closed:
                return
            if entry.revoked:  # revoked while this frame was in flight
                return await _refuse(ws, Refusal(ErrorCode.AUTH_FAILED, REVOKED_MESSAGE))

    async def _forward(self, entry: Entry, handle, message: Message,  # type: ignore[no-untyped-def]
                       size: int) -> Reply | None:
        """The replica's reply to one message; None if the replica died or stalled."""
        entry.busy = True
        try:
            return await asyncio.wait_for(handle.handle.remote(message, size),
                                          self.ingress.replica_timeout_s)
        except (ray.exceptions.RayError, *TIMEOUTS) as exc:
            log.warning("verifier replica lost (%s): the device resumes elsewhere",
                        type(exc).__name__)
            return None
        finally:
            entry.busy = False


@dataclass(eq=False)
class _Connection:
    """The ingress's handle on one device websocket: what the gate closes if it sheds it."""

    ws: WebSocket
    task: asyncio.Task[None] | None
    was_shed: bool = False

    def shed(self) -> None:
        """Closed by the gate before login, to make room: stop serving it."""
        self.was_shed = True
        if self.task is not None:
            self.task.cancel()


def _revocation_check(config: RayCompanionConfig) -> RevocationCheck | None:
    if config.open_access:
        return None
    from specsteer_companion.auth import TokenStore

    return TokenStore(config.tokens).revoked_among  # type: ignore[arg-type]


async def _end_revoked(entry: Entry) -> None:
    await _refuse(entry.owner.ws, Refusal(ErrorCode.AUTH_FAILED, REVOKED_MESSAGE))


class _HeldEndpoint:
    """A multiplexed 'model': one connection's endpoint; Serve calls `__del__` on eviction."""

    def __init__(self, endpoint: CompanionEndpoint) -> None:
        self.endpoint = endpoint

    def __del__(self) -> None:
        self.endpoint.release()


async def _refuse(ws: WebSocket, refusal: Refusal) -> None:
    with contextlib.suppress(Exception):
        await ws.send_bytes(protocol.encode(protocol.Error(*refusal)))
    await ws.close()


def start(config: RayCompanionConfig, *, blocking: bool = False) -> str:
    """Join (or start) the Ray cluster, deploy the application, return its ws(s):// URL."""
    from specsteer_companion.tls import server_ssl_context

    i = config.ingress
    if i.cert and i.key:
        server_ssl_context(i.cert, i.key)  # a bad certificate fails here, with what to fix
    address = None if config.address == "local" else config.address
    try:
        if address is not None:
            _check_answers(address)
        ray.init(address=address, ignore_reinit_error=True, namespace="specsteer")
    except (ConnectionError, RuntimeError) as exc:
        raise RayUnavailable(
            f"no Ray cluster at {config.address!r} ({exc}); start one with `ray start --head` "
            "on the head node (and `ray start --address HEAD:6379` on the others), or set "
            "`address: local` for a private single-machine cluster") from exc
    serve.start(http_options=HTTPOptions(host=i.host, port=i.port, ssl_keyfile=i.key,
                                         ssl_certfile=i.cert))
    serve.run(build_app(config), name=config.app_name, route_prefix="/", blocking=blocking)
    scheme = "wss" if i.cert else "ws"
    return f"{scheme}://{i.host}:{i.port}"


def _check_answers(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast when the cluster's GCS does not accept a connection: Ray itself retries for
    minutes, logging every 5 s, when `auto` finds the address file of a head that was stopped or
    killed (measured: still waiting after 200 s). `ray://` client addresses are left to Ray."""
    if address.startswith("ray://"):
        return
    from ray._private.services import get_ray_address_from_environment

    resolved = get_ray_address_from_environment(address, None)  # ConnectionError if none found
    host, _, port = resolved.rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port: Ray reports it
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        named, hint = "", ""
        if os.environ.get("RAY_ADDRESS"):
            named = ", from RAY_ADDRESS,"
        elif address == "auto":
            named = ", named by the address file of the last `ray start`,"
            hint = "; a head that was stopped or killed leaves it behind (`ray stop` clears it)"
        raise ConnectionError(f"its GCS at {resolved}{named} does not answer ({why}){hint}") \
            from exc


def wait_forever() -> None:
    """Keep the driver alive (the application lives in the cluster) until Ctrl-C/SIGTERM, then
    take the application down."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()


class RayUnavailable(RuntimeError):
    """Ray is not installed, or no cluster can be reached at the configured address."""
