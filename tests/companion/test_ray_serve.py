"""The companion on Ray Serve, on a local Ray cluster this module starts: 2 verifier replicas of
the tiny pair behind one websocket ingress, over TLS (wss://, a self-signed certificate made
here) with device tokens. Sessions spread over the replicas; a replica killed mid-generation, or
the ingress, costs a resync and not a token of the greedy text; a replaced replica takes
sessions again; a revoked token's live connection ends within seconds, idle or with a frame at
a replica; the caps and budgets hold for the cluster, not per replica; twelve devices hold
sessions at once; autoscaling adds a replica under load, and a replica removed when the load
is gone costs its sessions a resync; an unreachable cluster or a missing Ray is a one-line
error. Devices that do not test a refusal use `offline="wait(...)"`, so that a connect timing
out on the loaded shared machine costs a retry, not the test (the handshakes once left
unanswered were the device's own race: docs/scale.md, `tests/e2e/test_tls_session_tickets.py`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.flooding import DEFAULTS, ULIMIT_256, descriptors_for, flood_module

from specsteer import protocol
from specsteer.client import Client
from specsteer.errors import CompanionError, CompanionTLSError, CompanionUnavailable
from specsteer.link import CompanionLink
from specsteer.models.tiny import tiny_model_dir
from specsteer.protocol import ErrorCode, Limits
from specsteer.transport import WebSocketChannel
from specsteer_companion.auth import TokenStore
from specsteer_companion.limits import DEFAULT_MAX_CONNECTIONS, connection_cap
from specsteer_companion.local import LocalChannel
from specsteer_companion.ray_config import parse_config
from specsteer_companion.revocation import REVOKED_MESSAGE
from specsteer_companion.tls import client_ssl_context, make_self_signed
from specsteer_companion.verifier import Verifier

if os.environ.get("CI") == "true":  # CI installs the ray extra (./dev setup): never skip there
    import ray
else:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SUBJECT = "Budget for next quarter"
SESSION = protocol.SessionSettings(top_k=8)
ROOT = Path(__file__).parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_cluster_is_a_clear_error(tmp_path):
    """Runs first, before this module's cluster exists: `address: auto` finds nothing."""
    config = tmp_path / "ray.yaml"
    config.write_text("address: auto\nopen_access: true\n")
    # Ray's own temporary folder here: a stale address file elsewhere on the machine (a head
    # killed by another run) is the next test's case, not this one's
    done = subprocess.run([sys.executable, "-m", "specsteer_companion.cli", "ray", "serve",
                           "--config", str(config)], capture_output=True, text=True,
                           env={**_env(), "RAY_TMPDIR": str(tmp_path)}, timeout=120)
    assert done.returncode == 1
    assert "error: no Ray cluster at 'auto'" in done.stderr and "ray start --head" in done.stderr


