"""The FastAPI application: routes that translate between the wire and a served model (`typedlm.serving`).

    app = create_app(decider, ServerSettings(api_keys=("secret",)))   # the decider in this process
    app = create_app(ModelProcess(load, settings), settings)           # the model in a process of its own

Routes: POST /v1/systemone, POST and GET /v1/systemone/feedback (gold answers in; the report out), GET /v1/models,
POST /v1/chat/completions, GET /health, GET /metrics (Prometheus),
the playground at / and /playground, docs at /docs (Swagger UI 5, which reads OpenAPI 3.1, from local files).
Every request is observed once (`metrics`): its route, status, time, tokens and questions, for the metrics and the
request log.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from typedlm.core.answers import Usage
from typedlm.core.errors import InvalidRequest
from typedlm.core.questions import (
    MAX_CHARS_PER_TOKEN,
    MAX_LEVELS,
    MAX_OPTIONS,
    MAX_ORDER_READS,
    MIN_LEVELS,
    MIN_OPTIONS,
    Question,
    parse_feedback,
    parse_request,
)
from typedlm.server import chat, schemas
from typedlm.server.auth import check_bearer
from typedlm.server.body import MAX_JSON_DEPTH, parse_json, read_body
from typedlm.server.errors import APIError, install_handlers
from typedlm.server.metrics import RequestLog, RequestRecord, ServerMetrics
from typedlm.server.observing import ObserveRequests
from typedlm.serving.served import DeciderLike, InProcessModel, ServedModel
from typedlm.serving.settings import ServerSettings
from typedlm.serving.status import model_not_found

VERSION = "0.1.0"
DOCS_ASSETS = "/docs-assets"  # Swagger UI's files, served from the fastapi-offline package: /docs works offline


def _responses(statuses: dict[int, str], body: type = schemas.ErrorBody) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error statuses: each with its description and body (422: the validation shape)."""
    return {
        status: {
            "model": schemas.ValidationBody if status == 422 and body is schemas.ErrorBody else body,
            "description": description,
        }
        for status, description in statuses.items()
    }


