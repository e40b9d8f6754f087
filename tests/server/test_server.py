"""The HTTP server through a real uvicorn server: official SDK, every error path.

Tests of what the server does with a decider's answers (the official SDK parsing them, zstd arrival, answer shapes,
calibration and order reads per request, the context limit, the real prefix cache and every cache's metrics) run on
a real `Decider` over the fake language model (`fake_lm_server_url`, `fake_lm_decider`: the embedded model's
tokenizer, answers from `typedlm.runtime.fake`). Concurrent requests answered by shared static forwards run on the
real embedded model (`real_decider`). Tests of the protocol and its error paths run on a `FakeDecider`
(`fake_server_url`), which answers instantly without any decider.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
import threading
import time

import httpx
import pytest
from backports import zstd
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient, TypeSafeUnprocessableEntityError
from typesafe_sdk._core.compression import resolve_compression

from typedlm.server import ServerSettings, create_app

from ..conftest import FakeDecider, ServerThread

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this message about billing?"},
    "tone": {"type": "choice", "criteria": {"angry": "upset", "calm": None, "ünïcode ✓": "other"}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high"]},
}
BODY = {"model": "jev-latest", "state": "I was charged twice. Please refund me.", "questions": QUESTIONS}


def post(url: str, body=None, *, content: bytes | None = None, headers=None, path="/v1/systemone") -> httpx.Response:
    if content is None:
        content = json.dumps(body).encode()
    headers = {"content-type": "application/json", **(headers or {})}
    return httpx.post(url + path, content=content, headers=headers, timeout=120)


def assert_error(resp: httpx.Response, status: int, error_type: str, words: str = "") -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    detail = resp.json()["detail"]
    assert detail["error_type"] == error_type and words in detail["message"], detail
    return detail


def assert_validation(resp: httpx.Response, loc: list, words: str = "") -> None:
    assert resp.status_code == 422, resp.text
    (error,) = resp.json()["detail"]
    assert error["loc"] == ["body", *loc] and words in error["msg"] and isinstance(error["type"], str), error


# ---------------------------------------------------------------- the official client


def test_official_sdk_with_default_settings_sends_zstd_and_parses_every_type(fake_lm_server_url, fake_lm_decider):
    assert resolve_compression(None) == "zstd", "typesafe-sdk[zstd] compresses large bodies by default"
    state = {"ticket": "Charged twice for order 1182. " * 40, "customer": "Ada"}  # > 1 KiB: compressed
    assert len(json.dumps(state)) > 1024
    with TypeSafeClient(api_key="any-key-auth-is-off", base_url=fake_lm_server_url) as client:
        response = client.system_one(
            state,
            {
                "refund": Noul(instructions="Does the customer want money back?"),
                "topic": Choice(criteria={"billing": "payments", "shipping": None, "日本": "other"}),
                "urgency": Score(criteria=["low", "medium", "high"]),
            },
        )
        models = client.models.list()
    assert response.model == fake_lm_decider.name
    assert 0 <= response.answers["refund"].noul <= 1
    assert set(response.answers["topic"].probabilities) == {"billing", "shipping", "日本"}
    assert response.answers["urgency"].legend == {0: "low", 1: "medium", 2: "high"}  # the SDK keys levels by int
    assert response.usage.input_tokens > 0
    assert {m.name for m in models.models} == {fake_lm_decider.name, "jev-latest"}


def test_the_sdk_body_really_arrives_zstd_compressed(fake_lm_decider):
    seen = []

    def recording(app):
        async def wrapped(scope, receive, send):
            if scope["type"] == "http":
                seen.append(dict(scope["headers"]).get(b"content-encoding"))
            await app(scope, receive, send)

        return wrapped

    with (
        ServerThread(recording(create_app(fake_lm_decider))) as url,
        TypeSafeClient(api_key="k", base_url=url) as client,
    ):
        client.system_one("x" * 2000, {"q": Noul(instructions="Is it long?")})
    assert seen == [b"zstd"]


def test_sdk_gets_validation_errors_as_exceptions(fake_server_url):
    with (
        TypeSafeClient(api_key="k", base_url=fake_server_url) as client,
        pytest.raises(TypeSafeUnprocessableEntityError),
    ):
        client.system_one("s", {"q": {"type": "choice", "criteria": {"only": None}}})


# ---------------------------------------------------------------- success shapes


def test_answers_keep_option_names_byte_for_byte_and_prefix_extensions(fake_lm_server_url):
    resp = post(fake_lm_server_url, BODY)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert {key for key in body if not key.startswith("x_")} == {"model", "answers", "usage"}
    assert body["x_calibration"] == "raw"  # extensions are x_-prefixed
    assert list(body["answers"]["tone"]["probabilities"]) == ["angry", "calm", "ünïcode ✓"]
    for answer in body["answers"].values():
        assert all(
            key.startswith("x_")
            for key in answer
            if key not in {"type", "noul", "choice", "probabilities", "confidence", "score", "legend"}
        )


def test_unknown_fields_are_ignored_and_auth_headers_accepted_when_auth_is_off(fake_server_url, fake_decider):
    resp = post(fake_server_url, {**BODY, "x_future": 1, "stream": False}, headers={"authorization": "Bearer whatever"})
    assert resp.status_code == 200
    assert fake_decider.calls[-1].state == BODY["state"] and set(fake_decider.calls[-1].questions) == set(QUESTIONS)


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_compressed_bodies(fake_server_url, fake_decider, encoding):
    raw = json.dumps(BODY).encode()
    packed = gzip.compress(raw) if encoding == "gzip" else zstd.compress(raw)
    resp = post(fake_server_url, content=packed, headers={"content-encoding": encoding})
    assert resp.status_code == 200 and set(resp.json()["answers"]) == set(QUESTIONS)
    assert fake_decider.calls[-1].state == BODY["state"]  # decoded byte for byte


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """/metrics parsed with prometheus_client's own parser: (sample name, sorted labels) → value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_requests_latency_tokens_and_questions(caplog):
    decider = FakeDecider()
    with ServerThread(create_app(decider, ServerSettings(log_format="json"))) as url:
        with caplog.at_level(logging.INFO, logger="typedlm.requests"):
            assert post(url, BODY).status_code == 200
            assert post(url, {**BODY, "questions": {}}).status_code == 422
        text = httpx.get(url + "/metrics").text
        samples = scrape(url)
    assert "# HELP typedlm_requests_total" in text and "# TYPE typedlm_request_seconds histogram" in text
    ok = (("route", "/v1/systemone"), ("status", "200"))
    assert samples[("typedlm_requests_total", ok)] == 1
    assert samples[("typedlm_requests_total", (("route", "/v1/systemone"), ("status", "422")))] == 1
    assert samples[("typedlm_request_seconds_count", (("route", "/v1/systemone"),))] == 2
    assert samples[("typedlm_forward_seconds_count", ())] == 1  # only the valid request reached the model
    assert samples[("typedlm_queue_wait_seconds_count", ())] == 1
    tokens = decider.calls[-1]
    assert samples[("typedlm_input_tokens_total", ())] == len(json.dumps(tokens.state).split())
    for kind in ("noul", "choice", "score"):
        assert samples[("typedlm_questions_total", (("type", kind),))] == 1
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "typedlm.requests"]
    first, second = lines[-2:]
    assert first["route"] == "/v1/systemone" and first["status"] == 200 and first["ms"] > 0
    assert first["questions"] == {"noul": 1, "choice": 1, "score": 1} and first["input_tokens"] > 0
    assert second["status"] == 422 and "input_tokens" not in second


