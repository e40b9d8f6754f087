"""Request bodies: size-limited reading, zstd/gzip decompression (bounded), JSON decoding."""

from __future__ import annotations

import json
import sys
import zlib
from typing import Any

from fastapi import Request

from typedlm.core.errors import InvalidRequest
from typedlm.server.errors import APIError

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd


def _too_large(limit: int) -> APIError:
    return APIError(413, "request_too_large", f"the request body is larger than {limit} bytes (after decompression)")


def _gunzip(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise APIError(400, "invalid_request_error", f"the gzip body is corrupt: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise _too_large(limit)
    return out


def _unzstd(data: bytes, limit: int) -> bytes:
    out = bytearray()
    try:
        while data:  # a body may be several concatenated frames
            decompressor = zstd.ZstdDecompressor()
            out += decompressor.decompress(data, max_length=limit + 1 - len(out))
            if len(out) > limit:
                raise _too_large(limit)
            if not decompressor.eof:
                raise APIError(400, "invalid_request_error", "the zstd body is truncated")
            data = decompressor.unused_data
    except zstd.ZstdError as exc:
        raise APIError(400, "invalid_request_error", f"the zstd body is corrupt: {exc}") from exc
    return bytes(out)


DECODERS = {"gzip": _gunzip, "x-gzip": _gunzip, "zstd": _unzstd}


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, decompressed per Content-Encoding, never more than `limit` bytes at any stage."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    data = b"".join(chunks)
    encodings = [e.strip().lower() for e in request.headers.get("content-encoding", "").split(",") if e.strip()]
    for encoding in reversed(encodings):  # applied in order, so undone in reverse
        if encoding == "identity":
            continue
        if encoding not in DECODERS:
            raise APIError(
                415, "unsupported_media_type", f"Content-Encoding {encoding!r} is not supported; use zstd or gzip"
            )
        data = DECODERS[encoding](data, limit)
    return data


def parse_json(data: bytes) -> Any:
    """JSON from bytes, or InvalidRequest (422, type json_invalid) saying where it broke."""
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"JSON decode error: {exc.msg} at line {exc.lineno} column {exc.colno}", (exc.pos,), "json_invalid"
        ) from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest("the body is not UTF-8 text", (), "json_invalid") from exc