def limits(settings: ServerSettings, about: Mapping[str, str]) -> str:
    """What a request may cost on this server, as the OpenAPI document's description lists it (Markdown)."""
    context = about.get("context", "unknown")
    tokens = about.get("max_request_tokens", context)
    lines = [
        "**Limits** (each checked before the work it bounds; over one: 413 naming it, 422 for what is malformed):",
        f"- body: {settings.max_body_bytes} bytes, after decompression too; JSON nested at most {MAX_JSON_DEPTH} deep",
        f"- a choice: {MIN_OPTIONS}-{MAX_OPTIONS} options; a score: {MIN_LEVELS}-{MAX_LEVELS} levels; "
        f"x_order_reads: 1-{MAX_ORDER_READS}",
        f"- questions: at most {about.get('max_reads', tokens)} reads (a question, or each of its order reads)",
        f"- tokens: {tokens} per request; each question with the document within the model's context ({context})",
        f"- text: {MAX_CHARS_PER_TOKEN} characters per token of those limits, checked before tokenizing",
    ]
    if "max_forward_mb" in about:
        lines.append(f"- memory: {about['max_forward_mb']} MiB for a request's forward, estimated from its shape")
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
        docs_url=None,  # served below from local files, not a CDN
        redoc_url=None,
    )
    # Swagger UI 5 (fastapi-offline's copy): FastAPI writes OpenAPI 3.1, which Swagger UI 4 cannot render
    app.mount(DOCS_ASSETS, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets")

    playground_page = (Path(__file__).with_name("static") / "playground.html").read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False)
    @app.get("/playground", include_in_schema=False)
    async def playground() -> HTMLResponse:
        """A page to try the server: a document, questions, the answers as bars, the request as curl and Python."""
        return HTMLResponse(playground_page)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
        )

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

    def note(request: Request, usage: Usage, questions: Mapping[str, Question]) -> None:
        """What the request used, for its metrics and log line."""
        record = request.state.record
        record.input_tokens, record.cached_tokens = usage.input_tokens, usage.cached_tokens
        for question in questions.values():
            record.questions[question.kind] = record.questions.get(question.kind, 0) + 1

    async def authorized(request: Request) -> None:  # async: no thread-pool hop per request
        check_bearer(request, settings.api_keys)

    def check_model(model: str | None) -> None:
        if model is not None and model != served.name and model not in settings.aliases:
            raise model_not_found(model, [served.name, *settings.aliases])

    json_body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}}}}

    @app.post(
        "/v1/systemone",
        dependencies=[Depends(authorized)],
        summary="Answer typed questions about a state",
        response_model=schemas.SystemOneResponse,
        responses=_responses(
            {
                400: "a corrupt compressed body",
                401: "auth on and the key missing or wrong",
                404: "an unknown model",
                413: "a body or prompt over the limits",
                415: "an unsupported Content-Encoding",
                422: "invalid JSON or an invalid request",
                503: "the queue is full (Retry-After)",
                504: "the answer took longer than the timeout",
            }
        ),
        openapi_extra={"requestBody": {**json_body, "required": True}},
    )
    async def systemone(request: Request) -> JSONResponse:
        body = parse_json(await read_body(request, settings.max_body_bytes))
        parsed = parse_request(body)
        check_model(parsed.model)
        response = await served.answer(parsed.state, parsed.questions, parsed.calibration, parsed.order_reads)
        note(request, response.usage, parsed.questions)
        return JSONResponse(response.to_wire())

    def check_feedback() -> None:
        if served.describe().get("feedback_db", "none") == "none":
            raise APIError(
                404, "feedback_off", "this server keeps no feedback: start it with --feedback-db PATH to learn from it"
            )

    feedback_body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/FeedbackRequest"}}}}

    @app.post(
        "/v1/systemone/feedback",
        dependencies=[Depends(authorized)],
        summary="Post gold answers: the request answered, its labels stored and learned",
        response_model=schemas.FeedbackResponse,
        responses=_responses(
            {
                400: "a corrupt compressed body",
                401: "auth on and the key missing or wrong",
                404: "an unknown model, or no feedback kept (--feedback-db none)",
                413: "a body or prompt over the limits",
                415: "an unsupported Content-Encoding",
                422: "invalid JSON, an invalid request, or a gold answer that is not one of its question's",
                503: "the queue is full (Retry-After), or the feedback database cannot be written",
                504: "the answer took longer than the timeout",
            }
        ),
        openapi_extra={"requestBody": {**feedback_body, "required": True}},
    )
    async def post_feedback(request: Request) -> JSONResponse:
        body = parse_json(await read_body(request, settings.max_body_bytes))
        posted = parse_feedback(body)
        check_model(posted.request.model)
        check_feedback()
        result = await served.feedback(posted)
        usage = Usage(result["usage"]["input_tokens"], cached_tokens=result["usage"]["x_cached_tokens"])
        note(request, usage, posted.request.questions)
        return JSONResponse(result)

    @app.get(
        "/v1/systemone/feedback",
        dependencies=[Depends(authorized)],
        summary="Per question family: its labels, and how honest the answers are on them",
        response_model=schemas.FeedbackReport,
        responses=_responses(
            {401: "auth on and the key missing or wrong", 404: "no feedback kept (--feedback-db none)"}
        ),
    )
    async def feedback_report() -> JSONResponse:
        check_feedback()
        return JSONResponse(await served.feedback_report())

    @app.get(
        "/v1/models",
        dependencies=[Depends(authorized)],
        response_model=schemas.ModelList,
        summary="List models",
        responses=_responses({401: "auth on and the key missing or wrong"}),
    )
    async def models() -> dict[str, Any]:
        own = {"name": served.name, "description": f"{served.name}, served by typedlm {VERSION}"}
        aliases = [{"name": alias, "description": f"Alias of {served.name}"} for alias in settings.aliases]
        return {"models": [{**m, "release_date": settings.release_date} for m in [own, *aliases]]}

    @app.get(
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

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    chat_body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatRequest"}}}}

    @app.post(
        "/v1/chat/completions",
        summary="A decision in the OpenAI chat shape",
        response_model=schemas.ChatCompletion,
        responses={
            200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
            **_responses(
                {
                    400: "not a decision, or an invalid request",
                    401: "auth on and the key missing or wrong",
                    404: "an unknown model",
                    413: "a body or prompt over the limits",
                    415: "an unsupported Content-Encoding",
                    503: "the queue is full (Retry-After)",
                    504: "the answer took longer than the timeout",
                },
                schemas.ChatErrorBody,
            ),
        },
        openapi_extra={"requestBody": {**chat_body, "required": True}},
    )
    async def chat_completions(request: Request) -> Any:
        try:
            check_bearer(request, settings.api_keys)  # here, not as a dependency: errors in OpenAI's shape
            body = parse_json(await read_body(request, settings.max_body_bytes))
            model, state, questions = chat.parse_chat(body)
            check_model(model)
            response = await served.answer(state, questions, None, None)
            note(request, response.usage, questions)
        except (InvalidRequest, APIError) as exc:  # a refusal: 4xx, and the worker's 503 (queue full) and 504
            return chat.error_response(exc)  # the one table's status and type, in OpenAI's shape
        answers, tokens, cached = (
            response.to_wire()["answers"],
            response.usage.input_tokens,
            response.usage.cached_tokens,
        )
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            events = chat.stream_events(response.model, answers, tokens, cached, include_usage)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return JSONResponse(chat.completion(response.model, answers, tokens, cached))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            description = f"{app.description}\n\n{limits(settings, served.describe())}"
            spec = get_openapi(title=app.title, version=app.version, description=description, routes=app.routes)
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            for body in (schemas.SystemOneRequest, schemas.ChatRequest, schemas.FeedbackRequest):  # the bodies read
                body_schema = body.model_json_schema(ref_template="#/components/schemas/{model}")  # by hand above
                components.update(body_schema.pop("$defs", {}))
                components[body.__name__] = body_schema
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi
    return app
