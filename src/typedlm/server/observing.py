"""One `RequestRecord` per HTTP request, as plain ASGI middleware.

The record is made as the request comes in (`request.state.record`, which the routes fill with tokens and
questions), its status taken from the response's start, its time from arrival to the response's last byte; then
it goes to `done` (the metrics and the request log), also when the app raises (status 500). Plain ASGI rather than
Starlette's `BaseHTTPMiddleware`, which runs every request through an extra task and a memory stream on the event
loop: the loop is shared with everything else the server does, so each request's own cost there counts.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from typedlm.server.metrics import RequestRecord, route_of

Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]


class ObserveRequests:
    def __init__(self, app: ASGIApp, done: Callable[[RequestRecord], None]):
        self.app, self.done = app, done

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(route_of(scope["path"]))
        scope.setdefault("state", {})["record"] = record
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
            record.seconds = time.perf_counter() - started
            self.done(record)
