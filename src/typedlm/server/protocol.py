"""The HTTP connection: uvicorn's h11 protocol with a deadline on every request's head.

uvicorn closes a keep-alive connection that sends nothing for a few seconds, but not one that sends its request
line and headers a byte at a time (a "slowloris"): every byte cancels the idle timer, so a client can hold a
connection, and its file descriptor, open for as long as it likes. Here each request's head must arrive whole
within `head_timeout_s` of the connection opening, or of the previous response's end; otherwise the server answers
408 with a JSON body and closes the connection. Bodies are bounded elsewhere (the body size limit, and the request
timeout once a request reaches the model).

This module is the one place that touches uvicorn's protocol internals: `uvicorn.run(app, http=with_head_timeout(s))`.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from typedlm.server.settings import HEAD_TIMEOUT_S


def _timeout_response(seconds: float) -> bytes:
    body = json.dumps(
        {"detail": f"the request's line and headers did not arrive within {seconds:g} s", "type": "timeout"}
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class HeadDeadlineProtocol(H11Protocol):
    """H11Protocol whose connections must send each request's head within `head_timeout_s`."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # h11 has parsed a whole request head
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request's head is due in full within the deadline too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self.transport.write(_timeout_response(self.head_timeout_s))
        self.transport.close()


def with_head_timeout(seconds: float = HEAD_TIMEOUT_S) -> type[HeadDeadlineProtocol]:
    """The protocol class for `uvicorn.run(http=...)`, with this deadline for request heads."""
    if not seconds > 0:
        raise ValueError("the head timeout must be positive")
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_timeout_s": float(seconds)})