def test_a_killed_heads_address_file_is_a_clear_error_at_once(tmp_path):
    """`address: auto` after the head was killed: Ray's address file names a GCS that is gone.
    Ray itself retries for minutes, logging every 5 s; the CLI says what happened in seconds."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        gone = probe.getsockname()[1]
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{gone}\n")
    config = tmp_path / "ray.yaml"
    config.write_text("address: auto\nopen_access: true\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "specsteer_companion.cli", "ray", "serve",
                           "--config", str(config)], capture_output=True, text=True,
                           env={**_env(), "RAY_TMPDIR": str(tmp_path)}, timeout=120)
    assert done.returncode == 1 and time.monotonic() - started < 30
    [line] = done.stderr.strip().splitlines()  # no Ray log, no traceback
    assert line.startswith("error: no Ray cluster at 'auto' (its GCS at 127.0.0.1:")
    assert f":{gone}, named by the address file of the last `ray start`, does not answer" in line
    assert "`ray stop` clears it" in line and "ray start --head" in line


@pytest.mark.parametrize("missing", ["ray", "yaml"])
def test_ray_not_installed_is_a_clear_error(tmp_path, missing):
    """`import ray` (or the YAML reader that comes with it) fails in the child (None in
    sys.modules): one line saying what to install, no traceback."""
    config = tmp_path / "ray.yaml"
    config.write_text("address: local\nopen_access: true\n")
    run_cli = ("import runpy, sys; sys.modules[sys.argv[2]] = None; "
               "sys.argv = ['specsteer-companion', 'ray', 'serve', '--config', sys.argv[1]]; "
               "runpy.run_module('specsteer_companion.cli', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", run_cli, str(config), missing],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: Ray Serve is not installed (no module '{missing}'): "
        "pip install 'specsteer-companion[ray]'"]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(ROOT / p) for p in ("sdk", "cloud_companion", "lab"))}
    env.pop("RAY_ADDRESS", None)
    return env


@dataclass
class Cluster:
    """The application as deployed now, and what a device needs to reach it."""

    port: int
    cert: Path
    key: Path
    tokens: TokenStore
    secret: str  # a device token for the tests that do not care which

    @property
    def url(self) -> str:
        return f"wss://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def tls(self):  # type: ignore[no-untyped-def]
        return client_ssl_context(self.cert)

    def client(self, model, **options) -> Client:  # type: ignore[no-untyped-def]
        options.setdefault("token", self.secret)
        return Client(model, companion=self.url, ssl_context=self.tls(), **options)

    def link(self, secret: str) -> CompanionLink:
        link = CompanionLink(WebSocketChannel(self.url, ssl_context=self.tls()), timeout=30)
        link.hello(auth_token=secret)
        return link

    def stats(self) -> dict:
        """The ingress's counts, from its replica (its GET /stats page is a connection like
        any other, which the per-address caps these tests set would count)."""
        from ray import serve

        ingress = serve.get_deployment_handle("Ingress", app_name="specsteer-companion")
        return ingress.stats.remote().result(timeout_s=30)

    def stats_page(self) -> dict:
        with urllib.request.urlopen(f"{self.http}/stats", timeout=10,
                                    context=self.tls()) as reply:
            return json.loads(reply.read())

    def deploy(self, **sections: dict) -> None:
        """(Re)deploy the application with these sections over the base ones."""
        from specsteer_companion import ray_app

        base = {
            "address": "local", "tokens": str(self.tokens.path),
            "models": {"generalist": str(tiny_model_dir("llama", seed=1)),
                       "specialist": str(tiny_model_dir("llama", seed=0))},
            "verifier": {"min_replicas": 2, "max_replicas": 2, "num_cpus": 0.5,
                         "health_check_period_s": 2},
            "ingress": {"port": self.port, "num_cpus": 0.25, "replica_timeout_s": 20,
                        "cert": str(self.cert), "key": str(self.key),
                        "revocation_check_s": 0.5},
        }
        config = {**base, **{name: {**base.get(name, {}), **values}
                             for name, values in sections.items()}}
        tls = config["ingress"].get("cert") is not None
        assert ray_app.start(parse_config(config)) == (
            self.url if tls else self.url.replace("wss://", "ws://", 1))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray import serve

    home = tmp_path_factory.mktemp("ray-companion")
    cert, key = make_self_signed(home / "tls")
    tokens = TokenStore(home / "tokens.db")
    deployed = Cluster(_free_port(), cert, key, tokens, tokens.create("test-device").secret)
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20,
             namespace="specsteer")
    try:
        deployed.deploy()
        yield deployed
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model, tiny_generalist):
    """The uninterrupted text, from one in-process companion."""
    verifier = Verifier(tiny_generalist, tiny_model)
    client = Client(tiny_model, companion=lambda: LocalChannel.for_verifier(verifier))
    return client.generate(SUBJECT, max_new_tokens=40, k=2)


def _kill(actor_name: str) -> None:
    ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)


class _KillAt:
    """Frame tap: when the `frames`-th frame goes up, kill what `pick` names."""

    def __init__(self, frames: int, pick) -> None:  # type: ignore[no-untyped-def]
        self.left, self.pick, self.sent = frames, pick, []
        self.killed: str | None = None

    def __call__(self, direction: str, frame: bytes) -> None:
        if direction != "up":
            return
        self.sent.append(frame)
        self.left -= 1
        if self.left == 0:
            self.killed = self.pick()
            _kill(self.killed)


def test_sessions_spread_over_the_replicas(cluster, tiny_model, reference):
    before = cluster.stats()["sessions"]
    for _ in range(4):
        result = cluster.client(tiny_model, connect_timeout_s=5).generate(
            SUBJECT, max_new_tokens=40, k=2, offline="wait(60)")
        assert not result.stats.degraded
        assert result.tokens == reference.tokens
    served = {replica: n - before.get(replica, 0) for replica, n in
              cluster.stats()["sessions"].items()}
    assert len([n for n in served.values() if n > 0]) == 2, served
    assert cluster.stats_page()["sessions"] == cluster.stats()["sessions"]  # GET /stats, wss


class _Barrier:
    """Frame tap: a device's first Draft waits until every device has sent one, so that all of
    them hold an open session at once; `at_once` is the ingress's count at that moment."""

    def __init__(self, devices: int, cluster: Cluster) -> None:
        self.barrier = threading.Barrier(devices, action=self._count, timeout=120)
        self.cluster, self.at_once = cluster, -1

    def _count(self) -> None:
        self.at_once = self.cluster.stats()["open_sessions"]

    def tap(self):  # type: ignore[no-untyped-def]
        waited = []

        def tap(direction: str, frame: bytes) -> None:
            if direction == "up" and frame[1] == protocol.MessageType.DRAFT and not waited:
                waited.append(True)
                self.barrier.wait()
        return tap


