"""The HTTP connection protocol: a request head that trickles in is cut off with a 408; normal traffic is not."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from typedlm.server import ServerSettings, create_app
from typedlm.server.protocol import with_head_timeout

from .conftest import ServerThread

DEADLINE_S = 0.6


@pytest.fixture(scope="module")
def url(fake_decider):
    app = create_app(fake_decider, ServerSettings())
    with ServerThread(app, http=with_head_timeout(DEADLINE_S), timeout_keep_alive=30) as url:
        yield url


def _connect(url: str) -> socket.socket:
    parsed = urlparse(url)
    return socket.create_connection((parsed.hostname, parsed.port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


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
    status, _, body = reply.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"connection: close" in status.lower()
    assert json.loads(body)["type"] == "timeout"


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


def test_the_deadline_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        with_head_timeout(0)