def test_cuda_graph_counters_reach_health_and_metrics():
    """A decider on a GPU reports its graphs' captures and failed captures (counters) and how many it holds (a
    gauge)."""
    graphs = {"captures": 7, "held": 5, "capture_failures": 1}

    class OnGpu(FakeDecider):
        def stats(self):
            return {**super().stats(), "cuda_graphs": graphs}

    with ServerThread(create_app(OnGpu(), ServerSettings())) as url:
        health = httpx.get(url + "/health").json()
        samples = scrape(url)
    assert health["cuda_graphs"] == graphs
    assert samples[("typedlm_cuda_graphs_captures_total", ())] == 7 and samples[("typedlm_cuda_graphs_held", ())] == 5
    assert samples[("typedlm_cuda_graphs_capture_failures_total", ())] == 1


def test_the_model_threads_waits_reach_health_and_metrics(fake_server_url):
    """The model worker's waits (`worker.ModelWorker.stats`), as counters: which side sets the pace."""
    post(fake_server_url, BODY)
    health = httpx.get(fake_server_url + "/health").json()
    samples = scrape(fake_server_url)
    for wait in ("slot", "requests"):
        assert health["model_thread"][f"waited_for_{wait}_seconds"] >= 0
        assert samples[(f"typedlm_model_thread_waited_for_{wait}_seconds_total", ())] >= 0
    assert samples[("typedlm_model_thread_waited_for_requests_seconds_total", ())] > 0, "idle between requests"


