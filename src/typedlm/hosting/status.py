"""Errors as the API states them, in plain Python (no FastAPI): `APIError` (an error with the status it answers
with), and `status_of`, the one table from any exception to what it answers with: status, error_type, message and
headers. Every shape of error body is made from it: Jev's `{"detail": ...}` (`error_status`, which the server's
responses (`server.errors`) and the batch job's error records (`typedlm.jobs.batch`) both use), OpenAI's
`{"error": ...}` of the chat route (`server.chat`), and the HTTP framework's own errors (`http_error`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from typedlm.core.errors import AnswerNotHeld, InvalidRequest, LimitExceeded, StoreError, TypedLMError


class APIError(Exception):
    """An error with its status code, error_type and message, raised anywhere in the server."""

    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers

    def __reduce__(self):  # pickled whole (an answer from the model's own process)
        return type(self), (self.status, self.error_type, self.message, self.headers)


def overloaded(pending: int, retry_after_s: int) -> APIError:
    """The 503 of a request that finds `pending` requests already running or waiting: retry after a while."""
    return APIError(
        503,
        "overloaded",
        f"the model is busy with {pending} requests; retry after {retry_after_s} s",
        headers={"Retry-After": str(retry_after_s)},
    )


def timed_out(timeout_s: float) -> APIError:
    """The 504 of a request not answered within `timeout_s` (it may still be running)."""
    return APIError(504, "timeout", f"the request took longer than {timeout_s:g} s")


def model_not_found(model: str, served: Sequence[str]) -> APIError:
    """The 404 of a request whose `model` is none of the names served."""
    return APIError(404, "model_not_found", f"unknown model {model!r}; this server serves: {', '.join(served)}")


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"detail": {"error_type": error_type, "message": message}}


def validation_body(loc: tuple | list, message: str, kind: str = "value_error") -> dict[str, Any]:
    return {"detail": [{"loc": ["body", *loc], "msg": message, "type": kind}]}


@dataclass(frozen=True)
class ErrorStatus:
    """What an error answers with, whichever shape its body takes."""

    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] | None = None


# after a failure's 5xx (not an APIError's) the server closes the connection (the exception propagates to it): say
# so, so that a client does not send its next request on a connection that is about to be reset
CLOSE = {"Connection": "close"}


def status_of(exc: BaseException) -> ErrorStatus:
    """The one table: what an exception answers with. 4xx for what the request got wrong (never a 5xx: the official
    SDK retries those), 503 for a feedback database that cannot be written, 500 for the rest."""
    if isinstance(exc, APIError):
        return ErrorStatus(exc.status, exc.error_type, exc.message, exc.headers)
    if isinstance(exc, LimitExceeded):
        return ErrorStatus(413, "request_too_large", str(exc))
    if isinstance(exc, InvalidRequest):  # in Jev's body, a validation error: its location, message and kind
        return ErrorStatus(422, "invalid_request_error", str(exc))
    if isinstance(exc, AnswerNotHeld):  # a label by answer id this server no longer holds (or never gave)
        return ErrorStatus(404, "answer_not_held", str(exc))
    if isinstance(exc, StoreError):  # the feedback database: locked, full or gone; the request was not at fault
        return ErrorStatus(503, "feedback_unavailable", str(exc), CLOSE)
    if isinstance(exc, TypedLMError):
        return ErrorStatus(500, "model_error", str(exc), CLOSE)
    return ErrorStatus(500, "internal_error", "the server failed to answer; this is a bug", CLOSE)


# the error_type of an error known by its status alone: the HTTP framework's own (an unknown path, a wrong method)
STATUS_TYPES = {401: "authentication_error", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def http_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> APIError:
    """An error the HTTP framework raised with `status`, as an `APIError` of its type (`STATUS_TYPES`)."""
    kept = dict(headers) if headers is not None else None
    return APIError(status, STATUS_TYPES.get(status, "invalid_request_error"), message, kept)


def error_status(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(status, Jev's JSON body) of an exception, by the table (`status_of`): a refused request's 422 as a validation
    error at its location, every other error as its error_type and message (an answer not held: and its ids, as
    `x_ids`)."""
    error = status_of(exc)
    if error.status == 422 and isinstance(exc, InvalidRequest):
        return error.status, validation_body(exc.loc, exc.message, exc.kind)
    body = error_body(error.error_type, error.message)
    if isinstance(exc, AnswerNotHeld):
        body["detail"]["x_ids"] = list(exc.answer_ids)
    return error.status, body
