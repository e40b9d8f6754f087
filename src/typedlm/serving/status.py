"""Errors as the API states them, in plain Python (no FastAPI): `APIError` (an error with the status it answers
with), and `error_status`, the one mapping from any exception to a status and JSON body, which the server's
responses (`errors`) and the batch job's error records (`typedlm.jobs.batch`) both use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typedlm.core.errors import InvalidRequest, LimitExceeded, StoreError, TypedLMError


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


def error_status(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(status, body) of an exception: 4xx for what the request got wrong, 500 for the rest."""
    if isinstance(exc, APIError):
        return exc.status, error_body(exc.error_type, exc.message)
    if isinstance(exc, LimitExceeded):
        return 413, error_body("request_too_large", str(exc))
    if isinstance(exc, InvalidRequest):
        return 422, validation_body(exc.loc, exc.message, exc.kind)
    if isinstance(exc, StoreError):  # the feedback database: locked, full or gone; the request was not at fault
        return 503, error_body("feedback_unavailable", str(exc))
    if isinstance(exc, TypedLMError):
        return 500, error_body("model_error", str(exc))
    return 500, error_body("internal_error", "the server failed to answer; this is a bug")
