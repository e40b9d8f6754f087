"""What several route modules share: the bearer-key check as a dependency, the check of a request's model, what a
request used noted for its metrics and log line, and the error responses as the OpenAPI document lists them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import Request

from typedlm.core.answers import Usage
from typedlm.core.questions import Question
from typedlm.core.settings import ServerSettings
from typedlm.hosting.served import ServedModel
from typedlm.hosting.status import model_not_found
from typedlm.server import schemas
from typedlm.server.auth import check_bearer


def error_responses(statuses: dict[int, str], body: type = schemas.ErrorBody) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error statuses: each with its description and body (422: the validation shape)."""
    return {
        status: {
            "model": schemas.ValidationBody if status == 422 and body is schemas.ErrorBody else body,
            "description": description,
        }
        for status, description in statuses.items()
    }


def bearer(settings: ServerSettings) -> Callable[[Request], Awaitable[None]]:
    """The dependency that refuses a request without one of `settings.api_keys` (401)."""

    async def authorized(request: Request) -> None:  # async: no thread-pool hop per request
        check_bearer(request, settings.api_keys)

    return authorized


def check_model(model: str | None, served: ServedModel, settings: ServerSettings) -> None:
    """Refuse (404) a request naming a model that is neither the one served nor one of its aliases."""
    if model is not None and model != served.name and model not in settings.aliases:
        raise model_not_found(model, [served.name, *settings.aliases])


def note(request: Request, usage: Usage, questions: Mapping[str, Question]) -> None:
    """What the request used, for its metrics and log line."""
    record = request.state.record
    record.input_tokens, record.cached_tokens = usage.input_tokens, usage.cached_tokens
    for question in questions.values():
        record.questions[question.kind] = record.questions.get(question.kind, 0) + 1
