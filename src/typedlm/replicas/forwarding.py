"""A request as the ingress hands it to a replica, and its reply: the HTTP request itself (method, path, headers,
body: nothing parsed or re-encoded), so that a replica answers it through the single server's ASGI app exactly as
`typedlm serve` would, status codes, error bodies and headers included.

    reply = await run_asgi(app, Forwarded.of_scope(scope, body, document="..."))
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

Headers = tuple[tuple[bytes, bytes], ...]
log = logging.getLogger("typedlm.replicas")
HOP_BY_HOP = {b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"expect"}


@dataclass(frozen=True)
class Forwarded:
    method: str
    path: str
    raw_path: bytes
    query_string: bytes
    headers: Headers  # as received, lower-case names; the hop-by-hop ones left out
    body: bytes
    client: tuple[str, int] | None = None
    document: str | None = None  # the routing key (`keys.document_key`); None: any replica
    replica: str | None = None  # a replica's id: this request must go to it (the ingress's /health, /metrics)

    @classmethod
    def of_scope(cls, scope: Mapping[str, Any], body: bytes, document: str | None = None) -> Forwarded:
        path, raw_path = app_path(scope)
        return cls(
            method=scope["method"],
            path=path,
            raw_path=raw_path,
            query_string=scope.get("query_string", b""),
            headers=tuple((k.lower(), v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP),
            body=body,
            client=tuple(scope["client"]) if scope.get("client") else None,
            document=document,
        )

    def to(self, replica: str) -> Forwarded:
        return replace(self, replica=replica)


def app_path(scope: Mapping[str, Any]) -> tuple[str, bytes]:
    """The request's path and raw path below the application's route prefix (`root_path`), as the replica's app
    expects them."""
    root, path = scope.get("root_path", ""), scope["path"]
    raw = scope.get("raw_path") or path.encode()
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
        raw = raw[len(root) :] if raw.startswith(root.encode()) else path.encode()
    return path, raw or b"/"


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Headers
    body: bytes
    replica: str = ""  # which replica answered

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


async def run_asgi(app: Any, request: Forwarded, replica: str = "") -> Reply:
    """Run one HTTP request through an ASGI app in this process; the whole response, body and all."""
    headers = [*request.headers, (b"content-length", str(len(request.body)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.raw_path,
        "query_string": request.query_string,
        "root_path": "",
        "headers": headers,
        "client": request.client,
        "server": ("typedlm-replica", 80),
        "state": {},
    }
    answered = asyncio.Event()
    body_sent = False
    status, out_headers, chunks = 500, [], []

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await answered.wait()  # the client stays connected until the response is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status, out_headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    try:
        await app(scope, receive, send)
    except Exception:  # raised after its 5xx was sent, as the app re-raises to its server: log it, keep the reply
        if not answered.is_set():
            raise
        log.exception("%s %s failed after its response was sent", request.method, request.path)
    finally:
        answered.set()
    return Reply(status, tuple((bytes(k), bytes(v)) for k, v in out_headers), b"".join(chunks), replica)
