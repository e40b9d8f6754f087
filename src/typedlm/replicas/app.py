"""The Ray Serve application: one ingress, N replicas, the single server's HTTP API.

    typedlm serve --replicas 2 [--ray-address auto]            # the CLI builds it from its options
    serve run typedlm.replicas.app:app_builder replicas=2       # or Ray Serve's CLI / a config file's import_path

- `Replica` (N of them, one GPU each on CUDA): a decider and the single server's FastAPI app (`create_app`), with
  its worker, queue, limits, auth, metrics and request log. It answers forwarded HTTP requests through that app, so
  every status code, error body and header is the single server's.
- `Ingress` (one, no model): takes every HTTP request from Ray Serve's proxy, reads the document key from the body
  (`keys.request_keys`) and hands the request to a replica through a handle whose router sends it where its document
  is cached (`routing.DocumentAffinityRouter`). A feedback post that labels answers by id goes to the replica that
  gave them (each answer id starts with its replica's id: `core.labeling`), the only one that holds them; labels
  listed from several replicas' answers are refused (422: post each replica's apart). GET /health, GET /metrics and
  GET /v1/systemone/feedback/suggest ask every replica and answer for all (`fanout`). A request over the body limit
  is cut at the limit (the replica answers 413, as the single server).
- Back-pressure: a replica takes at most `max_queue` requests at once (Ray holds the rest); the ingress holds up to
  `max_queue` more per replica, and beyond that answers 503 with Retry-After, as the single server does when full.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from pydantic import Field
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from typedlm.core.errors import InvalidRequest
from typedlm.core.settings import DEFAULT_ALIASES, ServerSettings
from typedlm.hosting.status import APIError
from typedlm.replicas.fanout import merge_health, merge_metrics, merge_suggestions
from typedlm.replicas.forwarding import Forwarded, Reply, app_path, run_asgi
from typedlm.replicas.keys import CHAT, FEEDBACK, request_keys
from typedlm.replicas.routing import DocumentAffinityRouter
from typedlm.server.chat import error_response
from typedlm.server.errors import to_response

SUGGEST = "/v1/systemone/feedback/suggest"
APP_NAME = "typedlm"
REPLICA = "TypedLMReplica"
INGRESS = "TypedLMIngress"
RETRY_AFTER_S = 1


class ReplicaArgs(ServerSettings):
    """The application's options: `typedlm serve`'s (the model each replica loads, the settings each replica runs
    with) and the replicas'. `serve run typedlm.replicas.app:app_builder KEY=VALUE ...` takes them by name."""

    replicas: int = Field(2, ge=1)
    cpus_per_replica: float = Field(1.0, gt=0)  # Ray CPUs per replica (on CPUs also torch's threads, at least 1)
    affinity: bool = True  # False: every request to the least loaded replica (the baseline the affinity beats)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")


class Replica:
    """One model and the single server's app around it."""

    def __init__(self, args: ReplicaArgs):
        from typedlm.decide.startup import load_served
        from typedlm.hosting.heap import MODEL_MMAP_THRESHOLD_BYTES, freeze_start_up_objects, return_freed_memory
        from typedlm.hosting.threads import on_passing_thread
        from typedlm.runtime.catalog import short_names
        from typedlm.server.app import create_app

        return_freed_memory(MODEL_MMAP_THRESHOLD_BYTES)  # a large forward's blocks go back as freed; the rest when idle

        if not args.on_gpu:
            import torch

            torch.set_num_threads(max(1, int(args.cpus_per_replica)))
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        args = args.model_copy(update={"answer_origin": self.replica_id})  # in its answers' ids: labels come here
        decider = on_passing_thread(lambda: load_served(args))  # see `hosting.threads`
        self.app = create_app(
            decider, args.model_copy(update={"aliases": (*DEFAULT_ALIASES, *short_names(decider.name))})
        )
        freeze_start_up_objects()  # the model and its imports, out of the collector's walks

    async def __call__(self, request: Forwarded) -> Reply:
        return await run_asgi(self.app, request, self.replica_id)

    def __del__(self):
        if hasattr(self, "app"):  # its model loaded
            self.app.state.model.close()  # finish the forward in flight


def _response(reply: Reply) -> Response:
    response = Response(reply.body, reply.status)
    response.raw_headers = [(k, v) for k, v in reply.headers if k.lower() != b"content-length"]
    response.raw_headers.append((b"content-length", str(len(reply.body)).encode()))
    return response


def _overloaded(path: str) -> Response:
    """The 503 of a full queue, in the route's own shape, as the single server's worker answers it."""
    busy = APIError(
        503,
        "overloaded",
        f"every replica is busy; retry after {RETRY_AFTER_S} s",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )
    return error_response(busy) if path == CHAT else to_response(busy)


