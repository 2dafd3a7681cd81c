"""Session affinity for the companion on Ray Serve: every frame of a connection goes to the
verifier replica that holds its session (KV caches, protocol state).

`SessionAffinityRouter` is a Serve request router (`ray.serve.request_router`, public API). The
ingress tags each request with its connection id (`multiplexed_model_id`); the first request of
an id goes to the candidate replica holding the fewest sessions of this router, and every later
one to that same replica for as long as it is running. When it is gone, the next request of
the id lands on another replica, which holds no state for it: the ingress closes the device's
connection and the device resumes its session there (`protocol.Resume`).
"""

import random
from collections import Counter, OrderedDict

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

# Connections remembered per router (one router per ingress replica): far more than one
# ingress holds open, so only long-finished connections are forgotten.
MAX_REMEMBERED = 100_000


class SessionAffinityRouter(FIFOMixin, RequestRouter):
    """Sticky, least-loaded placement of connections on replicas."""

    def initialize_state(self, **kwargs: object) -> None:
        self.homes: OrderedDict[str, ReplicaID] = OrderedDict()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        session = pending_request.metadata.multiplexed_model_id if pending_request else ""
        if not session or not candidate_replicas:
            return [candidate_replicas]
        by_id = {replica.replica_id: replica for replica in candidate_replicas}
        home = self.homes.get(session)
        if home not in by_id:
            held = Counter(h for h in self.homes.values() if h in by_id)
            home = min(by_id, key=lambda rid: (held[rid], random.random()))
            self.homes[session] = home
            if len(self.homes) > MAX_REMEMBERED:
                self.homes.popitem(last=False)
        return [[by_id[home]]]