def test_more_devices_at_once_than_serve_s_default_of_five(cluster, tiny_model, reference):
    """Every websocket is one request of the ingress for its whole life: twelve devices hold
    sessions at once (each waits at its first draft until all twelve have one open) and every
    text is the in-process companion's. A connect that times out on the shared 2-core machine
    costs a device one connect timeout and a retry (`offline="wait(...)"`); with Serve's
    default of five requests at once the sixth device could never connect while five held
    theirs, and the barrier would break.
    No device resumes: twelve at once is where a router handing a chosen replica to another
    connection's request (Serve's `FIFOMixin`) sent frames to replicas without their state."""
    devices = [cluster.tokens.create(f"device-{n}") for n in range(12)]
    barrier = _Barrier(len(devices), cluster)
    lost_before = cluster.stats()["lost"]
    results: list[object] = []

    def device(secret: str) -> None:
        client = cluster.client(tiny_model, token=secret, tap=barrier.tap(), connect_timeout_s=5)
        try:
            results.append(client.generate(SUBJECT, max_new_tokens=40, k=2, offline="wait(60)"))
        except Exception as exc:  # noqa: BLE001 - reported below
            results.append(exc)

    threads = [threading.Thread(target=device, args=(d.secret,)) for d in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert len(results) == len(devices), results
    assert barrier.at_once >= len(devices)
    for result in results:
        assert not isinstance(result, BaseException), result
        assert result.tokens == reference.tokens and not result.stats.degraded
        assert result.stats.resyncs == 0  # every frame reached its session's replica
    assert cluster.stats()["lost"] == lost_before


def test_tls_only_for_devices_that_trust_the_certificate(cluster, tiny_model):
    assert cluster.url.startswith("wss://")
    untrusting = Client(tiny_model, companion=cluster.url, token=cluster.secret,
                        ssl_context=client_ssl_context())  # system CAs only
    with pytest.raises(CompanionTLSError):
        untrusting.generate(SUBJECT, max_new_tokens=4, offline="fail")
    plain = Client(tiny_model, companion=f"ws://127.0.0.1:{cluster.port}", token=cluster.secret)
    with pytest.raises(CompanionUnavailable):
        plain.generate(SUBJECT, max_new_tokens=4, offline="fail")


def test_a_wrong_token_is_refused(cluster, tiny_model):
    with pytest.raises(CompanionError) as info:
        cluster.client(tiny_model, token="sst_0000000000000000_" + "x" * 43).generate(
            SUBJECT, max_new_tokens=4, offline="fail")
    assert info.value.code == ErrorCode.AUTH_FAILED


def test_revoking_a_token_ends_its_live_connection(cluster):
    device = cluster.tokens.create("alice-phone")
    bystander = cluster.tokens.create("bob-phone")
    links = [cluster.link(secret) for secret in (device.secret, bystander.secret)]
    for link in links:
        link.open([1, 2, 3], SESSION)
    open_before = cluster.stats()["open_connections"]
    assert cluster.tokens.revoke(device.token_id)
    started = time.monotonic()
    frame = links[0].channel.recv(timeout=10)  # the ingress speaks first
    error = protocol.decode(frame, Limits())
    assert isinstance(error, protocol.Error) and error.code == ErrorCode.AUTH_FAILED
    assert error.message == REVOKED_MESSAGE
    assert time.monotonic() - started < 3  # checked every 0.5 s here, 2 s by default
    assert links[1].verify([5, 6]).accepted >= 0  # the other device goes on
    _until(lambda: cluster.stats()["open_connections"] == open_before - 1)  # slot freed
    for link in links:
        link.close()
    with pytest.raises(CompanionError, match="revoked"):  # and it cannot come back
        cluster.link(device.secret)


def _replica_of(cluster: Cluster, opened) -> str:  # type: ignore[no-untyped-def]
    """The verifier replica that took the session `opened()` opens."""
    before = cluster.stats()["sessions"]
    opened()
    [replica] = [r for r, n in cluster.stats()["sessions"].items() if n > before.get(r, 0)]
    return replica


def _pid(actor_name: str) -> int:
    actor = ray.get_actor(actor_name, namespace="serve")
    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))


