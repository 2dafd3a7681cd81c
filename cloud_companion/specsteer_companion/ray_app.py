"""The companion on Ray Serve: a websocket ingress in front of N verifier replicas.

Owns the two deployments and how a session stays on its replica. A `VerifierReplica` loads the
models once and holds, per device connection, one `CompanionEndpoint` (protocol state machine,
auth, KV caches: the very class the single-process server runs). The `Ingress`, one replica for
the whole cluster by design, listens for devices itself with the single-process server's
websocket front (`server.WebSocketFront`: Serve's HTTP proxy is not in the path) and admits each
connection and frame through its `AdmissionGate`, so for the whole cluster: connections per
address, in total and before login (the oldest of the busiest address shed when full, at
accept), Hello deadline, idle time, frame size, requests per connection, prompt tokens per
device, sessions per device and in total; and it ends the live connections of revoked tokens
(`revocation`). The gate decodes each frame once; the ingress forwards the message to the
replica holding that connection, tagged with its connection id:
`ray_routing.SessionAffinityRouter` sends every request of an id to the replica it placed the
first one on, and the replica keeps the id's endpoint in Serve's multiplexed-model cache
(`max_sessions` per replica, least recently used evicted). Should a frame land on a replica
without its state (its replica died or evicted it), or a replica die or stall, the ingress
closes the websocket, and the device resumes the session on a fresh connection
(`protocol.Resume`), which lands wherever the router puts the new id. TLS terminates at the
ingress (`ingress.cert`/`key`, files on the ingress's node).
"""

# No `from __future__ import annotations`: the classes travel to their replicas by value
# (cloudpickle), where a string annotation could no longer be resolved.
import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import ray
from ray import serve
from ray.serve.config import AutoscalingConfig, ProxyLocation, RequestRouterConfig

from specsteer import protocol
from specsteer.protocol import ErrorCode, Limits, Message
from specsteer_companion import logthrottle
from specsteer_companion.admission import Entry
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.ray_config import RayCompanionConfig
from specsteer_companion.ray_routing import SessionAffinityRouter
from specsteer_companion.revocation import RevocationCheck
from specsteer_companion.server import THROTTLE, TIMEOUTS, FrontEndpoint, WebSocketFront
from specsteer_companion.verifier import Verifier

log = logging.getLogger("specsteer_companion.ray")
RESUME_CLOSE = 1011  # websocket close code of a lost replica: the device resumes elsewhere
HEAD_NODE = "node:__internal_head__"  # Ray's resource of the head node


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
    from specsteer.runtime.folder import resolve_folder

    m = config.models
    if m.engine == "vllm":  # one engine per replica, sized by the replica's GPUs
        from specsteer_companion.vllm_engine import VllmScoring

        g = VllmScoring(m.vllm_options())
    else:
        g = load_model(m.generalist, precision=m.precision, threads=m.threads)
    s = None if m.specialist == "none" else load_model(
        resolve_folder(m.specialist, m.specialist_precision, device=True), threads=m.threads)
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
    """The ingress deployment of `config`: one replica, which listens for devices itself."""
    i = config.ingress

    # on the head node: devices connect to one known address (the head's), as they did to
    # Serve's proxy there
    @serve.deployment(num_replicas=1, ray_actor_options={
        "num_cpus": i.num_cpus, "resources": {HEAD_NODE: 0.001}})
    class Ingress:
        """The cluster's websocket front: a `RayIngressServer` on the configured address, in a
        thread of this replica with an event loop of its own."""

        def __init__(self, verifiers) -> None:  # type: ignore[no-untyped-def]
            self.server = _listen(config, verifiers)  # listening once the constructor returns

        def stats(self) -> dict[str, object]:
            return self.server.stats()

        def check_health(self) -> None:
            """Serve restarts an ingress whose server thread is gone."""
            if not self.server.listening:
                raise RuntimeError("the ingress's websocket server stopped")

    return Ingress


def _listen(config: RayCompanionConfig, verifiers) -> "RayIngressServer":  # type: ignore[no-untyped-def]
    """The ingress's server, listening in a thread of its own (module level: the replica's
    class is pickled by value, and what its methods reference with it)."""
    from specsteer_companion.tls import server_ssl_context

    logthrottle.install(THROTTLE)  # a flood's refusals log a bounded number of lines
    i = config.ingress
    server = RayIngressServer(config, verifiers,
                              server_ssl_context(i.cert, i.key) if i.cert and i.key else None)
    # the standard library's loop: in a Ray worker, uvloop (Ray's event loop policy) never
    # progressed a TLS handshake that the server starts after admission (measured: every one
    # timed out; the same code outside Ray, or on this loop, completes them)
    server.lifetime = server.running(asyncio.SelectorEventLoop)  # held: a collected generator
    # would stop the server
    server.lifetime.__enter__()  # for the replica's life: Serve ends the process
    return server


