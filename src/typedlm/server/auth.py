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


SCHEME = "bearer "  # RFC 7235: the scheme is case-insensitive, one space, then the token exactly as configured


def check_bearer(request: Request, keys: tuple[str, ...]) -> None:
    """Raise 401 unless auth is off or the one `Authorization` header is `Bearer <key>` with a configured key.

    The token is compared as the HTTP parser hands it over: no trimming, no folding of spaces, tabs or control
    characters (a key with any inside or after it is not the key). The parser has already dropped spaces and tabs
    around the whole value, which are not part of it in HTTP (RFC 9110 5.5), so those are accepted. Two
    Authorization headers are refused rather than one of them picked."""
    if not keys:
        return
    headers = request.headers.getlist("authorization")
    header = headers[0] if headers else ""
    if not headers:
        message = "an API key is required: send Authorization: Bearer <key>"
    elif len(headers) > 1:
        message = "send one Authorization header, not several"
    elif header[: len(SCHEME)].lower() != SCHEME or len(header) == len(SCHEME):
        message = "the Authorization header must be 'Bearer <key>'"
    elif not _matches(header[len(SCHEME) :], keys):
        message = "the API key is not valid"
    else:
        return
    raise APIError(401, "authentication_error", message, headers={"WWW-Authenticate": "Bearer"})
