"""The companion on Ray Serve, on a local Ray cluster this module starts: 2 verifier replicas of
the tiny pair behind one websocket ingress. Sessions spread over the replicas; a replica killed
mid-generation, or the ingress, costs a resync and not a token of the greedy text; a replaced
replica takes sessions again; an unreachable cluster is a one-line error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specsteer import protocol
from specsteer.client import Client
from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.local import LocalChannel
from specsteer_companion.ray_config import parse_config
from specsteer_companion.verifier import Verifier

if os.environ.get("CI") == "true":  # CI installs the ray extra (./dev setup): never skip there
    import ray
else:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SUBJECT = "Budget for next quarter"
ROOT = Path(__file__).parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_cluster_is_a_clear_error(tmp_path):
    """Runs first, before this module's cluster exists: `address: auto` finds nothing."""
    config = tmp_path / "ray.yaml"
    config.write_text("address: auto\nopen_access: true\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(ROOT / p) for p in ("sdk", "cloud_companion", "lab"))}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "specsteer_companion.cli", "ray", "serve",
                           "--config", str(config)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 1
    assert "error: no Ray cluster at 'auto'" in done.stderr and "ray start --head" in done.stderr


@pytest.fixture(scope="module")
def cluster():
    from ray import serve

    from specsteer_companion import ray_app

    port = _free_port()
    config = parse_config({
        "address": "local", "open_access": True,
        "models": {"generalist": str(tiny_model_dir("llama", seed=1)),
                   "specialist": str(tiny_model_dir("llama", seed=0))},
        "verifier": {"min_replicas": 2, "max_replicas": 2, "num_cpus": 0.5,
                     "health_check_period_s": 2},
        "ingress": {"port": port, "num_cpus": 0.25, "replica_timeout_s": 20},
    })
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20,
             namespace="specsteer")
    try:
        url = ray_app.start(config)
        yield url, f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model, tiny_generalist):
    """The uninterrupted text, from one in-process companion."""
    verifier = Verifier(tiny_generalist, tiny_model)
    client = Client(tiny_model, companion=lambda: LocalChannel.for_verifier(verifier))
    return client.generate(SUBJECT, max_new_tokens=40, k=2)


def _stats(http: str) -> dict:
    with urllib.request.urlopen(f"{http}/stats", timeout=10) as reply:
        return json.loads(reply.read())


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
    url, http = cluster
    before = _stats(http)["sessions"]
    for _ in range(4):
        result = Client(tiny_model, companion=url).generate(SUBJECT, max_new_tokens=40, k=2,
                                                            offline="fail")
        assert result.tokens == reference.tokens
    served = {replica: n - before.get(replica, 0) for replica, n in
              _stats(http)["sessions"].items()}
    assert len([n for n in served.values() if n > 0]) == 2, served


def test_a_killed_replica_costs_a_resync_not_a_token(cluster, tiny_model, reference):
    url, http = cluster
    before = _stats(http)["sessions"]

    def this_sessions_replica() -> str:
        now = _stats(http)["sessions"]
        [replica] = [r for r, n in now.items() if n > before.get(r, 0)]
        return replica

    tap = _KillAt(5, this_sessions_replica)  # Hello, OpenSession, then the 3rd draft
    client = Client(tiny_model, companion=url, tap=tap)
    result = client.generate(SUBJECT, max_new_tokens=40, k=2, offline="wait(60)")
    assert tap.killed is not None
    assert result.tokens == reference.tokens and result.provenance == reference.provenance
    assert not result.stats.degraded
    resumes = [f for f in tap.sent if f[1] == protocol.MessageType.RESUME]
    assert len(resumes) == 1
    after = _stats(http)
    assert sum(after["resumes"].values()) == 1 and tap.killed not in after["resumes"]

    # Serve replaces the dead replica; new sessions reach the new one
    deadline = time.monotonic() + 120
    seen = set(after["sessions"])
    while time.monotonic() < deadline:
        Client(tiny_model, companion=url).generate(SUBJECT, max_new_tokens=4, offline="wait(60)")
        if set(_stats(http)["sessions"]) - seen - {tap.killed}:
            break
        time.sleep(1)
    else:
        pytest.fail(f"no new replica took a session: {_stats(http)}")


def test_a_restarted_ingress_costs_a_reconnect_not_a_token(cluster, tiny_model, reference):
    url, _ = cluster
    from ray.serve import context

    def ingress() -> str:
        actors = ray.util.list_named_actors(all_namespaces=True)
        [name] = [a["name"] for a in actors
                  if a["namespace"] == "serve" and "#Ingress#" in a["name"]]
        return name

    assert context  # the serve namespace exists once the app runs
    tap = _KillAt(6, ingress)
    client = Client(tiny_model, companion=url, tap=tap)
    result = client.generate(SUBJECT, max_new_tokens=40, k=2, offline="wait(120)")
    assert tap.killed is not None
    assert result.tokens == reference.tokens and result.provenance == reference.provenance
    assert [f[1] for f in tap.sent].count(protocol.MessageType.RESUME) >= 1


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
])
def test_bad_configs_say_what_to_fix(data, message):
    from specsteer.errors import CompanionConfigError

    with pytest.raises(CompanionConfigError, match=message):
        parse_config(data)
