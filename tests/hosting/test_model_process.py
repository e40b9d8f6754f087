"""The model in a process of its own (`typedlm.hosting.model_process`), as `typedlm serve` runs it by default.

Answers through it are the decider's own (the real embedded model, in process and over HTTP with the official SDK);
errors cross with their fields, so a request gets the same status and body either way. Admission (503), the timeout
(504), a model process that dies and `close` are tested on a `FakeDecider` in the model process: their subject is
the process boundary, not the model.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import pickle
import signal
import threading
import time

import httpx
import pytest
from typesafe_sdk import Noul, TypeSafeClient

from typedlm.core.errors import InvalidRequest, LimitExceeded, ModelError
from typedlm.core.questions import parse_request
from typedlm.decide.decider import Decider
from typedlm.hosting.model_process import ModelProcess, portable
from typedlm.hosting.status import APIError, error_status
from typedlm.runtime.models import load_model
from typedlm.server import ServerSettings, create_app

from ..conftest import FakeDecider, ServerThread, json_leaves

BODY = {
    "state": "I was charged twice for my subscription this month. Please refund the second charge.",
    "questions": {
        "billing": {"type": "noul", "instructions": "Is this message about billing?"},
        "tone": {"type": "choice", "criteria": {"angry": "upset", "calm": None, "polite": "asks nicely"}},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high"]},
    },
}


def load_embedded() -> Decider:
    """The `real_decider` fixture's decider, loaded in the model process."""
    return Decider(load_model(None, "cpu", "float32"), calibration="raw", choice_answers="letters")


def load_failing() -> Decider:
    raise ModelError("no model named 'nobody/no-such-model'")


def load_crashing() -> Decider:
    os._exit(7)


def ask(model: ModelProcess, body: dict = BODY):
    parsed = parse_request(body)
    return asyncio.run(model.answer(parsed.state, parsed.questions, parsed.calibration, parsed.order_reads))


def assert_same_answers(got: dict, want: dict, tolerance: float = 1e-4) -> None:
    """Every field equal, floats within `tolerance`; cached tokens aside. Each process has its own prefix cache, so
    the two forwards may split a prompt at another token (46 and 50 cached tokens) and sum float32 in another order:
    usually 1.2e-6 apart, but one run of the whole suite met 2.9e-5 (the model process's answer off from the one
    every other run gives, with its cache split as always). A question answered from another question's reads, or
    calibrated otherwise, is off by far more than 1e-4."""
    got_leaves, want_leaves = dict(json_leaves(got)), dict(json_leaves(want))
    for leaves in (got_leaves, want_leaves):
        leaves.pop(("usage", "x_cached_tokens"))
    assert got_leaves.keys() == want_leaves.keys()
    for path, value in want_leaves.items():
        if isinstance(value, float):
            assert got_leaves[path] == pytest.approx(value, abs=tolerance), path
        else:
            assert got_leaves[path] == value, path


@pytest.fixture(scope="module")
def embedded_process():
    model = ModelProcess(load_embedded, ServerSettings())
    yield model
    model.close()


def test_answers_are_the_deciders_own_in_process_and_over_http(embedded_process, real_decider):
    parsed = parse_request(BODY)
    expected = real_decider.decide(parsed.state, parsed.questions).to_wire()
    assert_same_answers(ask(embedded_process).to_wire(), expected)
    timings, batches = [], []
    settings = ServerSettings()
    app = create_app(embedded_process, settings)
    embedded_process.on_timing = lambda wait_s, run_s: timings.append((wait_s, run_s))
    embedded_process.on_batch = lambda requests, tokens: batches.append((requests, tokens))
    with ServerThread(app) as url, TypeSafeClient(api_key="k", base_url=url) as client:
        over_http = httpx.post(url + "/v1/systemone", json=BODY, timeout=60).json()
        sdk = client.system_one(state=BODY["state"], questions={"billing": Noul(instructions="Is it about billing?")})
        health = httpx.get(url + "/health").json()
    assert_same_answers(over_http, expected)
    assert 0.0 <= sdk.answers["billing"].noul <= 1.0
    assert len(timings) >= 2 and all(run_s > 0 for _, run_s in timings)
    assert batches and all(requests == 1 and tokens > 0 for requests, tokens in batches)  # one per forward on a CPU
    # the counters as of the last forward: the three requests' documents went through the prefix cache
    cache = health["prefix_cache"]
    assert health["status"] == "ok" and cache["hits"] + cache["partial_hits"] + cache["misses"] >= 3
    assert embedded_process.pending == 0


def test_an_error_from_the_model_is_the_same_status_and_body_as_in_process(embedded_process, real_decider):
    too_long = {**BODY, "state": "word " * 9000}  # over the embedded model's 8192-token context
    with ServerThread(create_app(real_decider)) as here, ServerThread(create_app(embedded_process)) as there:
        expected, got = (httpx.post(url + "/v1/systemone", json=too_long, timeout=60) for url in (here, there))
        assert got.status_code == expected.status_code == 413
        assert got.json() == expected.json()
        questions = json.dumps({"billing": BODY["questions"]["billing"]})
        messages = [{"role": "system", "content": questions}, {"role": "user", "content": "word " * 9000}]
        chat = {"model": "jev-latest", "messages": messages}
        expected, got = (httpx.post(url + "/v1/chat/completions", json=chat, timeout=60) for url in (here, there))
        assert got.status_code == expected.status_code and got.json() == expected.json()


