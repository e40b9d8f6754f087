"""Every error → status code and Jev's JSON body, by the one table (`hosting.status.status_of`).

Validation errors: 422 {"detail": [{"loc": ["body", ...], "msg", "type"}]}. Other errors:
{"detail": {"error_type", "message"}}, with the table's headers. A bad request is never a 5xx (the official SDK
retries 5xx). The chat route answers its refusals in OpenAI's shape from the same table (`chat.error_response`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from typedlm.core.errors import TypedLMError
from typedlm.hosting.status import APIError, error_status, http_error, status_of


def to_response(exc: Exception) -> JSONResponse:
    """An exception as a response in Jev's shape: status and body (`status.error_status`), the table's headers
    (503: Retry-After; a failure's 5xx: Connection: close)."""
    status, body = error_status(exc)
    return JSONResponse(body, status, headers=status_of(exc).headers)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    @app.exception_handler(TypedLMError)
    @app.exception_handler(Exception)
    async def _typed(_: Request, exc: Exception) -> JSONResponse:
        return to_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return to_response(http_error(exc.status_code, str(exc.detail), exc.headers))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": detail}, 422)
