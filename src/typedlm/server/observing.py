"""One `RequestRecord` per HTTP request, as plain ASGI middleware.

The record is made as the request comes in (`request.state.record`, which the routes fill with tokens and
questions), its status taken from the response's start, its time from arrival to the response's last byte; then
it goes to `done` (the metrics and the request log), also when the app raises (status 500). Plain ASGI rather than
Starlette's `BaseHTTPMiddleware`, which runs every request through an extra task and a memory stream on the event
loop: the loop is shared with everything else the server does, so each request's own cost there counts.

The status recorded is the one the client got. Where the server's connection (`server.protocol`) puts a `Delivery`
in the scope's extensions, it says when the app's response never went out: the connection answered the request
itself (408: the body did not arrive in time; 400: its framing is broken; 503: the bodies still arriving hold the
server's budget), and that status is recorded; or the connection closed before the app's response began (the
client went away, or half-closed its side, which uvicorn takes for a close), recorded as 499, nginx's code for a
request whose client closed the connection: nothing was sent.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from typedlm.server.metrics import RequestRecord, route_of

Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

DELIVERY = "typedlm.delivery"  # the scope's extension where the connection says what became of the response
CLIENT_CLOSED = 499  # the connection closed before the response began: nothing was sent


@dataclass
class Delivery:
    """What the connection did with one request's response (`scope["extensions"][DELIVERY]`), filled in by it."""

    status: int | None = None  # the connection answered with this itself; the app's response was dropped
    lost: bool = False  # the connection closed before the app's response began

    def sent(self, app_status: int) -> int:
        """The status the client got, where the app answered with `app_status`."""
        if self.status is not None:
            return self.status
        return CLIENT_CLOSED if self.lost else app_status


class ObserveRequests:
    def __init__(self, app: ASGIApp, done: Callable[[RequestRecord], None]):
        self.app, self.done = app, done

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(route_of(scope["path"]))
        scope.setdefault("state", {})["record"] = record
        delivery: Delivery | None = scope.get("extensions", {}).get(DELIVERY)
        started = time.perf_counter()

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            record.status = 500
            raise
        finally:
            if delivery is not None:
                record.status = delivery.sent(record.status)
            record.seconds = time.perf_counter() - started
            self.done(record)