def test_the_model_process_memory_is_read_live_and_a_refusal_brings_its_caches_counters(embedded_process):
    import psutil

    model_rss = psutil.Process(embedded_process.pid).memory_info().rss
    assert abs(embedded_process.stats()["process"]["resident_bytes"] - model_rss) < 0.05 * model_rss
    before = embedded_process.stats()["caches"]["documents"]["misses"]
    with pytest.raises(LimitExceeded):  # tokenized, then refused: its counters come back with the error
        ask(embedded_process, {**BODY, "state": "new words " * 5000})
    assert embedded_process.stats()["caches"]["documents"]["misses"] == before + 1


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequest("must be one of raw, fitted", ("calibration",), "enum"),
        LimitExceeded("the prompt has 9000 tokens; the context is 8192", ("state",)),
        APIError(503, "overloaded", "busy", headers={"Retry-After": "1"}),
        ModelError("cannot load"),
    ],
)
def test_errors_survive_pickling_with_their_fields(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and vars(again) == vars(error) and str(again) == str(error)
    assert error_status(again) == error_status(error)
    assert portable(error) is error


def test_an_error_that_cannot_cross_becomes_a_500_naming_it():
    class Local(Exception):  # defined here: not importable by name, so not picklable
        pass

    crossed = portable(Local("the kernel failed"))
    assert isinstance(crossed, RuntimeError) and str(crossed) == "Local: the kernel failed"
    assert error_status(crossed)[0] == 500


def test_a_model_that_cannot_load_raises_its_own_error():
    with pytest.raises(ModelError, match="nobody/no-such-model"):
        ModelProcess(load_failing, ServerSettings())
    with pytest.raises(ModelError, match=r"exited while loading \(exit code 7\)"):
        ModelProcess(load_crashing, ServerSettings())


class FreezeReportingDecider(FakeDecider):
    """Its counters say how many objects its process had frozen (`hosting.heap`) when the decider was asked."""

    def stats(self):
        return {**super().stats(), "gc": {"frozen": gc.get_freeze_count()}}


def test_the_model_process_freezes_what_it_loaded_before_it_is_ready():
    model = ModelProcess(FreezeReportingDecider, ServerSettings())
    try:  # "ready" carries the counters: the imports and the decider were out of the collector's walks by then
        assert model.stats()["gc"]["frozen"] > 10_000
    finally:
        model.close()


def test_admission_and_timeout_hold_across_the_process():
    settings = ServerSettings(max_queue=1, request_timeout_s=0.3, retry_after_s=2)
    model = ModelProcess(functools.partial(FakeDecider, delay_s=1.0), settings)
    try:

        async def two_at_once():
            first = asyncio.create_task(model.answer(*_args()))
            await asyncio.sleep(0.05)
            with pytest.raises(APIError) as overloaded:  # the first still running: the queue of one is full
                await model.answer(*_args())
            with pytest.raises(APIError) as timed_out:
                await first
            return overloaded.value, timed_out.value

        overloaded, timed_out = asyncio.run(two_at_once())
        assert (overloaded.status, overloaded.error_type, overloaded.headers) == (
            503,
            "overloaded",
            {"Retry-After": "2"},
        )
        assert (timed_out.status, timed_out.error_type) == (504, "timeout")
        assert model.pending == 1  # timed out, and still running in the model process
        deadline = time.monotonic() + 10
        while model.pending:
            assert time.monotonic() < deadline, "the timed-out request was never finished"
            time.sleep(0.05)
    finally:
        model.close()


def _args():
    parsed = parse_request(BODY)
    return parsed.state, parsed.questions, None, None


def test_a_dead_model_process_fails_requests_with_503_and_health_says_so():
    exited = threading.Event()
    model = ModelProcess(functools.partial(FakeDecider, delay_s=5.0), ServerSettings(), on_exit=exited.set)
    try:
        with ServerThread(create_app(model)) as url:
            waiting = []
            sender = threading.Thread(target=lambda: waiting.append(httpx.post(url + "/v1/systemone", json=BODY)))
            sender.start()
            while model.pending == 0:
                time.sleep(0.01)
            os.kill(model.pid, signal.SIGKILL)
            sender.join(timeout=10)
            assert exited.wait(10)
            (reply,) = waiting
            later = httpx.post(url + "/v1/systemone", json=BODY)
            health = httpx.get(url + "/health")
        for response in (reply, later):
            assert response.status_code == 503, response.text
            assert response.json()["detail"]["error_type"] == "model_unavailable"
            assert "exit code -9" in response.json()["detail"]["message"]
        assert health.status_code == 503 and health.json()["status"] == "error"
        assert model.pending == 0
    finally:
        model.close()


def test_close_answers_the_requests_in_flight_then_the_process_exits():
    model = ModelProcess(functools.partial(FakeDecider, delay_s=0.3), ServerSettings())
    results = []

    async def three():
        return await asyncio.gather(*(model.answer(*_args()) for _ in range(3)))

    asker = threading.Thread(target=lambda: results.extend(asyncio.run(three())))
    asker.start()
    while model.pending < 3:
        time.sleep(0.01)
    model.close()
    asker.join(timeout=10)
    assert len(results) == 3 and all(set(r.answers) == set(BODY["questions"]) for r in results)
    assert model._process.exitcode == 0
    with pytest.raises(APIError) as closed:  # after close: refused at once, not left to time out
        asyncio.run(model.answer(*_args()))
    assert (closed.value.status, closed.value.message) == (503, "the server is shutting down")
