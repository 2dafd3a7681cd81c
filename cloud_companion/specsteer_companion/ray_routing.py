"""Session affinity for the companion on Ray Serve: every frame of a connection goes to the
verifier replica that holds its session (KV caches, protocol state).

`SessionAffinityRouter` is a Serve request router (`ray.serve.request_router`, public API). The
ingress tags each request with its connection id (`multiplexed_model_id`); the first request of
an id goes to the candidate replica holding the fewest open connections of this router, and
every later one to that same replica for as long as it is running. The ingress's `release`
call, the last request of a connection, also ends the connection here, so that the count is of
open connections: a replica added by autoscaling takes new connections only until it holds as
many as the others. Among replicas holding as many, the one given the fewest connections so far
takes it (then the lower id): sessions that come one after another alternate, never pile up by
chance on one replica. When it is gone, the next request of
the id lands on another replica, which holds no state for it: the ingress closes the device's
connection and the device resumes its session there (`protocol.Resume`).

No `FIFOMixin`: with it, a replica chosen for one connection's request is handed to the oldest
request waiting to be routed, whichever connection that is, so under load (requests queued
while Serve probes the replicas) a frame landed on another connection's replica, found no
state there, and cost its device a resume. Serve's default hands the replica to the very
request it was chosen for.
"""

from collections import Counter, OrderedDict

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

# Connections remembered, a bound against leaks only: far more than the ingress holds open
# (a connection whose `release` never came through is forgotten once this many are newer).
MAX_REMEMBERED = 100_000
RELEASE = "release"  # the verifier method the ingress calls when a connection ends


class SessionAffinityRouter(RequestRouter):
    """Sticky, least-loaded placement of connections on replicas."""

    def initialize_state(self, **kwargs: object) -> None:
        self.homes: OrderedDict[str, ReplicaID] = OrderedDict()
        self.placed: Counter[ReplicaID] = Counter()  # connections given to each, ever

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        metadata = pending_request.metadata if pending_request else None
        session = metadata.multiplexed_model_id if metadata else ""
        if not session or not candidate_replicas:
            return [candidate_replicas]
        by_id = {replica.replica_id: replica for replica in candidate_replicas}
        home = self.homes.get(session)
        if home not in by_id:
            held = Counter(h for h in self.homes.values() if h in by_id)
            home = min(by_id, key=lambda rid: (held[rid], self.placed[rid], str(rid)))
            self.homes[session] = home
            self.placed[home] += 1
            if len(self.homes) > MAX_REMEMBERED:
                self.homes.popitem(last=False)
        if metadata is not None and metadata.call_method == RELEASE:
            del self.homes[session]  # the connection ended: no longer counts on its replica
        return [[by_id[home]]]