def test_models_health_and_docs(fake_server_url, fake_decider):
    models = httpx.get(fake_server_url + "/v1/models").json()["models"]
    assert [m["name"] for m in models] == [fake_decider.name, "jev-latest"]
    assert all(len(m["release_date"]) == 10 and m["description"] for m in models)
    health = httpx.get(fake_server_url + "/health").json()
    assert health["status"] == "ok" and health["prefix_cache"]["max_bytes"] > 0
    assert health["model"] == fake_decider.name and health["max_queue"] == ServerSettings().max_queue
    post(fake_server_url, BODY)
    post(fake_server_url, BODY)  # the same state again: a (fake) prefix-cache hit
    samples = scrape(fake_server_url)
    assert samples[("typedlm_prefix_cache_hits_total", ())] >= 1 and samples[("typedlm_requests_pending", ())] == 0
    for name, value in fake_decider.stats()["prefix_cache"].items():  # every counter, cumulative ones as _total
        suffix = "_total" if name in ("hits", "partial_hits", "misses", "reused_tokens") else ""
        assert samples[(f"typedlm_prefix_cache_{name}{suffix}", ())] == value
    assert httpx.get(fake_server_url + "/docs").status_code == 200
    spec = httpx.get(fake_server_url + "/openapi.json").json()
    assert "SystemOneRequest" in spec["components"]["schemas"] and "/v1/chat/completions" in spec["paths"]


def test_docs_work_offline_from_local_files(fake_server_url):
    page = httpx.get(fake_server_url + "/docs").text
    assert "http://" not in page.replace("http://127.0.0.1", "") and "https://" not in page, "no CDN"
    for asset in re.findall(r'(?:src|href)="(/docs-assets/[^"]+)"', page):
        resp = httpx.get(fake_server_url + asset)
        assert resp.status_code == 200 and resp.content, asset
    assert "swagger-ui-bundle.js" in page


def test_openapi_says_what_the_server_does(fake_server_url, fake_decider):
    spec = httpx.get(fake_server_url + "/openapi.json").json()
    statuses = {path: {m: set(op["responses"]) for m, op in ops.items()} for path, ops in spec["paths"].items()}
    assert statuses["/v1/systemone"]["post"] >= {"200", "400", "401", "404", "413", "415", "422", "503", "504"}
    assert statuses["/v1/models"]["get"] == {"200", "401"}
    assert statuses["/v1/chat/completions"]["post"] >= {"200", "400", "401", "404", "413", "503", "504"}
    schemas = spec["components"]["schemas"]
    request = schemas["SystemOneRequest"]
    assert set(request["required"]) == {"state", "questions"}  # a body without model gets 200:
    assert post(fake_server_url, {k: v for k, v in BODY.items() if k != "model"}).status_code == 200
    assert request["properties"]["questions"]["minProperties"] == 1  # and {} gets 422:
    assert post(fake_server_url, {**BODY, "questions": {}}).status_code == 422
    choice = schemas["ChoiceQuestion"]["properties"]["criteria"]
    assert (choice["minProperties"], choice["maxProperties"]) == (2, 255)
    score = schemas["ScoreQuestion"]["properties"]["criteria"]
    assert (score["minItems"], score["maxItems"]) == (2, 10)
    assert "ChatRequest" in schemas and "$ref" in str(spec["paths"]["/v1/chat/completions"]["post"]["requestBody"])
    error = spec["paths"]["/v1/systemone"]["post"]["responses"]["422"]["content"]["application/json"]["schema"]
    assert error["$ref"].endswith("/ValidationBody")


