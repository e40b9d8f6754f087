"""The HTTP connection: uvicorn's h11 protocol with deadlines on each request's head and body, a JSON 400 for what
is not HTTP/1.1, and a budget on the bytes of bodies still arriving.

Deadlines. uvicorn closes a keep-alive connection that sends nothing for a few seconds, but not one that sends a
byte now and then (a "slowloris"): every byte cancels the idle timer, so a client could hold a connection, its file
descriptor and its bytes for as long as it liked. Here each request's head must arrive whole within
`head_timeout_s` of the connection opening, or of the previous response's end, and its body whole within
`body_timeout_s` of its head (a Content-Length never met, a chunked body without its last chunk); otherwise the
server answers 408 with a JSON body and closes the connection, or, where the app has started its response already
(it answered early), only closes it.

Framing. Where h11 refuses the bytes (a bad request line or header, a bad chunk size or chunk end), uvicorn answers
a plain-text 400, or, once the app has started its response, raises out of `data_received`; here the answer is a
JSON 400 (or only the close, as above). A chunk line ending in a bare LF is refused as soon as it is buffered: h11
waits for a CRLF there, and would otherwise leave it to the body's deadline.

Budget. uvicorn's flow control bounds the bytes waiting for the app to read them (64 KiB a connection), but the app
reads them as they come and keeps them, in its list of chunks, until the body's last byte (`server.body.read_body`
decodes a body whole): 100 connections each one byte short of an 8 MiB body took the HTTP process from 71 to 887
MB, and held it there. `max_pending_body_bytes` bounds those bytes across the server's connections: the bytes handed
to the app of bodies that have not ended (they count until the body's end, the app's answer or the connection's
close). A request that would take the total past it is refused, 503 + Retry-After with a JSON body, and its
connection closed: at its head where its Content-Length does not fit in what is left (one larger than the whole
budget is the app's to refuse: 413 past the body limit), else as its bytes arrive. Refused rather than paused:
pausing the connection whose bytes would pass the budget leaves the bodies already holding it waiting for room that
only their own ends free, so once it is full of bodies that all need more, none ends and all time out together; a
refusal frees its bytes at once, the others go on, and the client knows to retry. The total passes the budget by
one read (256 KiB) at most, until the refusal that follows it. The same 100 connections under the default 64 MiB:
the process at 141 MB, 8 bodies held and 92 requests refused with 503; the 8 got their 408 at 30 s.

Each answer the connection makes itself ends with a lingering close, as nginx's: the answer and a FIN are sent, and
what the client still sends is read and dropped until it closes, or for LINGER_S, so that the client reads the
answer rather than a reset (a socket closed with unread bytes sends RST, which discards what the client had yet to
read). Each request's scope carries a `Delivery` (`server.observing`) that the connection fills in, so that the
request's record says what the client got: the connection's own answer, or nothing where it closed first.

This module is the one place that touches uvicorn's protocol internals:
`uvicorn.run(app, http=bounded_protocol(head_timeout_s, body_timeout_s, max_pending_body_bytes))`.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from typedlm.core.settings import BODY_TIMEOUT_S, HEAD_TIMEOUT_S, MAX_PENDING_BODY_BYTES
from typedlm.server.observing import DELIVERY, Delivery

LINGER_S = 2.0  # after its own answer, the connection reads and drops what the client still sends this long at most
RETRY_AFTER_S = 1  # the budget's 503, as the queue's (ServerSettings.retry_after_s)
BARE_LF = re.compile(rb"(?<!\r)\n")


def _response(status: int, body: dict[str, Any], headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    payload = json.dumps(body).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(payload)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


class PendingBodies:
    """The bytes handed to the app of bodies that have not ended, across one server's connections (one event loop:
    no lock), and their limit."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0