class Ingress:
    """Every HTTP request in; each to a replica (by its document), or to all of them (/health, /metrics)."""

    def __init__(self, replicas: DeploymentHandle, expected: int, max_body_bytes: int):
        self.replicas = replicas
        self.expected = expected  # replicas asked for: fewer answering is "degraded"
        self.max_body_bytes = max_body_bytes
        self.app_name = serve.get_replica_context().app_name

    async def _body(self, request: Request) -> bytes:
        """The body, cut after `max_body_bytes` + 1 bytes: enough for the replica to answer 413."""
        chunks, size = [], 0
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_body_bytes:
                break
        return b"".join(chunks)[: self.max_body_bytes + 1]

    async def __call__(self, request: Request) -> Response:
        path, _raw = app_path(request.scope)
        if request.method == "GET" and path in ("/health", "/metrics"):
            return await (self._health() if path == "/health" else self._metrics())
        if request.method == "GET" and path == SUGGEST:
            return await self._suggestions(Forwarded.of_scope(request.scope, b""))
        try:
            body = await self._body(request)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody left to answer
        keys = request_keys(path, request.headers.get("content-encoding", ""), body, self.max_body_bytes)
        forwarded = Forwarded.of_scope(request.scope, body, document=keys.document)
        if keys.origins and keys.listed and len(keys.origins) > 1:
            return to_response(
                InvalidRequest(
                    f"these labels name answers of {len(keys.origins)} replicas ({', '.join(keys.origins)}): post "
                    "each replica's apart (an x_id starts with its replica's id and a dot)",
                    ("labels",),
                )
            )
        if path == FEEDBACK and len(keys.origins) == 1:
            forwarded = forwarded.to(keys.origins[0])  # the replica that holds the answers (if it is still there)
        try:
            reply = await self.replicas.remote(forwarded)
        except BackPressureError:
            return _overloaded(path)
        return _response(reply)

    async def _each_replica(self, path: str, request: Forwarded | None = None) -> dict[str, Reply]:
        """GET `path` (or `request`) of every running replica: {replica id: its reply} (those that answered)."""
        request = request or Forwarded("GET", path, path.encode(), b"", ((b"host", b"typedlm-ingress"),), b"")
        router = DocumentAffinityRouter.of(self.app_name, REPLICA)
        if router is None or not router.replica_ids():  # the handle starts its router on its first request
            await self.replicas.remote(request)
            router = DocumentAffinityRouter.of(self.app_name, REPLICA)
        ids = router.replica_ids() if router is not None else []
        replies = {}
        for replica in ids:  # one at a time: requests made while answering one request share its id, by which
            try:  # Ray's router matches a chosen replica to its waiting request
                reply = await self.replicas.remote(request.to(replica))
            except Exception:  # a replica that went away meanwhile: left out of the answer
                continue
            replies[reply.replica] = reply
        return replies

    async def _health(self) -> Response:
        replies = await self._each_replica("/health")
        if not replies:
            return JSONResponse({"status": "starting", "replicas": []}, 503)
        health = merge_health({r: json.loads(reply.body) for r, reply in sorted(replies.items())}, self.expected)
        return JSONResponse(health)

    async def _suggestions(self, request: Forwarded) -> Response:
        """What to label next among every replica's recent answers (`fanout.merge_suggestions`); a replica's refusal
        (auth, a bad query, no feedback kept) as it answered it."""
        replies = await self._each_replica(SUGGEST, request)
        refused = [reply for reply in replies.values() if reply.status != 200]
        if refused or not replies:
            return _response(refused[0]) if refused else to_response(APIError(503, "starting", "no replica yet"))
        n = int(dict(parse_qsl(request.query_string.decode())).get("n", 10))
        return JSONResponse(merge_suggestions([json.loads(reply.body) for reply in replies.values()], n))

    async def _metrics(self) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        replies = await self._each_replica("/metrics")
        texts = {r: reply.body.decode() for r, reply in sorted(replies.items())}
        return Response(merge_metrics(texts), media_type=CONTENT_TYPE_LATEST)


def build_app(args: ReplicaArgs) -> serve.Application:
    """The application: `args.replicas` replicas behind one ingress, routed by document (see the module)."""
    gpu = 1 if args.on_gpu else 0
    replica = serve.deployment(
        Replica,
        name=REPLICA,
        num_replicas=args.replicas,
        max_ongoing_requests=args.max_queue,
        max_queued_requests=args.max_queue * args.replicas,
        ray_actor_options={"num_cpus": 0 if gpu else args.cpus_per_replica, "num_gpus": gpu},
        request_router_config=RequestRouterConfig(
            request_router_class=DocumentAffinityRouter,
            request_router_kwargs={"affinity": args.affinity},
        ),
    )
    ingress = serve.deployment(
        Ingress,
        name=INGRESS,
        num_replicas=1,
        max_ongoing_requests=max(256, 4 * args.max_queue * args.replicas),
        ray_actor_options={"num_cpus": 0},
    )
    return ingress.bind(replica.bind(args), args.replicas, args.max_body_bytes)


def app_builder(args: dict[str, Any]) -> serve.Application:
    """Ray Serve's application builder: `serve run typedlm.replicas.app:app_builder replicas=2 model=NAME`.
    API keys also come from TYPEDLM_API_KEYS, as for `typedlm serve`."""
    from typedlm.core.settings import keys_from_env

    options = ReplicaArgs.model_validate(args)
    options = options.model_copy(update={"api_keys": (*options.api_keys, *keys_from_env())})
    return build_app(options)