class ReplicaEndpoint:
    """The ingress's side of one connection whose `CompanionEndpoint` lives on a verifier
    replica (`handle`, bound to the connection's id): what the front's loop needs of it."""

    def __init__(self, handle, limits: Limits) -> None:  # type: ignore[no-untyped-def]
        self.handle = handle
        self.frame_limits = limits
        self.identity: str | None = None
        self.closed = False
        self.close_code, self.close_reason = 1000, ""

    def took(self, reply: Reply) -> None:
        """What the replica's answer says of the connection."""
        self.frame_limits = reply.limits or self.frame_limits
        self.identity = reply.identity or self.identity
        self.closed = reply.closed

    def lose(self) -> None:
        self.closed = True
        self.close_code, self.close_reason = RESUME_CLOSE, "verifier lost: resume"

    def fail(self, code: ErrorCode, message: str) -> list[bytes]:
        if self.closed:
            return []
        self.closed = True
        return [protocol.encode(protocol.Error(code, message))]

    def release(self) -> None:
        """Free the connection's KV caches on its replica now (not when it is evicted)."""
        with contextlib.suppress(Exception):
            self.handle.release.remote()


class RayIngressServer(WebSocketFront):
    """The single-process server's websocket front (admission at accept, the gate for the
    whole cluster, revocation) whose frames are answered by the verifier replica holding each
    connection. Serve's HTTP proxy is not in the path: a flood of sockets meets the gate at
    accept, as on the single process, not a proxy that admits whatever it has room for.
    GET /stats: sessions and resumes per replica, refusals, open connections."""

    reuse_port = True  # a redeploy starts the new ingress before it stops the old

    def __init__(self, config: RayCompanionConfig, verifiers,  # type: ignore[no-untyped-def]
                 ssl_context: ssl.SSLContext | None) -> None:
        super().__init__(config.ingress, check_revoked=_revocation_check(config),
                         ssl_context=ssl_context)
        self.verifiers = verifiers
        self.replica_timeout_s = config.ingress.replica_timeout_s
        self.per_replica: Counter[str] = Counter()  # sessions opened per replica
        self.resumed: Counter[str] = Counter()
        self.lost = 0
        self.http_stats = self.stats
        self.lifetime: contextlib.AbstractContextManager[str] | None = None

    def stats(self) -> dict[str, object]:
        return {"sessions": dict(self.per_replica), "resumes": dict(self.resumed),
                "lost": self.lost, "refused": self.gate.refused, "shed": self.gate.shed,
                "open_connections": self.gate.open_connections(),
                "unauthenticated": self.gate.unauthenticated,
                "open_sessions": self.gate.open_sessions()}

    def endpoint(self) -> ReplicaEndpoint:
        return ReplicaEndpoint(self.verifiers.options(multiplexed_model_id=uuid.uuid4().hex),
                               self.limits)

    async def answer(self, entry: Entry, endpoint: FrontEndpoint, message: Message,
                     size: int) -> list[bytes]:
        """The replica's reply; a replica that died, stalled or holds no state for the
        connection closes it with `RESUME_CLOSE` (the device resumes on a new one)."""
        assert isinstance(endpoint, ReplicaEndpoint)
        try:
            reply = await asyncio.wait_for(endpoint.handle.handle.remote(message, size),
                                           self.replica_timeout_s)
        except (ray.exceptions.RayError, *TIMEOUTS) as exc:
            log.warning("verifier replica lost (%s): the device resumes elsewhere",
                        type(exc).__name__)
            reply = None
        if reply is None or reply.lost:
            self.lost += 1
            endpoint.lose()
            return []
        endpoint.took(reply)
        if isinstance(message, protocol.OpenSession | protocol.Resume):
            self.per_replica[reply.replica] += 1
            if reply.resumed:
                self.resumed[reply.replica] += 1
        return reply.frames


def _revocation_check(config: RayCompanionConfig) -> RevocationCheck | None:
    if config.open_access:
        return None
    from specsteer_companion.auth import TokenStore

    return TokenStore(config.tokens).revoked_among  # type: ignore[arg-type]


class _HeldEndpoint:
    """A multiplexed 'model': one connection's endpoint; Serve calls `__del__` on eviction."""

    def __init__(self, endpoint: CompanionEndpoint) -> None:
        self.endpoint = endpoint

    def __del__(self) -> None:
        self.endpoint.release()


def start(config: RayCompanionConfig) -> str:
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
    serve.start(proxy_location=ProxyLocation.Disabled)  # the ingress listens itself
    serve.run(build_app(config), name=config.app_name, route_prefix=None)
    _wait_for_one_ingress(config.app_name)
    scheme = "wss" if i.cert else "ws"
    return f"{scheme}://{i.host}:{i.port}"


def _wait_for_one_ingress(app_name: str, timeout_s: float = 120.0) -> None:
    """Until the ingress a redeploy replaced has stopped: both listen on the port meanwhile
    (`reuse_port`), and a device that reached the old one would meet the old limits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app = serve.status().applications[app_name]
        if dict(app.deployments["Ingress"].replica_states) == {"RUNNING": 1}:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the replaced ingress of {app_name} did not stop in {timeout_s:.0f} s")


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