def test_revoking_a_token_with_a_frame_at_a_replica(cluster):
    """The device's Draft is at its replica (the replica process stopped with SIGSTOP, i.e. a
    slow replica) when its token is revoked: the watch marks the busy connection, the frame
    is answered when the replica resumes, then the connection ends with AUTH_FAILED; the slot
    is freed and the other device goes on."""
    device = cluster.tokens.create("carol-phone")
    bystander = cluster.tokens.create("dave-phone")
    links = [cluster.link(secret) for secret in (device.secret, bystander.secret)]
    replica = _replica_of(cluster, lambda: links[0].open([1, 2, 3], SESSION))
    links[1].open([1, 2, 3], SESSION)
    open_before = cluster.stats()["open_connections"]
    pid = _pid(replica)
    answered: list[object] = []
    os.kill(pid, signal.SIGSTOP)
    try:
        in_flight = threading.Thread(target=lambda: answered.append(links[0].verify([5, 6])))
        in_flight.start()
        time.sleep(0.5)  # the Draft reaches the stopped replica
        assert cluster.tokens.revoke(device.token_id)
        time.sleep(2)  # four revocation checks (every 0.5 s) while the frame is out
        assert in_flight.is_alive() and not answered  # still at the replica
    finally:
        os.kill(pid, signal.SIGCONT)
    in_flight.join(30)
    assert answered and answered[0].accepted >= 0  # the frame in flight was answered...
    error = protocol.decode(links[0].channel.recv(timeout=10), Limits())  # ...then the end
    assert isinstance(error, protocol.Error) and error.code == ErrorCode.AUTH_FAILED
    assert error.message == REVOKED_MESSAGE
    assert links[1].verify([5, 6]).accepted >= 0  # the other device goes on
    _until(lambda: cluster.stats()["open_connections"] == open_before - 1)  # slot freed
    for link in links:
        link.close()
    with pytest.raises(CompanionError, match="revoked"):
        cluster.link(device.secret)


