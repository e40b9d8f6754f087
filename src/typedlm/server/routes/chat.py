"""POST /v1/chat/completions: a decision in the OpenAI chat shape (the parsing, the completion and its events are
`server.chat`'s). Its refusals are answered in OpenAI's error shape (`server.chat.error_response`), auth's too;
a failure (a 5xx other than the queue's 503 and the timeout's 504) goes to the app's handlers, as on every route."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from typedlm.core.errors import InvalidRequest
from typedlm.core.settings import ServerSettings
from typedlm.hosting.served import ServedModel
from typedlm.hosting.status import APIError
from typedlm.server import schemas
from typedlm.server.auth import check_bearer
from typedlm.server.body import parse_json, read_body
from typedlm.server.chat import completion, error_response, parse_chat, stream_events
from typedlm.server.routes.common import check_model, error_responses, note


def router(served: ServedModel, settings: ServerSettings) -> APIRouter:
    """The chat route, answered by `served` under `settings` (keys, body limit, aliases)."""
    routes = APIRouter()
    chat_body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatRequest"}}}}

    @routes.post(
        "/v1/chat/completions",
        summary="A decision in the OpenAI chat shape",
        response_model=schemas.ChatCompletion,
        responses={
            200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
            **error_responses(
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
            model, state, questions, handover = parse_chat(body)
            check_model(model, served, settings)
            response = await served.answer(state, questions, None, None, handover)
            note(request, response.usage, questions)
        except (InvalidRequest, APIError) as exc:  # a refusal: 4xx, and the worker's 503 (queue full) and 504
            return error_response(exc)
        answers, tokens, cached = (
            response.to_wire()["answers"],
            response.usage.input_tokens,
            response.usage.cached_tokens,
        )
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            events = stream_events(response.model, answers, tokens, cached, include_usage)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return JSONResponse(completion(response.model, answers, tokens, cached))

    return routes