def test_health_and_metrics_count_the_real_prefix_cache(fake_lm_server_url, fake_lm_decider):
    health = httpx.get(fake_lm_server_url + "/health").json()
    assert health["status"] == "ok" and health["model"] == fake_lm_decider.name
    assert health["prefix_cache"]["max_bytes"] > 0
    state = {**BODY, "state": "A state this test sends twice, and no other test sends."}
    first = post(fake_lm_server_url, state).json()["usage"]
    again = post(fake_lm_server_url, state).json()["usage"]  # the same state again: a prefix-cache hit
    assert again["input_tokens"] == first["input_tokens"]  # the whole prompt, cached or not
    assert again["x_cached_tokens"] > first["x_cached_tokens"] > 0  # the system prompt is always cached
    samples = scrape(fake_lm_server_url)
    assert samples[("typedlm_prefix_cache_hits_total", ())] >= 1 and samples[("typedlm_requests_pending", ())] == 0
    assert samples[("typedlm_cached_tokens_total", ())] >= again["x_cached_tokens"]
    info = next(labels for (name, labels) in samples if name == "typedlm_model_info")
    assert dict(info)["model"] == fake_lm_decider.name and dict(info)["device"] == "cpu"


def test_the_openapi_document_states_what_a_request_may_cost_on_this_server(fake_lm_server_url, fake_lm_decider):
    description = httpx.get(fake_lm_server_url + "/openapi.json").json()["info"]["description"]
    assert "**Limits**" in description and f"body: {8 << 20} bytes" in description
    reads, tokens = fake_lm_decider.preparer.max_reads, fake_lm_decider.preparer.max_request_tokens
    assert f"at most {reads} reads" in description and f"tokens: {tokens} per" in description
    assert "model's context (8192)" in description and "memory: 1024 MiB" in description


def test_metrics_account_for_every_cache_in_bytes_and_the_processes_memory(fake_lm_server_url):
    post(fake_lm_server_url, {**BODY, "state": "A state for the caches' metrics, sent by no other test."})
    samples = scrape(fake_lm_server_url)
    caches = {dict(labels)["cache"] for (name, labels) in samples if name == "typedlm_cache_bytes"}
    assert {"documents", "tails", "suffix_texts", "option_names", "priors", "item_layouts", "batch_layouts"} <= caches
    for cache in caches:
        held, budget = (samples[(f"typedlm_cache_{kind}", (("cache", cache),))] for kind in ("bytes", "max_bytes"))
        assert 0 <= held <= budget and samples[("typedlm_cache_entries", (("cache", cache),))] >= 0
    assert samples[("typedlm_cache_bytes", (("cache", "documents"),))] > 0
    assert samples[("typedlm_cache_misses_total", (("cache", "documents"),))] >= 1
    # the model here is in the HTTP server's process: both figures are this process's
    resident, peak = (samples[(f"typedlm_process_{kind}_bytes", ())] for kind in ("resident", "peak_resident"))
    assert 100e6 < resident <= peak
    assert samples[("process_resident_memory_bytes", ())] > 100e6


# ---------------------------------------------------------------- errors


