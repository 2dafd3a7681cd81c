"""Session affinity placement (`ray_routing.SessionAffinityRouter.choose_replicas`), without a
cluster: Serve's own request metadata and replica ids, replicas that are only their ids (all the
router reads of them). Every frame of a connection goes to one replica; new connections go to
the replica with the fewest open ones; a connection's `release` ends its count; and, through
Serve's own routing loop, a replica chosen for one connection's request is given to that
request, never to another connection's older one."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import pytest

if os.environ.get("CI") == "true":  # CI installs the ray extra (./dev setup): never skip there
    import ray.serve  # noqa: F401
else:
    pytest.importorskip("ray.serve", reason="the ray extra is not installed")

from ray.serve._private.common import (  # noqa: E402
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest  # noqa: E402

from specsteer_companion.ray_routing import RELEASE, SessionAffinityRouter  # noqa: E402

DEPLOYMENT = DeploymentID(name="VerifierReplica", app_name="specsteer-companion")


@dataclass(frozen=True)
class _Replica:
    replica_id: ReplicaID


def _replicas(*names: str) -> list[_Replica]:
    return [_Replica(ReplicaID(name, DEPLOYMENT)) for name in names]


def _router() -> SessionAffinityRouter:
    router = object.__new__(SessionAffinityRouter)  # Serve builds it with its handle's state
    router.initialize_state()
    return router


def _place(router: SessionAffinityRouter, replicas: list[_Replica], connection: str,
           method: str = "handle") -> str:
    async def choose() -> str:
        request = PendingRequest([], {}, RequestMetadata(
            request_id="r", internal_request_id="r", call_method=method,
            multiplexed_model_id=connection))
        [[replica]] = await router.choose_replicas(replicas, request)
        return replica.replica_id.unique_id
    return asyncio.run(choose())


def test_a_connection_stays_on_its_replica_and_new_ones_balance():
    router, replicas = _router(), _replicas("a", "b")
    first = _place(router, replicas, "c1")
    second = _place(router, replicas, "c2")
    assert {first, second} == {"a", "b"}
    assert all(_place(router, replicas, "c1") == first for _ in range(5))
    assert _place(router, replicas, "c1", RELEASE) == first  # released where its state is


def test_released_connections_stop_counting_so_a_new_replica_only_catches_up():
    router = _router()
    one = _replicas("a")
    for n in range(6):  # six connections on the only replica, four of them ended
        _place(router, one, f"c{n}")
    for n in range(4):
        _place(router, one, f"c{n}", RELEASE)
    two = _replicas("a", "b")  # autoscaling added b: a holds 2 open connections
    placed = [_place(router, two, f"new{n}") for n in range(4)]
    assert placed[:2] == ["b", "b"] and sorted(placed[2:]) == ["a", "b"]


def test_a_gone_replica_s_connections_move_on():
    router = _router()
    home = _place(router, _replicas("a", "b"), "c1")
    survivor = "b" if home == "a" else "a"
    assert _place(router, _replicas(survivor), "c1") == survivor


def test_connections_one_after_another_alternate():
    """Each ended before the next began (no open connection to compare): they still alternate,
    so a few sequential sessions cannot pile up on one replica by chance (they did, 1 run in 8,
    with a random tie-break)."""
    router, replicas = _router(), _replicas("a", "b")
    placed = []
    for n in range(6):
        placed.append(_place(router, replicas, f"c{n}"))
        _place(router, replicas, f"c{n}", RELEASE)
    assert placed == ["a", "b", "a", "b", "a", "b"]


@dataclass
class _BusyableReplica:
    """All Serve's routing loop reads of a replica: its id, its cap, and its queue length."""

    replica_id: ReplicaID
    queue_len: int = 0
    max_ongoing_requests: int = 1

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


def test_a_replica_chosen_for_a_connection_s_request_goes_to_that_request():
    """Serve's own routing loop (`_choose_replica_for_request`): connection B's older request
    waits for its full home replica; connection A's request then gets A's free home replica,
    and B's keeps waiting. With Serve's `FIFOMixin` mixed in, A's replica went to B's request
    (the oldest waiting), a frame reached a replica without its session, and the device
    resumed (four resumes in one run of the twelve-devices test)."""

    async def route() -> tuple[str, str | None]:
        router = SessionAffinityRouter(
            deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
        router.initialize_state()  # Serve calls it after building the router
        busy = _BusyableReplica(ReplicaID("a", DEPLOYMENT), queue_len=1)
        free = _BusyableReplica(ReplicaID("b", DEPLOYMENT))
        router.update_replicas([busy, free])

        def request(connection: str) -> PendingRequest:
            return PendingRequest([], {}, RequestMetadata(
                request_id=connection, internal_request_id=connection,
                call_method="handle", multiplexed_model_id=connection))

        older = asyncio.ensure_future(router._choose_replica_for_request(request("B")))
        await asyncio.sleep(0.05)  # B is placed on a (the lower id) and waits for it
        assert router.homes["B"] == busy.replica_id and not older.done()
        chosen = await asyncio.wait_for(router._choose_replica_for_request(request("A")), 5)
        given_to_b = older.result().replica_id.unique_id if older.done() else None
        older.cancel()
        await asyncio.gather(older, return_exceptions=True)
        return chosen.replica_id.unique_id, given_to_b

    assert asyncio.run(route()) == ("b", None)  # FIFOMixin: ("b", "b"), B sent away from home
