"""Every error → status code and JSON body, in one place.

Validation errors: 422 {"detail": [{"loc": ["body", ...], "msg", "type"}]}. Other errors:
{"detail": {"error_type", "message"}}. A bad request is never a 5xx (the official SDK retries 5xx).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from typedlm.core.errors import TypedLMError
from typedlm.serving.status import APIError, error_body, error_status


def to_response(exc: Exception) -> JSONResponse:
    """The one mapping from exceptions to HTTP responses (`status.error_status`)."""
    status, body = error_status(exc)
    if isinstance(exc, APIError):  # its own headers (503: Retry-After); the connection stays usable
        return JSONResponse(body, status, headers=exc.headers)
    if status >= 500:
        # after a 5xx the server closes the connection (the exception propagates to it): say so, so that a client
        # does not send its next request on a connection that is about to be reset
        return JSONResponse(body, status, headers=CLOSE)
    return JSONResponse(body, status)


CLOSE = {"Connection": "close"}
_STATUS_TYPES = {401: "authentication_error", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    @app.exception_handler(TypedLMError)
    @app.exception_handler(Exception)
    async def _typed(_: Request, exc: Exception) -> JSONResponse:
        return to_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error_type = _STATUS_TYPES.get(exc.status_code, "invalid_request_error")
        return JSONResponse(error_body(error_type, str(exc.detail)), exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": detail}, 422)
