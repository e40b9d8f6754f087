"""Bearer-key authentication: off without keys; with keys, constant-time comparison against each."""

from __future__ import annotations

import hmac

from fastapi import Request

from typedlm.server.errors import APIError


def _matches(given: str, keys: tuple[str, ...]) -> bool:
    given_bytes = given.encode()
    found = False
    for key in keys:  # compare with every key, so timing does not say which one (or whether any) matched
        found |= hmac.compare_digest(given_bytes, key.encode())
    return found


def check_bearer(request: Request, keys: tuple[str, ...]) -> None:
    """Raise 401 unless auth is off or `Authorization: Bearer <key>` holds a configured key."""
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        message = "an API key is required: send Authorization: Bearer <key>"
    elif scheme.lower() != "bearer" or not token.strip():
        message = "the Authorization header must be 'Bearer <key>'"
    elif not _matches(token.strip(), keys):
        message = "the API key is not valid"
    else:
        return
    raise APIError(401, "authentication_error", message, headers={"WWW-Authenticate": "Bearer"})