def test_bad_json_is_a_422_in_the_validation_shape(fake_server_url):
    assert_validation(post(fake_server_url, content=b'{"state": "s", "questions": '), [28], "JSON decode error")


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        ({**BODY, "state": None}, ["state"], "state is required"),
        ({**BODY, "state": 5}, ["state"], "not int"),
        ({**BODY, "questions": []}, ["questions"], "object"),
        ({**BODY, "questions": {}}, ["questions"], "at least one"),
        ({**BODY, "questions": {"q": {"type": "maybe"}}}, ["questions", "q", "type"], "unknown question type"),
        ({**BODY, "questions": {"q": {"type": "box"}}}, ["questions", "q", "type"], "text only"),
        ({**BODY, "assets": {"img": {"type": "image", "data_base64": "AA=="}}}, ["assets"], "text only"),
        (
            {**BODY, "questions": {"q": {"type": "choice", "criteria": {"a": None}}}},
            ["questions", "q", "criteria"],
            "2 to 255",
        ),
        (
            {**BODY, "questions": {"q": {"type": "choice", "criteria": {str(i): None for i in range(256)}}}},
            ["questions", "q", "criteria"],
            "got 256",
        ),
        ({**BODY, "questions": {"q": {"type": "score", "criteria": ["one"]}}}, ["questions", "q", "criteria"], "got 1"),
        (
            {**BODY, "questions": {"q": {"type": "score", "criteria": list("abcdefghijk")}}},
            ["questions", "q", "criteria"],
            "got 11",
        ),
        (
            {**BODY, "questions": {"q": {"type": "score", "criteria": {"0": "a", "1": "b"}}}},
            ["questions", "q", "criteria"],
            "array",
        ),
        (
            {**BODY, "questions": {"q": {"type": "noul", "instructions": 7}}},
            ["questions", "q", "instructions"],
            "string",
        ),
        ([1, 2], [], "JSON object"),
    ],
)
def test_invalid_requests_are_422_with_location_and_message(fake_server_url, fake_decider, body, loc, words):
    before = len(fake_decider.calls)
    assert_validation(post(fake_server_url, body), loc, words)
    assert len(fake_decider.calls) == before  # refused before the model is asked


NOUL = '{"q": {"type": "noul"}}'


@pytest.mark.parametrize(
    ("raw", "loc", "words"),
    [
        ('{"state": "' + "[" * 5 + '", "questions": ' + NOUL + ', "x": ' + "[" * 1000 + "]" * 1000 + "}", [], "nested"),
        (
            '{"state": ' + '{"a": ' * 70 + "1" + "}" * 70 + ', "questions": ' + NOUL + "}",
            ["state"] + ["a"] * 63,
            "nested",
        ),
        ('{"state": "hi \\ud800", "questions": ' + NOUL + "}", ["state"], "lone surrogate"),
        (
            '{"state": "hi", "questions": {"q": {"type": "noul", "instructions": "\\udfff?"}}}',
            ["questions", "q", "instructions"],
            "surrogate",
        ),
        ('{"state": "hi", "questions": {"q\\ud800": {"type": "noul"}}}', ["questions"], "surrogate"),
        (
            '{"state": "hi", "questions": {"q": {"type": "choice", "criteria": {"a\\udc00": null, "b": null}}}}',
            ["questions", "q", "criteria"],
            "surrogate",
        ),
        ('{"state": "hi", "questions": {"q": {"type": "score", "criteria": [{"v": NaN}, "b"]}}}', [], "NaN"),
        ('{"state": "hi", "questions": {"q": {"type": "score", "criteria": [{"v": Infinity}, "b"]}}}', [], "Infinity"),
        ('{"state": "hi", "questions": {"q": {"type": "score", "criteria": [{"v": 1e999}, "b"]}}}', [], "1e999"),
        ('{"state": "hi", "questions": ' + NOUL + ', "n": ' + "9" * 5000 + "}", [], "out of range"),
    ],
)
def test_json_nobody_can_answer_is_a_422_and_the_connection_stays_usable(
    fake_server_url, fake_decider, raw, loc, words
):
    # deep nesting, lone surrogates and non-finite numbers were 500s (RecursionError, UnicodeEncodeError in the
    # tokenizer or the response, ValueError), each closing the keep-alive connection under the client
    before = len(fake_decider.calls)
    with httpx.Client(base_url=fake_server_url, timeout=30) as client:
        headers = {"content-type": "application/json"}
        resp = client.post("/v1/systemone", content=raw.encode(), headers=headers)
        assert_validation(resp, loc, words)
        assert client.post("/v1/systemone", json=BODY).status_code == 200  # the same connection
    assert len(fake_decider.calls) == before + 1