def _until(condition, within_s: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        time.sleep(0.2)


def _generate_killing_its_replica(cluster, model, offline: str):  # type: ignore[no-untyped-def]
    """A generation whose replica is killed at its third draft: (result, the kill tap)."""
    before = cluster.stats()["sessions"]

    def this_sessions_replica() -> str:
        now = cluster.stats()["sessions"]
        [replica] = [r for r, n in now.items() if n > before.get(r, 0)]
        return replica

    tap = _KillAt(5, this_sessions_replica)  # Hello, OpenSession, then the 3rd draft
    result = cluster.client(model, tap=tap).generate(SUBJECT, max_new_tokens=40, k=2,
                                                     offline=offline)
    assert tap.killed is not None
    return result, tap


def test_a_killed_replica_costs_a_resync_not_a_token(cluster, tiny_model, reference):
    result, tap = _generate_killing_its_replica(cluster, tiny_model, "wait(60)")
    assert result.tokens == reference.tokens and result.provenance == reference.provenance
    assert not result.stats.degraded
    resumes = [f for f in tap.sent if f[1] == protocol.MessageType.RESUME]
    assert len(resumes) == 1
    after = cluster.stats()
    assert sum(after["resumes"].values()) == 1 and tap.killed not in after["resumes"]

    # Serve replaces the dead replica; new sessions reach the new one
    deadline = time.monotonic() + 120
    seen = set(after["sessions"])
    while time.monotonic() < deadline:
        cluster.client(tiny_model).generate(SUBJECT, max_new_tokens=4, offline="wait(60)")
        if set(cluster.stats()["sessions"]) - seen - {tap.killed}:
            break
        time.sleep(1)
    else:
        pytest.fail(f"no new replica took a session: {cluster.stats()}")


@pytest.mark.vllm
def test_replicas_on_vllm_engines_cost_a_resync_when_killed(cluster):
    """`models.engine: vllm`: each replica serves the Generalist from its own vLLM engine; the
    text is the ONNX Runtime companion's, and a replica killed mid-generation costs a Resume."""
    from specsteer.models.tiny import ENGINE_HEADS, tiny_hf_dir

    try:
        import vllm  # noqa: F401
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: vLLM must be installed ({exc})")
        pytest.skip(f"vLLM is not importable ({exc})")
    from specsteer.runtime import load_model

    spec = load_model(tiny_model_dir("llama", seed=0, **ENGINE_HEADS))
    gen = load_model(tiny_model_dir("llama", seed=1, **ENGINE_HEADS))
    expected = Client(spec, companion=lambda: LocalChannel.for_verifier(Verifier(gen, spec))
                      ).generate(SUBJECT, max_new_tokens=40, k=2)
    cluster.deploy(models={
        "generalist": str(tiny_hf_dir("llama", seed=1, **ENGINE_HEADS)),
        "specialist": str(tiny_model_dir("llama", seed=0, **ENGINE_HEADS)),
        "engine": "vllm", "vllm": {"dtype": "float32", "kv_cache_gib": 0.25}})
    try:
        plain = cluster.client(spec).generate(SUBJECT, max_new_tokens=40, k=2,
                                              offline="wait(120)")
        assert plain.tokens == expected.tokens and not plain.stats.degraded
        result, tap = _generate_killing_its_replica(cluster, spec, "wait(120)")
        assert result.tokens == expected.tokens and result.provenance == expected.provenance
        assert not result.stats.degraded
        assert [f[1] for f in tap.sent].count(protocol.MessageType.RESUME) == 1
    finally:
        cluster.deploy()  # the tiny ONNX Runtime pair again, for the tests after this one


def test_a_restarted_ingress_costs_a_reconnect_not_a_token(cluster, tiny_model, reference):
    def ingress() -> str:
        actors = ray.util.list_named_actors(all_namespaces=True)
        [name] = [a["name"] for a in actors
                  if a["namespace"] == "serve" and "#Ingress#" in a["name"]]
        return name

    tap = _KillAt(6, ingress)
    client = cluster.client(tiny_model, tap=tap)
    result = client.generate(SUBJECT, max_new_tokens=40, k=2, offline="wait(120)")
    assert tap.killed is not None
    assert result.tokens == reference.tokens and result.provenance == reference.provenance
    assert [f[1] for f in tap.sent].count(protocol.MessageType.RESUME) >= 1


def test_caps_and_budgets_hold_for_the_cluster_not_per_replica(cluster):
    """Two verifier replicas, caps of 1 session per device, 2 in all, 3 connections per address
    and an 8-token prompt budget: the one ingress counts across both replicas (alice's second
    connection is placed on the replica that does not hold her first session, and is refused
    all the same)."""
    cluster.deploy(ingress={"max_sessions_per_identity": 1, "max_sessions": 2,
                            "max_connections_per_address": 3, "prefill_burst": 8,
                            "prefill_tokens_per_second": 0.01})

    def open_connections(n: int) -> None:
        _until(lambda: cluster.stats()["open_connections"] == n)

    alice, bob, carol = (cluster.tokens.create(name) for name in ("alice", "bob", "carol"))
    first = cluster.link(alice.secret)
    first.open([1, 2, 3], SESSION)
    second = cluster.link(alice.secret)
    with pytest.raises(CompanionError) as info:
        second.open([1, 2, 3], SESSION)
    assert info.value.code == ErrorCode.SESSION_LIMIT
    open_connections(1)
    other = cluster.link(bob.secret)
    other.open([1, 2, 3], SESSION)
    third = cluster.link(carol.secret)
    with pytest.raises(CompanionError) as info:
        third.open([1, 2, 3], SESSION)  # the cluster holds 2 sessions: full
    assert info.value.code == ErrorCode.SESSION_LIMIT
    open_connections(2)
    idle = cluster.link(carol.secret)  # the third connection from this address
    with pytest.raises(CompanionUnavailable):  # a fourth is refused
        cluster.link(carol.secret)
    assert cluster.stats()["refused"] == 1
    for link in (first, idle):
        link.close()
    _until(lambda: cluster.stats()["open_sessions"] == 1)
    again = cluster.link(alice.secret)  # a session slot is free, alice's prompt budget is not
    with pytest.raises(CompanionError, match="prompt budget exhausted") as info:
        again.open([1, 2, 3], SESSION)  # 3 + 3 (the refused session's) + 3 > 8
    assert info.value.code == ErrorCode.RATE_LIMITED
    open_connections(1)
    carol_link = cluster.link(carol.secret)
    assert carol_link.open([1, 2, 3], SESSION) == 3  # carol's budget is her own
    for link in (other, carol_link):
        link.close()


def test_autoscaling_adds_a_replica_under_load(cluster, tiny_model, reference):
    """min 1, max 2 replicas, target 1 frame in flight, 1 s upscale delay: 6 devices generating
    at once push the one replica past the target, Serve adds the second, and new sessions go
    to it (the router's least-loaded placement)."""
    from ray import serve

    cluster.deploy(verifier={"min_replicas": 1, "max_replicas": 2, "initial_replicas": 1,
                             "target_ongoing_requests": 1, "upscale_delay_s": 1,
                             "max_ongoing_requests": 16})

    def running() -> int:
        app = serve.status().applications["specsteer-companion"]
        return app.deployments["VerifierReplica"].replica_states.get("RUNNING", 0)

    _until(lambda: running() == 1, within_s=60)
    before = cluster.stats()["sessions"]
    stop, failures, started = threading.Event(), [], time.monotonic()

    def device() -> None:
        client = cluster.client(tiny_model)
        while not stop.is_set():
            result = client.generate(SUBJECT, max_new_tokens=40, k=2, offline="wait(60)")
            if result.tokens != reference.tokens:
                failures.append(result.tokens)

    threads = [threading.Thread(target=device) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:
        _until(lambda: running() == 2, within_s=120)
        scaled_after = time.monotonic() - started
        _until(lambda: len([r for r, n in cluster.stats()["sessions"].items()
                            if n > before.get(r, 0)]) == 2, within_s=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    print(f"scaled from 1 to 2 replicas {scaled_after:.1f} s after the load began")
    assert not failures


def test_scaling_down_resumes_the_removed_replica_s_sessions(cluster, tiny_model, reference):
    """min 1, max 2, two replicas running, a 12 s downscale delay: two devices pause mid-
    generation with their sessions on the two replicas (each waits in its frame tap), Serve
    removes the idle replica it picks, and when the devices go on, the one whose replica went
    resumes on the other (one Resume) with the same greedy text; new sessions still work."""
    from ray import serve

    cluster.deploy(verifier={"min_replicas": 1, "max_replicas": 2, "initial_replicas": 2,
                             "target_ongoing_requests": 1, "upscale_delay_s": 600,
                             "downscale_delay_s": 12})

    def replicas() -> dict[str, int]:
        app = serve.status().applications["specsteer-companion"]
        return dict(app.deployments["VerifierReplica"].replica_states)

    _until(lambda: replicas() == {"RUNNING": 2}, within_s=60)
    before = cluster.stats()["sessions"]
    paused = [threading.Event(), threading.Event()]
    go_on = threading.Event()
    sent: list[list[bytes]] = [[], []]
    results: list[object] = [None, None]

    def device(n: int) -> None:
        def tap(direction: str, frame: bytes) -> None:
            if direction != "up":
                return
            sent[n].append(frame)
            if len(sent[n]) == 5:  # Hello, OpenSession, two drafts answered: pause
                paused[n].set()
                go_on.wait(180)

        client = cluster.client(tiny_model, tap=tap)
        results[n] = client.generate(SUBJECT, max_new_tokens=40, k=2, offline="wait(60)")

    threads = [threading.Thread(target=device, args=(n,)) for n in range(2)]
    try:
        for n, thread in enumerate(threads):
            thread.start()
            assert paused[n].wait(60)
        holding = {r for r, k in cluster.stats()["sessions"].items() if k > before.get(r, 0)}
        assert len(holding) == 2, holding  # one session on each replica
        started = time.monotonic()
        _until(lambda: replicas() == {"RUNNING": 1}, within_s=120)  # the other one is gone
        print(f"scaled from 2 to 1 replica {time.monotonic() - started:.1f} s after idling")
    finally:
        go_on.set()
        for thread in threads:
            thread.join(120)
    assert all(r is not None and r.tokens == reference.tokens for r in results), results
    resumes = [[f[1] for f in frames].count(protocol.MessageType.RESUME) for frames in sent]
    assert sorted(resumes) == [0, 1], resumes  # the removed replica's session, only it
    after = cluster.client(tiny_model, connect_timeout_s=5).generate(
        SUBJECT, max_new_tokens=40, k=2, offline="wait(60)")
    assert after.tokens == reference.tokens


def test_the_example_cluster_config_is_valid():
    from specsteer_companion.ray_config import load_config

    config = load_config(ROOT / "cloud_companion" / "examples" / "ray-cluster.yaml")
    assert config.verifier.min_replicas == 2 and config.verifier.num_gpus == 1
    assert config.ingress.cert and config.tokens


@pytest.mark.parametrize(("data", "message"), [
    ({"open_access": True, "verifier": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas"),
    ({"open_access": True, "ingress": {"cert": "c.pem"}}, "both cert and key"),
    ({}, "token store"),
    ({"open_access": True, "verifier": {"replicas": 2}}, "unknown key"),
    ({"open_access": True, "ingress": {"replicas": 2}}, "unknown key"),  # one ingress, always
    ({"open_access": True, "ingress": {"max_sessions": 0}},
     "ingress: max_sessions must be an integer >= 1"),
    ({"open_access": True, "ingress": {"revocation_check_s": 0}}, "revocation_check_s"),
])
def test_bad_configs_say_what_to_fix(data, message):
    from specsteer.errors import CompanionConfigError

    with pytest.raises(CompanionConfigError, match=message):
        parse_config(data)


@pytest.mark.parametrize(("addresses", "per_address", "ingress"), [
    (*ULIMIT_256, {"max_connections": connection_cap(DEFAULT_MAX_CONNECTIONS, 256)}),
    (*DEFAULTS, {}),
], ids=["ulimit-256-caps", "defaults"])
def test_a_device_logs_in_and_generates_during_a_distributed_flood_at_the_ingress(
        cluster, tiny_model, addresses, per_address, ingress):
    """Issue 28's distributed flood at the Ray ingress: silent sockets from many loopback
    addresses, each reopened as soon as it is dropped. The ingress listens itself with the
    single-process server's front (admission at accept: Serve's proxy, which admitted what it
    had room for, once let 9 of 40 logins through), so every login of a real device during the
    flood succeeds: the flood's newcomers are refused at accept by the per-address cap, or
    shed oldest first from the pre-login pool, and the device's connection is neither. The caps
    of a 256-descriptor limit are set as `max_connections` (the replica's own limit is Ray's);
    the defaults are the file's."""
    flood = flood_module()
    descriptors_for(addresses * per_address + 512)
    cluster.deploy(ingress=ingress)
    hosts = [f"127.0.1.{n + 1}" for n in range(addresses)]
    try:
        with flood.Flood(cluster.port, hosts, per_address) as attack:
            _until(lambda: attack.counts.dropped >= 2 * per_address, within_s=60)
            for _ in range(3):
                client = cluster.client(tiny_model, connect_timeout_s=60)
                result = client.generate(SUBJECT, max_new_tokens=8, offline="fail")
                assert not result.stats.degraded
            assert attack.counts.dropped > attack.counts.failed  # it went on all along
        stats = cluster.stats()  # the flood met the gate at accept: refused or shed there
        assert stats["refused"] + stats["shed"] > 0, (stats, attack.counts)
    finally:
        cluster.deploy()


