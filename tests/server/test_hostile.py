"""Hostile but valid clients, the smallest version of `benchmarks/hostile.py`, over real HTTP: long distinct option
names, the largest requests the limits admit (four at once), one just over them, stalled and unfinished bodies. Every
one gets an answer or a 4xx, none a 5xx, and the process keeps no more than its caches' budgets after them. The model
is the fake one (`typedlm.runtime.fake`): what is tested is the host's side (tokenizing, labels, limits, caches, the
HTTP deadlines), whose memory a forward's does not hide; a real forward's peak is the benchmark's to measure."""

from __future__ import annotations

import gc
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx
import pytest

from typedlm.core.bounded import resident_bytes
from typedlm.core.errors import LimitExceeded
from typedlm.core.questions import parse_questions
from typedlm.decide.decider import Decider
from typedlm.server import ServerSettings, create_app
from typedlm.server.protocol import bounded_protocol

from ..conftest import ServerThread, decider_on_fake

BODY_TIMEOUT_S = 1.0
FORWARD_BYTES = 48 << 20


def long_names(i: int) -> dict:
    first = " ".join(f"n{i}w{j}" for j in range(6_000))[:30_000]
    return {"state": "A short note.", "questions": {"q": {"type": "choice", "criteria": {first: None, "other": None}}}}


def many_questions(n: int) -> dict:
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is it about item {i}?"} for i in range(n)}
    return {"state": "The parcel never arrived.", "questions": questions}


def largest_admitted(decider: Decider) -> int:
    """The most questions of `many_questions` the decider's limits admit (no model work: `prepare` refuses)."""
    lo, hi = 1, 2_000
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            decider.preparer.prepare("The parcel never arrived.", parse_questions(many_questions(mid)["questions"]))
            lo = mid
        except LimitExceeded:
            hi = mid - 1
    return lo


def stalled(url: str, head: bytes, sent: bytes) -> tuple[str, float]:
    parsed = urlparse(url)
    started = time.perf_counter()
    with socket.create_connection((parsed.hostname, parsed.port), timeout=BODY_TIMEOUT_S + 10) as sock:
        sock.sendall(head + sent)
        reply = sock.recv(65536)
    return reply.split(b"\r\n", 1)[0].decode(), time.perf_counter() - started


@pytest.fixture(scope="module")
def hostile(tokenizer):
    decider = decider_on_fake(
        tokenizer,
        choice_answers="names",  # long names are tokenized to see whether they can be read
        max_forward_bytes=FORWARD_BYTES,
        prefix_cache_bytes=64 << 20,
    )
    app = create_app(decider, ServerSettings(max_queue=64))
    with ServerThread(app, http=bounded_protocol(5.0, BODY_TIMEOUT_S, 16 << 20)) as url:
        yield decider, url, app.state.model.worker.trim


def test_hostile_clients_get_answers_or_4xx_and_leave_only_bounded_caches(hostile):
    decider, url, trim = hostile
    post = lambda body: httpx.post(url + "/v1/systemone", json=body, timeout=120).status_code  # noqa: E731
    assert post(many_questions(2)) == 200  # warm
    gc.collect()
    start = resident_bytes()
    with ThreadPoolExecutor(4) as pool:
        # 1. distinct 30,000-character option names: each read or refused, none kept beyond the caches' budgets
        names = list(pool.map(post, [long_names(i) for i in range(10)]))
        # 2. the largest request the limits admit, four at once; one question more is refused, naming the limit
        most = largest_admitted(decider)
        largest = list(pool.map(post, [many_questions(most)] * 4))
    over = httpx.post(url + "/v1/systemone", json=many_questions(most + 1), timeout=120)
    assert set(names) <= {200, 413} and largest == [200] * 4
    assert over.status_code == 413 and "MiB per request" in over.json()["detail"]["message"]
    # 3. bodies that never finish: a declared length not met, chunks without the last one
    head = b"POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    short = head + b"content-length: 1000000\r\n\r\n", b"{" * 100_000
    chunked = head + b"transfer-encoding: chunked\r\n\r\n", b"10\r\n" + b"{" * 16 + b"\r\n"
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda args: stalled(url, *args), [short] * 6 + [chunked] * 2))
    for status_line, seconds in answers:
        # the event loop's timers may fire up to its clock's resolution early (a millisecond on uvloop's)
        assert status_line == "HTTP/1.1 408 Request Timeout" and BODY_TIMEOUT_S - 0.01 <= seconds < BODY_TIMEOUT_S + 5
    gc.collect()
    deadline = time.monotonic() + trim.idle_s + 10
    while not trim.trimmed and time.monotonic() < deadline:  # the worker idle: what the forwards freed goes back
        time.sleep(0.05)
    kept = resident_bytes() - start
    assert all(cache.nbytes <= cache.max_bytes for cache in decider.caches())
    # what the caches hold now (the prefix cache's too), and a margin for the allocator and the server's own; one
    # long name alone kept about a gigabyte when each prefix of its tokens was built and remembered
    held = sum(cache.nbytes for cache in decider.caches()) + decider.prefix_cache.stats()["bytes"]
    assert kept < held + (192 << 20), f"{kept / 2**20:.0f} MiB kept, {held / 2**20:.0f} MiB of it in caches"