def test_a_client_gone_mid_upload_is_no_server_error(fake_server_url, caplog):
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(fake_server_url)
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    with caplog.at_level(logging.INFO):
        with socket.create_connection((where.hostname, where.port), timeout=10) as conn:
            conn.sendall(head + b'{"state": "' + b"x" * 1000)  # then gone
        time.sleep(0.5)
        assert post(fake_server_url, BODY).status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def test_a_server_error_says_the_connection_closes():
    failing = FakeDecider()
    failing.fail_with = RuntimeError("a bug")
    with ServerThread(create_app(failing)) as url:
        resp = post(url, BODY)
        samples = scrape(url)
    assert resp.status_code == 500 and resp.headers["connection"] == "close"
    assert resp.json()["detail"]["error_type"] == "internal_error"
    assert samples[("typedlm_requests_total", (("route", "/v1/systemone"), ("status", "500")))] == 1  # counted too


def test_unknown_model_is_a_404_naming_the_served_models(fake_server_url, fake_decider):
    detail = assert_error(post(fake_server_url, {**BODY, "model": "gpt-9"}), 404, "model_not_found", fake_decider.name)
    assert "jev-latest" in detail["message"] and "gpt-9" in detail["message"]


def test_a_state_longer_than_the_context_is_413_naming_the_limit(fake_lm_server_url):
    assert_error(post(fake_lm_server_url, {**BODY, "state": "word " * 9000}), 413, "request_too_large", "at most 8192")


def test_body_size_limits_hold_before_and_after_decompression():
    settings = ServerSettings(max_body_bytes=4096)
    with ServerThread(create_app(FakeDecider(), settings)) as url:
        big = json.dumps({**BODY, "state": "x" * 5000}).encode()
        detail = assert_error(post(url, content=big), 413, "request_too_large", "4096 bytes")
        assert "decompression" not in detail["message"]  # a plain body
        bomb = zstd.compress(b" " * 10_000_000)  # tiny on the wire, 10 MB inflated
        assert len(bomb) < 4096
        headers = {"content-encoding": "zstd"}
        assert_error(post(url, content=bomb, headers=headers), 413, "request_too_large", "after decompression")
        assert_error(
            post(url, content=gzip.compress(big), headers={"content-encoding": "gzip"}), 413, "request_too_large"
        )
        assert post(url, BODY).status_code == 200


def test_bad_encodings(fake_server_url):
    assert_error(
        post(fake_server_url, content=b"not zstd", headers={"content-encoding": "zstd"}), 400, "invalid_request_error"
    )
    assert_error(
        post(fake_server_url, content=b"not gzip", headers={"content-encoding": "gzip"}), 400, "invalid_request_error"
    )
    assert_error(
        post(fake_server_url, content=b"{}", headers={"content-encoding": "br"}), 415, "unsupported_media_type", "br"
    )


def test_routes_and_methods_errors_are_json(fake_server_url):
    assert_error(httpx.get(fake_server_url + "/v1/systemone"), 405, "method_not_allowed")
    assert_error(httpx.get(fake_server_url + "/v1/nothing"), 404, "not_found")


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({}, "required"),
        ({"authorization": "Bearer wrong"}, "not valid"),
        ({"authorization": "Basic a2V5LW9uZQ=="}, "Bearer"),
        ({"x-api-key": "key-one"}, "required"),
    ],
)
def test_auth_refuses_missing_and_wrong_keys(fake_keyed_server_url, headers, words):
    resp = post(fake_keyed_server_url, BODY, headers=headers)
    detail = assert_error(resp, 401, "authentication_error", words)
    assert detail and resp.headers["www-authenticate"] == "Bearer"
    assert httpx.get(fake_keyed_server_url + "/v1/models", headers=headers).status_code == 401