class BoundedProtocol(H11Protocol):
    """H11Protocol whose connections must send each request's head within `head_timeout_s` and its body within
    `body_timeout_s` of the head, whose bodies still arriving hold `pending.limit` bytes at most between them, and
    which answers what h11 refuses with a JSON 400."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    pending: PendingBodies = PendingBodies(MAX_PENDING_BODY_BYTES)  # one per server (`bounded_protocol`)

    _deadline: asyncio.TimerHandle | None = None
    _waiting_for: str | None = None  # "head", "body" or None: what the deadline running is for
    _exchange: RequestResponseCycle | None = None  # the request whose head has arrived, until the next is awaited
    _delivery: Delivery | None = None  # in the exchange's scope
    _chunked = False  # the exchange's body is chunked
    _seen: RequestResponseCycle | None = None  # the last cycle uvicorn started
    _held = 0  # this connection's share of pending.held
    _lingering = False  # answered and closing: what arrives is dropped

    # ------------------------------------------------------------------ uvicorn's hooks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the answer is out; the client's bytes are dropped until it closes
        before = self._body_size()
        super().data_received(data)
        self._after_events(before)

    def on_response_complete(self) -> None:
        self._release()  # the app has answered: what it read of the body it holds no longer
        if self.conn.their_state is not h11.SEND_BODY:
            self._exchange = None  # answered, its body whole: over (a request pipelined behind it comes next)
        before = self._body_size()
        super().on_response_complete()  # where the next request is buffered already, its events are handled here
        self._after_events(before)

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this where h11 raised RemoteProtocolError on the client's bytes, inside its except block
        error = sys.exc_info()[1]
        reason = str(error)[:200] if isinstance(error, h11.RemoteProtocolError) else msg
        self._note_exchange()
        self._answer(400, f"the request is not valid HTTP/1.1: {reason}", "bad_request")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._release()
        if self._exchange is not None and not self._exchange.response_started and self._delivery is not None:
            self._delivery.lost = True  # nothing of the app's response went out (it is dropped if it comes)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._lingering:  # answered already: no h11 state to close
            self.transport.close()
            return
        super().shutdown()

    # ------------------------------------------------------------------ the request in progress

    def _body_size(self) -> tuple[RequestResponseCycle | None, int]:
        return self.cycle, len(self.cycle.body) if self.cycle is not None else 0

    def _note_exchange(self) -> None:
        """Take uvicorn's newest cycle, if it started one, for the request in progress, with a Delivery in its scope
        (before the app's task first runs: it is created, not yet run, in the same callback)."""
        if self.cycle is None or self.cycle is self._seen:
            return
        self._seen = self._exchange = self.cycle
        self._delivery = Delivery()
        self.cycle.scope.setdefault("extensions", {})[DELIVERY] = self._delivery  # type: ignore[typeddict-item]
        self._chunked = (b"transfer-encoding", b"chunked") in self.headers  # as h11 normalises it (the one coding)

    def _after_events(self, before: tuple[RequestResponseCycle | None, int]) -> None:
        """After h11's events were handled: the budget and the bare-LF check for the body arriving, then the deadline
        for what is awaited next."""
        if self._lingering or self.transport.is_closing():
            return
        cycle, size = before
        fresh = self.cycle is not cycle
        self._note_exchange()
        if self.conn.their_state is h11.SEND_BODY:
            assert self.cycle is not None, "h11 is reading a body but uvicorn has no request for it"
            if fresh and self._declared_over_budget():
                return
            self._take(len(self.cycle.body) - (0 if fresh else size))  # what uvicorn buffered for the app just now
            if self.pending.held > self.pending.limit:
                self._refuse_for_budget()
                return
            if self._chunked and self._bare_lf_buffered():
                self._answer(400, "a chunk line ends in a bare LF; chunk lines end in CRLF", "bad_request")
                return
        else:
            self._release()  # the body ended (or none was due): its bytes no longer count
        self._watch()

    def _declared_over_budget(self) -> bool:
        """Refuse, at its head, a request whose Content-Length does not fit in the budget left (one over the whole
        budget is the app's to refuse: 413 past the body limit)."""
        declared = dict(self.headers).get(b"content-length")
        if declared is None or not self.pending.held + int(declared) > self.pending.limit >= int(declared):
            return False
        self._refuse_for_budget()
        return True

    def _bare_lf_buffered(self) -> bool:
        """A chunked body's unparsed bytes hold a line ending in a bare LF (h11 waits for CRLF; a chunk line with an
        LF in it is one h11 refuses once its CRLF comes). Trailers are left to h11, which takes bare LFs there."""
        if getattr(getattr(self.conn, "_reader", None), "_reading_trailer", False):
            return False
        unparsed, _closed = self.conn.trailing_data  # what h11 holds of an event not yet whole (16 KiB at most)
        return BARE_LF.search(unparsed) is not None

    def _take(self, size: int) -> None:
        self._held += size
        self.pending.held += size

    def _release(self) -> None:
        self.pending.held -= self._held
        self._held = 0

    def _refuse_for_budget(self) -> None:
        self._answer(
            503,
            f"the server holds as many bytes of request bodies still arriving as it may ({self.pending.limit}); "
            f"retry after {RETRY_AFTER_S} s",
            "overloaded",
            headers=(("retry-after", str(RETRY_AFTER_S)),),
        )

    # ------------------------------------------------------------------ deadlines

    def _watch(self) -> None:
        """Run the deadline for what the client is to send next: a head (from now, the connection's opening or the
        previous response's end), a body (from its head's arrival), or nothing (the app has the request)."""
        state = self.conn.their_state
        awaited = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if self.transport.is_closing():
            awaited = None
        if awaited == "head":
            self._exchange = None  # the previous request's exchange is over
        if awaited == self._waiting_for:
            return  # a head or body still arriving keeps the deadline it started with
        self._disarm()
        self._waiting_for = awaited
        if awaited is not None:
            seconds = self.head_timeout_s if awaited == "head" else self.body_timeout_s
            self._deadline = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting_for = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._waiting_for == "head":
            detail = f"the request's line and headers did not arrive within {self.head_timeout_s:g} s"
        else:
            detail = f"the request's body did not arrive whole within {self.body_timeout_s:g} s of its head"
        self._answer(408, detail, "timeout")

    # ------------------------------------------------------------------ answering and closing

    def _answer(self, status: int, detail: str, kind: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Answer `status` with {"detail", "type"} and close the connection, lingering; or only close it where the
        app's response to the request in progress has started."""
        self._disarm()
        self._release()
        self._unset_keepalive_if_required()
        exchange = self._exchange
        if exchange is not None and exchange.response_started:
            self.transport.close()
            return
        self.transport.write(_response(status, {"detail": detail, "type": kind}, headers))
        if exchange is not None:  # the app's part: its receive() says the client is gone, its response is dropped
            exchange.disconnected = True
            exchange.waiting_for_100_continue = False  # no "100 Continue" after the answer
            exchange.message_event.set()
            if self._delivery is not None:
                self._delivery.status = status
        self._linger()

    def _linger(self) -> None:
        self._lingering = True
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()  # the answer, then a FIN; the client's EOF closes the transport (eof_received)
        self.flow.resume_reading()
        self._deadline = self.loop.call_later(LINGER_S, self.transport.close)


def bounded_protocol(
    head_timeout_s: float = HEAD_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
    max_pending_body_bytes: int = MAX_PENDING_BODY_BYTES,
) -> type[BoundedProtocol]:
    """The protocol class for `uvicorn.run(http=...)`, with these deadlines for request heads and bodies and this
    budget for the bytes of bodies still arriving, shared by the server's connections."""
    for name, value in (
        ("head timeout", head_timeout_s),
        ("body timeout", body_timeout_s),
        ("budget of pending body bytes", max_pending_body_bytes),
    ):
        if not value > 0:
            raise ValueError(f"the {name} must be positive")
    limits = {
        "head_timeout_s": float(head_timeout_s),
        "body_timeout_s": float(body_timeout_s),
        "pending": PendingBodies(int(max_pending_body_bytes)),
    }
    return type("BoundedProtocol", (BoundedProtocol,), limits)
