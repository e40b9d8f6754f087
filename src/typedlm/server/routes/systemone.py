"""Jev's routes: POST /v1/systemone (typed questions about a state, answered) and the feedback routes, POST
/v1/systemone/feedback (gold answers in: the request answered, its labels stored and learned) and GET
/v1/systemone/feedback (per question family, how honest the answers are). Errors in Jev's shape (`server.errors`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from typedlm.core.answers import Usage
from typedlm.core.questions import parse_feedback, parse_request
from typedlm.core.settings import ServerSettings
from typedlm.hosting.served import ServedModel
from typedlm.hosting.status import APIError
from typedlm.server import schemas
from typedlm.server.body import parse_json, read_body
from typedlm.server.routes.common import bearer, check_model, error_responses, note


def router(served: ServedModel, settings: ServerSettings) -> APIRouter:
    """Jev's routes, answered by `served` under `settings` (keys, body limit, aliases)."""
    routes = APIRouter()
    authorized = bearer(settings)
    json_body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}}}}

    @routes.post(
        "/v1/systemone",
        dependencies=[Depends(authorized)],
        summary="Answer typed questions about a state",
        response_model=schemas.SystemOneResponse,
        responses=error_responses(
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
        check_model(parsed.model, served, settings)
        response = await served.answer(
            parsed.state, parsed.questions, parsed.calibration, parsed.order_reads, parsed.handover
        )
        note(request, response.usage, parsed.questions)
        return JSONResponse(response.to_wire())

    def check_feedback() -> None:
        if not served.describe().keeps_feedback:
            raise APIError(
                404, "feedback_off", "this server keeps no feedback: start it with --feedback-db PATH to learn from it"
            )

    feedback_body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/FeedbackRequest"}}}}

    @routes.post(
        "/v1/systemone/feedback",
        dependencies=[Depends(authorized)],
        summary="Post gold answers: the request answered, its labels stored and learned",
        response_model=schemas.FeedbackResponse,
        responses=error_responses(
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
        check_model(posted.request.model, served, settings)
        check_feedback()
        result = await served.feedback(posted)
        usage = Usage(result["usage"]["input_tokens"], cached_tokens=result["usage"]["x_cached_tokens"])
        note(request, usage, posted.request.questions)
        return JSONResponse(result)

    @routes.get(
        "/v1/systemone/feedback",
        dependencies=[Depends(authorized)],
        summary="Per question family: its labels, and how honest the answers are on them",
        response_model=schemas.FeedbackReport,
        responses=error_responses(
            {401: "auth on and the key missing or wrong", 404: "no feedback kept (--feedback-db none)"}
        ),
    )
    async def feedback_report() -> JSONResponse:
        check_feedback()
        return JSONResponse(await served.feedback_report())

    return routes
