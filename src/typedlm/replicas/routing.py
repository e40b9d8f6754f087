"""Document-affinity routing for Ray Serve: a request goes to the replica that already answered a request on its
document (its prefix cache holds the document's keys and values), else to the least loaded replica, ties to the
replica that holds the fewest documents (random among equals).

It is a Ray Serve request router (`ray.serve.request_router.RequestRouter`), run in the process that holds the
handle (the ingress): the home of each document is remembered when a request is routed, so the next request on it
goes there even while the first is still running. When the home is full (its `max_ongoing_requests` taken) the
request goes to another replica rather than wait. The memory is bounded (the least recently used documents are
forgotten) and a replica that goes away takes its documents with it.

With `affinity=False` every request goes to the least loaded replica, ties at random: the baseline the affinity is
measured against (benchmarks/affinity.py). A request that names a replica (`Forwarded.replica`) goes there: the
ingress's /health and /metrics ask every replica in turn.
"""

from __future__ import annotations

import importlib
import random
from collections import Counter, OrderedDict

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from typedlm.replicas.forwarding import Forwarded

MAX_DOCUMENTS = 1_000_000  # documents whose home is remembered (a key and an id each: ~150 MB at the limit)
_ROUTERS: dict[tuple[str, str], DocumentAffinityRouter] = {}  # this process's, by (app, deployment): the ingress
# lists the replicas through them


def _registry() -> dict[tuple[str, str], DocumentAffinityRouter]:
    """`_ROUTERS`, looked up through the imported module: Ray sends the router class by value (cloudpickle), and a
    class sent so carries its own copy of this module's globals."""
    return importlib.import_module("typedlm.replicas.routing")._ROUTERS


def _forwarded(request: PendingRequest | None) -> Forwarded | None:
    if request is None:
        return None
    return next((arg for arg in request.args if isinstance(arg, Forwarded)), None)


class DocumentAffinityRouter(RequestRouter):
    def initialize_state(self, affinity: bool = True, max_documents: int = MAX_DOCUMENTS) -> None:
        self.affinity = affinity
        self.max_documents = max_documents
        self.homes: OrderedDict[str, ReplicaID] = OrderedDict()  # document key → the replica that has it
        self.documents: Counter[ReplicaID] = Counter()  # documents per replica
        _registry()[(self._deployment_id.app_name, self._deployment_id.name)] = self

    @classmethod
    def of(cls, app: str, deployment: str) -> DocumentAffinityRouter | None:
        """This process's router for a deployment (None before its handle first saw the deployment)."""
        return _registry().get((app, deployment))

    def replica_ids(self) -> list[str]:
        return sorted(replica.unique_id for replica in self.curr_replicas)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        """Ranks of replicas, most preferred first; Ray sends the request to the least loaded replica of the first
        rank that has room."""
        request = _forwarded(pending_request)
        if request is not None and request.replica is not None:
            named = [r for r in candidate_replicas if r.replica_id.unique_id == request.replica]
            return [named or candidate_replicas]
        if not self.affinity or request is None or request.document is None:
            return [random.sample(candidate_replicas, len(candidate_replicas))]
        others = sorted(candidate_replicas, key=lambda r: (self.documents[r.replica_id], random.random()))
        home = self.homes.get(request.document)
        if home is None:
            return [others]
        self.homes.move_to_end(request.document)
        return [[r for r in others if r.replica_id == home], [r for r in others if r.replica_id != home]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: object) -> None:
        request = _forwarded(pending_request)
        if not self.affinity or request is None or request.document is None or request.replica is not None:
            return
        home = self.homes.get(request.document)
        if home is not None and home in self.curr_replicas:
            return  # it stays with the replica that had it first (where the home was full, now both have it)
        if home is not None:
            self.documents[home] -= 1
        self.homes[request.document] = replica_id
        self.documents[replica_id] += 1
        while len(self.homes) > self.max_documents:
            _key, forgotten = self.homes.popitem(last=False)
            self.documents[forgotten] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = set(self.curr_replicas) - {r.replica_id for r in replicas}
        super().update_replicas(replicas)
        for replica_id in gone:
            self._forget(replica_id)

    def _forget(self, replica_id: ReplicaID) -> None:
        if self.documents.pop(replica_id, 0):
            for key in [k for k, home in self.homes.items() if home == replica_id]:
                del self.homes[key]
