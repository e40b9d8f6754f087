"""`APIError`: an error with the status code it answers with. Plain Python (no FastAPI), so that the model worker
raises it without the web framework; `errors` turns it into the response."""

from __future__ import annotations


class APIError(Exception):
    """An error with its status code, error_type and message, raised anywhere in the server."""

    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers
