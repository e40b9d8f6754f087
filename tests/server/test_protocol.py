"""The HTTP connection protocol, through a real server and raw sockets: a head or body that trickles in or stalls is
cut off with a 408, broken framing gets a JSON 400, the bytes of bodies still arriving stay within their budget
(503 past it), and each request's record says what the client got; normal traffic is not touched."""

from __future__ import annotations

import json
import logging
import select
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from typedlm.cli import build_parser
from typedlm.server import ServerSettings, create_app
from typedlm.server.protocol import bounded_protocol

from ..conftest import FakeDecider, ServerThread

DEADLINE_S = 0.6
MARGIN_S = 1.0  # a cut-off comes within its deadline and this, on a loaded machine too
BODY = json.dumps({"model": "jev-latest", "state": "I was charged twice.", "questions": {"b": {"type": "noul"}}})


@pytest.fixture(scope="module")
def url():
    app = create_app(FakeDecider(delay_s=0.2), ServerSettings())  # answers slower than a closing client's EOF
    protocol = bounded_protocol(DEADLINE_S, DEADLINE_S)
    with ServerThread(app, http=protocol, timeout_keep_alive=30) as url:
        yield url


def _connect(url: str) -> socket.socket:
    parsed = urlparse(url)
    return socket.create_connection((parsed.hostname, parsed.port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _head(length: int | None = None, path: str = "/v1/systemone") -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{framing}\r\n\r\n".encode()


def _exchange(url: str, data: bytes, *, half_close: bool = False) -> tuple[bytes, float]:
    """Send `data` on a new connection and read until the server closes it: the reply and the seconds it took."""
    sock = _connect(url)
    started = time.monotonic()
    sock.sendall(data)
    if half_close:
        sock.shutdown(socket.SHUT_WR)
    reply = _read_all(sock)
    sock.close()
    return reply, time.monotonic() - started


def _status_and_json(reply: bytes) -> tuple[int, bytes, dict]:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), reply[:200]
    assert b"content-type: application/json" in head.lower() and b"connection: close" in head.lower(), head
    return int(head.split()[1]), head, json.loads(body)


def _counted(url: str, status: int, route: str = "/v1/systemone") -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "typedlm_requests_total" and sample.labels == {"route": route, "status": str(status)}:
                return sample.value
    return 0.0


def _wait_counted(url: str, status: int, at_least: float) -> float:
    deadline = time.monotonic() + 10
    while (count := _counted(url, status)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


# ---------------------------------------------------------------- heads


def test_a_head_sent_a_byte_at_a_time_gets_408_and_the_connection_closed(url):
    sock = _connect(url)
    started = time.monotonic()
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400
    try:
        for byte in head:  # far slower than the deadline allows, but never idle long
            sock.send(bytes([byte]))
            time.sleep(0.02)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed the connection while the client was still sending
    reply = _read_all(sock)
    sock.close()
    assert time.monotonic() - started < 5 * DEADLINE_S + 1
    status, _, body = _status_and_json(reply)
    assert status == 408 and body["type"] == "timeout" and "line and headers" in body["detail"]


def test_a_silent_connection_is_closed_too(url):
    sock = _connect(url)
    reply = _read_all(sock)  # nothing sent: the deadline runs from the connection's opening
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408")


def test_keep_alive_requests_slower_than_the_deadline_in_total_are_served(url):
    with httpx.Client(base_url=url) as client:
        for _ in range(3):  # the deadline restarts after each response and stops at each complete head
            assert client.get("/health").status_code == 200
            time.sleep(DEADLINE_S / 2)
        assert client.get("/health").status_code == 200


class _Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_malformed_head_gets_a_json_400():
    app = create_app(FakeDecider(), ServerSettings())
    with ServerThread(app, http=bounded_protocol()) as url:
        reply, _ = _exchange(url, b"GET /health HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n")
    status, _, body = _status_and_json(reply)
    assert status == 400 and body["type"] == "bad_request" and "not valid HTTP/1.1" in body["detail"]


def test_a_malformed_request_pipelined_behind_a_good_one_gets_a_json_400_after_its_answer(url):
    good = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    reply, _ = _exchange(url, good + b"GET /health HTTP/1.1\r\nbad header line\r\n\r\n")
    first, second = reply.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200") and second.startswith(b"400"), reply
    assert _status_and_json(b"HTTP/1.1 " + second)[2]["type"] == "bad_request"


# ---------------------------------------------------------------- bodies


@pytest.mark.parametrize(
    "data",
    [
        _head(len(BODY)) + BODY[:10].encode(),  # a body that stops
        _head(8_000_000) + b" " * 100,  # a Content-Length far from met
        _head() + b'5\r\n{"a":\r\n',  # chunks without the last one
    ],
    ids=["stalled", "content-length-unmet", "chunked-without-last-chunk"],
)
def test_a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closed(url, data):
    before = _counted(url, 408)
    reply, seconds = _exchange(url, data)
    status, _, body = _status_and_json(reply)
    assert status == 408 and body["type"] == "timeout" and "body did not arrive" in body["detail"], body
    assert DEADLINE_S * 0.9 < seconds < DEADLINE_S + MARGIN_S
    assert _wait_counted(url, 408, before + 1) == before + 1  # recorded as what was sent, not the app's 400


def test_the_body_deadline_runs_from_the_head_whatever_the_pace(url):
    sock = _connect(url)
    started = time.monotonic()
    sock.sendall(_head(len(BODY)))
    for byte in BODY.encode()[:-1] * 10:  # a byte every 20 ms, far longer than the deadline: never idle
        if select.select([sock], [], [], 0)[0]:
            break  # the answer has come
        sock.send(bytes([byte]))
        time.sleep(0.02)
    answered = time.monotonic() - started
    reply = _read_all(sock)  # the server lingers, then closes once the client stops sending
    sock.close()
    assert DEADLINE_S * 0.9 < answered < DEADLINE_S + MARGIN_S
    assert _status_and_json(reply)[0] == 408


def test_a_slow_body_within_the_deadline_is_served_and_the_connection_kept(url):
    sock = _connect(url)
    body = BODY.encode()
    sock.sendall(_head(len(body)))
    for start in range(0, len(body), len(body) // 4 + 1):  # the body in 4 pieces over ~0.3 s
        time.sleep(0.075)
        sock.sendall(body[start : start + len(body) // 4 + 1])
    reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")  # the same connection, the next request
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.close()


def test_a_body_after_an_early_answer_is_cut_off_without_a_second_answer(url):
    # over the body limit by its Content-Length: the app answers 413 at once, the body never comes
    reply, seconds = _exchange(url, _head(64 << 20) + b"{")
    assert reply.startswith(b"HTTP/1.1 413") and reply.count(b"HTTP/1.1") == 1, reply
    assert DEADLINE_S * 0.9 < seconds < DEADLINE_S + MARGIN_S  # closed at the body's deadline, not held


@pytest.mark.parametrize(
    "chunks",
    [b'5\n{"a":\n', b'5\r\n{"a":\r\n0\n\n', b"zz\r\n", b'5\r\n{"a":XX0\r\n\r\n'],
    ids=["bare-lf-size-line", "bare-lf-last-chunk", "bad-size", "bad-chunk-end"],
)
def test_broken_chunked_framing_gets_a_json_400_at_once(url, chunks):
    before = _counted(url, 400)
    reply, seconds = _exchange(url, _head() + chunks)
    status, _, body = _status_and_json(reply)
    assert status == 400 and body["type"] == "bad_request", body
    assert seconds < DEADLINE_S  # not left to the deadline
    assert _wait_counted(url, 400, before + 1) == before + 1


def test_a_complete_chunked_body_is_served(url):
    body = BODY.encode()
    reply, _ = _exchange(url, _head() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) + b"")
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


# ---------------------------------------------------------------- what the client got, recorded


def test_a_client_that_half_closes_after_its_request_is_recorded_as_closed_not_200(url):
    before_ok, before_closed = _counted(url, 200), _counted(url, 499)
    request = _head(len(BODY)) + BODY.encode()
    reply, _ = _exchange(url, request, half_close=True)  # uvicorn takes the EOF for a close: nothing comes back
    assert reply == b""
    assert _wait_counted(url, 499, before_closed + 1) == before_closed + 1
    assert _counted(url, 200) == before_ok


def test_a_client_that_half_closes_mid_body_is_recorded_as_closed(url):
    before = _counted(url, 499)
    reply, _ = _exchange(url, _head(len(BODY)) + BODY.encode()[:10], half_close=True)
    assert reply == b""
    assert _wait_counted(url, 499, before + 1) == before + 1


# ---------------------------------------------------------------- the budget of bodies still arriving


def test_bodies_still_arriving_stay_within_the_budget_across_connections():
    budget = 100_000
    protocol = bounded_protocol(5, 5, budget)
    app = create_app(FakeDecider(), ServerSettings())
    with ServerThread(app, http=protocol) as url:
        holder = _connect(url)  # holds 90% of the budget with a body one byte short
        holder.sendall(_head(budget) + b" " * (budget * 9 // 10))
        deadline = time.monotonic() + 5
        while protocol.pending.held < budget * 9 // 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert protocol.pending.held == budget * 9 // 10

        # a Content-Length that does not fit in what is left: refused at its head
        reply, _ = _exchange(url, _head(budget // 2))
        status, head, body = _status_and_json(reply)
        assert status == 503 and body["type"] == "overloaded" and b"retry-after: 1" in head.lower(), reply
        # the same with "Expect: 100-continue": the 503 instead of the "100 Continue", and no error after it
        errors = _Errors()
        logging.getLogger("uvicorn.error").addHandler(errors)
        try:
            reply, _ = _exchange(url, _head(budget // 2).replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n"))
            time.sleep(0.2)  # the app's task has run by now
        finally:
            logging.getLogger("uvicorn.error").removeHandler(errors)
        assert reply.startswith(b"HTTP/1.1 503") and b"100 Continue" not in reply and not errors.records, reply
        # a chunked body that grows past what is left: refused as its bytes arrive; the client, still sending, reads
        # the answer (not a reset: the server reads and drops the rest until the client's EOF)
        chunk = b" " * (budget * 40)
        reply, _ = _exchange(url, _head() + b"%x\r\n%s\r\n" % (len(chunk), chunk), half_close=True)
        status, _, body = _status_and_json(reply)
        assert status == 503 and body["type"] == "overloaded", body
        assert protocol.pending.held <= budget
        # a small request still fits and is served
        assert httpx.post(url + "/v1/systemone", content=BODY, timeout=10).status_code == 200
        assert _counted(url, 503) == 3  # the refusals recorded as sent

        holder.close()  # its bytes are freed with it: a body of half the budget fits again
        while protocol.pending.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert protocol.pending.held == 0
        padded = BODY + " " * (budget // 2)
        assert httpx.post(url + "/v1/systemone", content=padded, timeout=10).status_code == 200
        assert protocol.pending.held == 0  # a body that ended counts no longer


# ---------------------------------------------------------------- settings


def test_the_deadlines_and_the_budget_must_be_positive():
    for limits in ((0, 1, 1), (1, 0, 1), (1, 1, 0)):
        with pytest.raises(ValueError, match="positive"):
            bounded_protocol(*limits)


def test_serve_help_states_the_body_deadline_and_the_budget(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--body-timeout" in text and "(default 30)" in text and "--max-pending-body-bytes" in text
    args = build_parser().parse_args(["serve"])
    assert args.body_timeout_s == 30 and args.max_pending_body_bytes is None
