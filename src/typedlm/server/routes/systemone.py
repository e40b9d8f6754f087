"""Jev's routes: POST /v1/systemone (typed questions about a state, answered) and the feedback routes, POST
/v1/systemone/feedback (gold answers in: by the answers' ids, or the request answered again; its labels stored and
learned), GET /v1/systemone/feedback/suggest (which recent answers to label next) and GET /v1/systemone/feedback
(per question family, how honest the answers are). Errors in Jev's shape (`server.errors`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from typedlm.core.answers import Usage
from typedlm.core.labeling import MAX_FAMILY_CHARS, MAX_SUGGESTIONS, LabelsById, parse_post
from typedlm.core.questions import parse_request
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

    forms = ("FeedbackRequest", "FeedbackById", "FeedbackLabels")
    one_of = [{"$ref": f"#/components/schemas/{form}"} for form in forms]
    feedback_body = {"content": {"application/json": {"schema": {"oneOf": one_of}}}}

    @routes.post(
        "/v1/systemone/feedback",
        dependencies=[Depends(authorized)],
        summary="Post gold answers, by the answers' ids or with the request: its labels stored and learned",
        response_model=schemas.FeedbackResponse | schemas.FeedbackByIdResponse,
        responses=error_responses(
            {
                400: "a corrupt compressed body",
                401: "auth on and the key missing or wrong",
                404: "an unknown model, no feedback kept (--feedback-db none), or an answer id not held (and no "
                "state and questions to answer again)",
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
        posted = parse_post(body)
        by_id = isinstance(posted, LabelsById)
        check_model(posted.model if by_id else posted.request.model, served, settings)
        check_feedback()
        result = await served.feedback(posted)
        if "usage" in result:  # answered again: a post of old, or by ids not held with the request sent too
            usage = Usage(result["usage"]["input_tokens"], cached_tokens=result["usage"]["x_cached_tokens"])
            note(request, usage, (posted.fallback if by_id else posted).request.questions)
        return JSONResponse(result)

    @routes.get(
        "/v1/systemone/feedback/suggest",
        dependencies=[Depends(authorized)],
        summary="Which recent answers to label next: a random draw (fair labels) and the most unsure (to teach)",
        response_model=schemas.FeedbackSuggestions,
        responses=error_responses(
            {
                401: "auth on and the key missing or wrong",
                404: "no feedback kept (--feedback-db none)",
                422: f"n outside 1-{MAX_SUGGESTIONS}, or a family key longer than {MAX_FAMILY_CHARS} characters",
            }
        ),
    )
    async def suggest(
        family: Annotated[
            str | None,
            Query(max_length=MAX_FAMILY_CHARS, description="A question family's key (the report's); none: any."),
        ] = None,
        n: Annotated[int, Query(ge=1, le=MAX_SUGGESTIONS, description="Answer ids of each kind, at most.")] = 10,
    ) -> JSONResponse:
        check_feedback()
        return JSONResponse(await served.suggest_labels(family, n))

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