def _raw_post(url: str, authorization: bytes) -> int:
    """POST BODY with an Authorization header sent byte for byte (httpx refuses some of these values itself)."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    body = json.dumps(BODY).encode()
    request = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + b"Authorization: "
        + authorization
        + b"\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    with socket.create_connection((where.hostname, where.port), timeout=30) as conn:
        conn.sendall(request)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@pytest.fixture(scope="module")
def serve_keyed_server_url():
    """A keyed server on h11, the parser of `typedlm serve`'s own HTTP protocol (server/protocol.py subclasses
    uvicorn's h11 one), which may differ from the one `fake_keyed_server_url` gets (httptools where installed) in
    what it strips from a header value."""
    app = create_app(FakeDecider(), ServerSettings(api_keys=("key-one", "key-two")))
    with ServerThread(app, http="h11") as url:
        yield url


@pytest.mark.parametrize(
    "value",
    [
        b"  Bearer key-one",
        b"\tBearer key-one",
        b"Bearer key-one  ",
        b"Bearer key-one\t",
        b" \t Bearer key-one \t ",
    ],
)
def test_auth_accepts_spaces_and_tabs_around_the_whole_value(fake_keyed_server_url, serve_keyed_server_url, value):
    # they are not part of the value in HTTP (RFC 9110 5.5): either parser drops them before the server sees it
    for url in (fake_keyed_server_url, serve_keyed_server_url):
        assert _raw_post(url, value) == 200, url


@pytest.mark.parametrize(
    "value",
    [
        b"Bearer  key-one",  # two spaces
        b"Bearer\tkey-one",
        b"Bearer \tkey-one",
        b"Bearer ke y-one",  # a space inside the key
        b"Bearer key-one x",
        b"Bearer key-one\x0b",  # a control byte
        b"Bearer key-one\xc2\xa0",  # a non-breaking space (UTF-8)
        b"Bearer key-one\xc2\x85",  # NEL
        b"Bearerkey-one",
        b"Bearer ",
    ],
)
def test_auth_compares_the_exact_token_after_one_bearer(fake_keyed_server_url, serve_keyed_server_url, value):
    # (the HTTP parser itself refuses a control byte with a 400)
    for url in (fake_keyed_server_url, serve_keyed_server_url):
        assert _raw_post(url, value) in (400, 401), url
        assert _raw_post(url, b"Bearer key-one") == 200


def test_auth_takes_any_case_of_the_scheme_and_refuses_two_headers(fake_keyed_server_url):
    for scheme in ("bearer", "BEARER", "BeArEr"):
        assert post(fake_keyed_server_url, BODY, headers={"authorization": f"{scheme} key-one"}).status_code == 200
    two = [("authorization", "Bearer key-one"), ("authorization", "Bearer key-two")]
    resp = httpx.post(fake_keyed_server_url + "/v1/systemone", json=BODY, headers=two)
    assert_error(resp, 401, "authentication_error", "one Authorization header")


@pytest.mark.parametrize("key", ["key-one", "key-two"])
def test_auth_accepts_every_configured_key(fake_keyed_server_url, key):
    assert post(fake_keyed_server_url, BODY, headers={"authorization": f"Bearer {key}"}).status_code == 200
    with TypeSafeClient(api_key=key, base_url=fake_keyed_server_url) as client:
        assert client.models.list().models


def test_a_full_queue_gets_503_with_retry_after_and_the_running_request_finishes():
    settings = ServerSettings(max_queue=1, retry_after_s=2)
    gate = threading.Event()  # the first request's (fake) model pass runs until the gate opens
    decider = FakeDecider(gate=gate)
    with ServerThread(create_app(decider, settings)) as url:
        results = {}
        first = threading.Thread(target=lambda: results.setdefault("first", post(url, BODY)))
        first.start()
        try:
            deadline = time.monotonic() + 30
            while httpx.get(url + "/health").json()["pending"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            busy = post(url, BODY)
        finally:
            gate.set()
        first.join(timeout=60)
    assert_error(busy, 503, "overloaded", "busy")
    assert busy.headers["retry-after"] == "2"
    assert results["first"].status_code == 200
    assert len(decider.calls) == 1  # the refused request never reached the model


def test_a_request_over_its_timeout_gets_504():
    settings = ServerSettings(request_timeout_s=0.05)
    gate = threading.Event()  # the (fake) model pass outlasts the timeout until the gate opens
    with ServerThread(create_app(FakeDecider(gate=gate), settings)) as url:
        try:
            assert_error(post(url, BODY), 504, "timeout", "0.05 s")
        finally:
            gate.set()


def test_calibration_and_order_reads_per_request(fake_lm_server_url):
    body = {**BODY, "x_calibration": "contextual", "x_order_reads": 2}
    resp = post(fake_lm_server_url, body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["x_calibration"] == "contextual" and data["x_order_reads"] == 2
    assert data["answers"]["tone"]["x_reads"] == 2 and 0 <= data["answers"]["tone"]["x_stderr"] <= 1
    assert "x_reads" not in data["answers"]["billing"]
    # the decider has a calibration file (the embedded model's, made out to the fake; without one, the decider
    # refuses "fitted": test_reads)
    fitted = post(fake_lm_server_url, {**BODY, "x_calibration": "fitted"})
    assert fitted.status_code == 200 and fitted.json()["x_calibration"] == "fitted", fitted.text
    assert_validation(post(fake_lm_server_url, {**BODY, "x_order_reads": 99}), ["x_order_reads"], "from 1 to 8")


def test_concurrent_requests_share_forwards_and_answer_as_alone(real_decider):
    """A static-shape decider on the real model behind the real server: six clients at once are answered by fewer
    forwards than requests (the metrics count them), each exactly as its request decided alone."""
    from typedlm.core.options import EngineOptions
    from typedlm.core.questions import parse_request
    from typedlm.decide.decider import Decider
    from typedlm.runtime.models import LoadedModel

    loaded = LoadedModel(real_decider.engine.model, real_decider.tokenizer, real_decider.name)
    decider = Decider(loaded, engine=EngineOptions(cuda_graphs=True, attention_kernel=False), prefix_cache_bytes=0)
    assert decider.max_batch > 1
    bodies = [
        {
            "state": f"Ticket {i}: my order {1000 + i} arrived {'late' if i % 2 else 'broken'}; I want a refund.",
            "questions": {
                "refund": {"type": "noul", "instructions": "Does the customer want a refund?"},
                "topic": {"type": "choice", "criteria": {"billing": None, "shipping": None}},
            },
        }
        for i in range(6)
    ]
    with ServerThread(create_app(decider, ServerSettings(max_batch=64))) as url:

        async def ask_all():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                return await asyncio.gather(*(client.post("/v1/systemone", json=body) for body in bodies))

        replies = asyncio.run(ask_all())
        metrics = httpx.get(f"{url}/metrics").text
    forwards = float(re.search(r"^typedlm_batch_requests_count (\S+)$", metrics, re.M).group(1))
    assert forwards < len(bodies), "requests that waited were answered together"
    for body, reply in zip(bodies, replies, strict=True):
        assert reply.status_code == 200
        request = parse_request(body)
        alone = decider.decide(request.state, request.questions).to_wire()["answers"]
        got = reply.json()["answers"]
        assert abs(got["refund"]["noul"] - alone["refund"]["noul"]) < 1e-5
        for name, p in alone["topic"]["probabilities"].items():
            assert abs(got["topic"]["probabilities"][name] - p) < 1e-5
