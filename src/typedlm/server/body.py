"""Request bodies: size-limited reading, zstd/gzip decompression (bounded), JSON decoding."""

from __future__ import annotations

import json
import math
import sys
import zlib
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from typedlm.core.errors import InvalidRequest
from typedlm.server.errors import APIError

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd


def _too_large(limit: int, decompressed: bool = False) -> APIError:
    after = " after decompression" if decompressed else ""
    return APIError(413, "request_too_large", f"the request body is larger than {limit} bytes{after}")


def _gunzip(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise APIError(400, "invalid_request_error", f"the gzip body is corrupt: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise _too_large(limit, decompressed=True)
    return out


def _unzstd(data: bytes, limit: int) -> bytes:
    out = bytearray()
    try:
        while data:  # a body may be several concatenated frames
            decompressor = zstd.ZstdDecompressor()
            out += decompressor.decompress(data, max_length=limit + 1 - len(out))
            if len(out) > limit:
                raise _too_large(limit, decompressed=True)
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
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect as exc:  # the client went away mid-upload: nobody to answer, nothing to log as a bug
        raise APIError(400, "client_disconnected", "the client closed the connection before sending the body") from exc
    return decode(b"".join(chunks), request.headers.get("content-encoding", ""), limit)


def decode(data: bytes, content_encoding: str, limit: int) -> bytes:
    """`data` decompressed per a Content-Encoding header's value, never more than `limit` bytes at any stage."""
    encodings = [e.strip().lower() for e in content_encoding.split(",") if e.strip()]
    for encoding in reversed(encodings):  # applied in order, so undone in reverse
        if encoding == "identity":
            continue
        if encoding not in DECODERS:
            raise APIError(
                415, "unsupported_media_type", f"Content-Encoding {encoding!r} is not supported; use zstd or gzip"
            )
        data = DECODERS[encoding](data, limit)
    return data


class NotJSON(InvalidRequest):
    """The bytes are not JSON text at all (syntax, encoding), as opposed to JSON that is refused."""


MAX_JSON_DEPTH = 64  # arrays and objects nested deeper than this are refused (decoding recurses per level)


def _non_finite(name: str) -> float:
    raise InvalidRequest(f"{name} is not a JSON number: numbers must be finite", (), "json_invalid")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidRequest(f"the number {text[:40]} is out of range: numbers must be finite", (), "json_invalid")
    return value


def check_json(value: Any) -> None:
    """Raise InvalidRequest (at the value's path) for nesting deeper than MAX_JSON_DEPTH or text that is not valid
    Unicode (a lone surrogate such as "\\ud800", which no tokenizer or response encoder accepts)."""
    stack: list[tuple[Any, tuple, int]] = [(value, (), 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise InvalidRequest(f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels", path, "json_invalid")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    _check_text(key, path)
                stack.append((child, (*path, key), depth + 1))


def _check_text(text: str, path: tuple) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"text must be valid Unicode: it holds a lone surrogate ({text[exc.start]!r}) at character {exc.start}",
            path,
            "string_unicode",
        ) from exc


def parse_json(data: bytes | str) -> Any:
    """JSON from bytes (or text), or InvalidRequest (422) saying where and why: type json_invalid for what is not
    JSON (syntax, non-finite numbers, nesting deeper than MAX_JSON_DEPTH), string_unicode for lone surrogates."""
    try:
        value = json.loads(data, parse_constant=_non_finite, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise NotJSON(
            f"JSON decode error: {exc.msg} at line {exc.lineno} column {exc.colno}", (exc.pos,), "json_invalid"
        ) from exc
    except UnicodeDecodeError as exc:
        raise NotJSON("the body is not UTF-8 text", (), "json_invalid") from exc
    except RecursionError as exc:
        raise InvalidRequest(f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels", (), "json_invalid") from exc
    except ValueError as exc:  # an integer too long to convert (more than sys.get_int_max_str_digits() digits)
        raise InvalidRequest(f"a JSON number is out of range: {exc}", (), "json_invalid") from exc
    check_json(value)
    return value
