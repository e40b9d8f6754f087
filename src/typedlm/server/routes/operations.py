"""What an operator asks, without a key: GET /health (liveness, queue depth, cache counters; 503 once the model's
process is gone) and GET /metrics (Prometheus' text format, `server.metrics`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from typedlm.hosting.served import ServedModel
from typedlm.server.metrics import ServerMetrics


def router(served: ServedModel, metrics: ServerMetrics) -> APIRouter:
    """The health of `served` and the server's `metrics`."""
    routes = APIRouter()

    @routes.get(
        "/health",
        summary="Liveness, queue depth and cache counters",
        responses={503: {"description": "the model process is gone (the server must be restarted)"}},
    )
    async def health() -> Any:
        if served.failure is not None:
            return JSONResponse({"status": "error", "model": served.name, "message": served.failure}, 503)
        return {
            "status": "ok",
            "model": served.name,
            "pending": served.pending,
            "max_queue": served.max_pending,
            **served.stats(),
        }

    @routes.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return routes
