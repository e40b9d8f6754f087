"""The FastAPI application: the shared state (the served model, its metrics, the request log) and the routers that
translate between the wire and it (`routes`, a module per group), in this order:

    app = create_app(decider, ServerSettings(api_keys=("secret",)))   # the decider in this process
    app = create_app(ModelProcess(load, settings), settings)           # the model in a process of its own

Routes: the playground at / and /playground, docs at /docs (`routes.pages`: Swagger UI 5, which reads OpenAPI 3.1,
from local files); POST /v1/systemone, POST and GET /v1/systemone/feedback (gold answers in; the report out), GET
/v1/systemone/feedback/suggest (what to label next) (`routes.systemone`); GET /v1/models (`routes.models`); GET
/health, GET /metrics (Prometheus) (`routes.operations`); POST /v1/chat/completions (`routes.chat`). Errors answer by
one table (`hosting.status.status_of`), in Jev's shape (`errors`) or, on the chat route, OpenAI's (`chat`). Every
request is observed once (`metrics`): its route, status, time, tokens and questions, for the metrics and the request
log.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles

from typedlm.core.description import ModelDescription
from typedlm.core.questions import (
    MAX_CHARS_PER_TOKEN,
    MAX_LEVELS,
    MAX_OPTIONS,
    MAX_ORDER_READS,
    MIN_LEVELS,
    MIN_OPTIONS,
)
from typedlm.core.settings import ServerSettings
from typedlm.hosting.served import DeciderLike, InProcessModel, ServedModel
from typedlm.server import schemas
from typedlm.server.body import MAX_JSON_DEPTH
from typedlm.server.errors import install_handlers
from typedlm.server.metrics import RequestLog, RequestRecord, ServerMetrics
from typedlm.server.observing import ObserveRequests
from typedlm.server.routes import chat, models, operations, pages, systemone

VERSION = "0.1.0"


def limits(settings: ServerSettings, about: ModelDescription) -> str:
    """What a request may cost on this server, as the OpenAPI document's description lists it (Markdown)."""
    context = about.context or "unknown"
    tokens = about.max_request_tokens or context
    lines = [
        "**Limits** (each checked before the work it bounds; over one: 413 naming it, 422 for what is malformed):",
        f"- body: {settings.max_body_bytes} bytes, after decompression too; JSON nested at most {MAX_JSON_DEPTH} deep",
        f"- a choice: {MIN_OPTIONS}-{MAX_OPTIONS} options; a score: {MIN_LEVELS}-{MAX_LEVELS} levels; "
        f"x_order_reads: 1-{MAX_ORDER_READS}",
        f"- questions: at most {about.max_reads or tokens} reads (a question, or each of its order reads)",
        f"- tokens: {tokens} per request; each question with the document within the model's context ({context})",
        f"- text: {MAX_CHARS_PER_TOKEN} characters per token of those limits, checked before tokenizing",
    ]
    if about.max_forward_mb is not None:
        lines.append(f"- memory: {about.max_forward_mb} MiB for a request's forward, estimated from its shape")
    lines.append(
        f"- queue: {settings.max_queue} requests running or waiting (then 503 + Retry-After); "
        f"time: {settings.request_timeout_s:g} s (then 504)"
    )
    return "\n".join(lines)


def create_app(model: DeciderLike | ServedModel, settings: ServerSettings | None = None) -> FastAPI:
    """The app answering with `model`: a served model (`ModelProcess`; its owner closes it), or a decider, which
    the app runs in this process behind a model worker of its own (`InProcessModel`) and closes at shutdown."""
    settings = settings or ServerSettings()
    owned = not isinstance(model, ServedModel)
    served: ServedModel = InProcessModel(model, settings) if owned else model

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        if owned:
            served.close()  # finish in-flight forward passes before exiting

    app = FastAPI(
        title="typedlm",
        version=VERSION,
        description="Typed decisions (noul, choice, score) read from one forward pass; TypeSafe System One API.",
        lifespan=lifespan,
        docs_url=None,  # served by `routes.pages` from local files, not a CDN
        redoc_url=None,
    )
    # Swagger UI 5 (fastapi-offline's copy): FastAPI writes OpenAPI 3.1, which Swagger UI 4 cannot render
    app.mount(pages.DOCS_ASSETS, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets")

    metrics = ServerMetrics(served.describe(), lambda: served.pending, served.stats)
    served.on_timing, served.on_batch = metrics.timing, metrics.batch
    request_log = RequestLog(json_lines=settings.log_format == "json")
    app.state.model = served
    app.state.settings = settings
    app.state.metrics = metrics
    install_handlers(app)

    def observed(record: RequestRecord) -> None:
        metrics.observe(record)
        request_log.write(record)

    app.add_middleware(ObserveRequests, done=observed)

    app.include_router(pages.router(app.openapi_url, app.title))
    app.include_router(systemone.router(served, settings))
    app.include_router(models.router(served, settings, VERSION))
    app.include_router(operations.router(served, metrics))
    app.include_router(chat.router(served, settings))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            description = f"{app.description}\n\n{limits(settings, served.describe())}"
            spec = get_openapi(title=app.title, version=app.version, description=description, routes=app.routes)
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            bodies = (schemas.SystemOneRequest, schemas.ChatRequest, *schemas.FEEDBACK_POSTS)  # the bodies the routes
            for body in bodies:  # read by hand
                body_schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body_schema.pop("$defs", {}))
                components[body.__name__] = body_schema
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi
    return app
