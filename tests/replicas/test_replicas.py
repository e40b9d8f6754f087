"""Replicas on Ray Serve (`typedlm.replicas`, `typedlm serve --replicas N`).

The pieces first, against independent references: a forwarded request run through the app in process answers as
the same app over real HTTP (uvicorn); document keys; /health and /metrics merged. Then the real thing: `typedlm
serve --replicas 2` on a local Ray with the embedded model: the affinity workload (20 documents x 5 visits), answers
equal to the model in process, errors equal to the single server's, metrics of every replica, a burst past the
replicas' limit answered 503, the independent conformance suite jevcompat with the API key (`make test` runs it
here, not in scripts/conformance.sh), feedback shared through one database (one deployment with the key for all of
them: each start of Ray Serve costs tens of seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import importlib
import json
import os
import random
import re
import runpy
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from typedlm.core.labeling import answer_id
from typedlm.replicas.fanout import merge_health, merge_metrics, merge_suggestions
from typedlm.replicas.forwarding import Forwarded, app_path, run_asgi
from typedlm.replicas.keys import document_key, request_keys

LIMIT = 8 << 20
QUESTIONS = {"ok": {"type": "noul", "instructions": "Is the customer happy?"}}


def _scope(method: str, path: str, headers: dict[str, str], root_path: str = "") -> dict:
    return {
        "method": method,
        "path": root_path + path,
        "raw_path": (root_path + path).encode(),
        "root_path": root_path,
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
    }


JSON = {"content-type": "application/json"}


def _chat(document: str, **options) -> dict:
    system = {"role": "system", "content": json.dumps(QUESTIONS)}
    return {"messages": [system, {"role": "user", "content": document}], **options}


def _json(value) -> bytes:
    return json.dumps(value).encode()


# (method, path, headers, body): what a client may send, good and bad
REQUESTS = [
    ("GET", "/v1/models", {}, b""),
    ("POST", "/v1/systemone", JSON, _json({"state": "hi", "questions": QUESTIONS})),
    ("POST", "/v1/systemone", JSON, b"{not json"),
    ("POST", "/v1/systemone", {"content-encoding": "gzip"}, b"\x1f\x8b not really gzip"),
    ("POST", "/v1/systemone", {"content-encoding": "br"}, b"{}"),
    (
        "POST",
        "/v1/systemone",
        {"content-encoding": "gzip"},
        gzip.compress(_json({"state": "x", "questions": {}}), mtime=0),
    ),
    ("POST", "/v1/chat/completions", {}, _json(_chat("The sky is blue.", stream=True))),
    ("GET", "/nowhere", {}, b""),
    ("DELETE", "/v1/models", {}, b""),
]


def _comparable(body: bytes) -> bytes:
    """A body without what differs per response anyway (a chat completion's id and time)."""
    return re.sub(rb'"(id|created)": ?("[^"]*"|\d+)', b"", body)


@pytest.mark.parametrize("method,path,headers,body", REQUESTS)
def test_a_forwarded_request_is_answered_as_over_http(fake_decider, fake_server_url, method, path, headers, body):
    """`run_asgi` through the app in process gives the status, body and content type that the same app gives over
    real HTTP (uvicorn), errors included."""
    from typedlm.server import ServerSettings, create_app

    app = create_app(fake_decider, ServerSettings())
    reply = asyncio.run(run_asgi(app, Forwarded.of_scope(_scope(method, path, headers), body), replica="r1"))
    want = httpx.request(method, fake_server_url + path, headers=headers, content=body)
    assert reply.status == want.status_code
    assert _comparable(reply.body) == _comparable(want.content)
    assert reply.header(b"content-type").decode() == want.headers.get("content-type")
    assert reply.replica == "r1"


def test_the_path_below_a_route_prefix_is_the_apps_path():
    assert app_path(_scope("GET", "/v1/models", {}, root_path="/typedlm")) == ("/v1/models", b"/v1/models")
    assert app_path(_scope("GET", "", {}, root_path="/typedlm")) == ("/", b"/")
    assert app_path(_scope("GET", "/health", {})) == ("/health", b"/health")


def test_requests_on_one_document_share_a_key_and_others_do_not():
    def key(state, questions=QUESTIONS, path="/v1/systemone", encoding=""):
        body = json.dumps({"state": state, "questions": questions}).encode()
        return document_key(path, encoding, gzip.compress(body) if encoding else body, LIMIT)

    ticket = {"id": 7, "text": "The printer is on fire."}
    assert key(ticket) == key(ticket, {"other": {"type": "noul", "instructions": "Is it urgent?"}})
    assert key(ticket) == key(ticket, encoding="gzip")
    assert key(ticket) != key({"id": 8, "text": "The printer is on fire."})
    assert key("a") != key("b")
    chat = _json(_chat("The printer is on fire."))
    assert document_key("/v1/chat/completions", "", chat, LIMIT) == key("The printer is on fire.")
    # no document to read: any replica (which then answers, or refuses, as the single server does)
    assert key(None) is None
    assert document_key("/v1/systemone", "", b"{nope", LIMIT) is None
    assert document_key("/v1/systemone", "gzip", b"not gzip", LIMIT) is None
    assert document_key("/v1/chat/completions", "", b"[]", LIMIT) is None
    assert document_key("/v1/models", "", b"", LIMIT) is None


def test_a_label_by_id_is_routed_to_the_replica_that_gave_its_answer():
    one, two, alone = answer_id("aaaa1111"), answer_id("bbbb2222"), answer_id()

    def keys(body, path="/v1/systemone/feedback"):
        return request_keys(path, "", _json(body), LIMIT)

    assert keys({"x_id": one, "gold": True}).origins == ("aaaa1111",)
    listed = keys({"labels": [{"x_id": one, "gold": True}, {"x_id": two}, {"x_id": one}, "junk"]})
    assert listed.origins == ("aaaa1111", "bbbb2222") and listed.listed
    with_state = keys({"state": "hi", "questions": QUESTIONS, "gold": {"ok": True}, "x_ids": {"ok": two}})
    assert with_state.origins == ("bbbb2222",) and not with_state.listed and with_state.document is not None
    assert keys({"x_id": alone, "gold": True}).origins == ()  # one server's id: any replica
    assert keys({"x_id": 5, "gold": True}).origins == () and keys([one]).origins == ()
    assert keys({"x_id": one, "gold": True}, path="/v1/systemone").origins == ()


def test_suggestions_of_every_replica_are_one_fair_draw_and_the_most_unsure_of_all():
    """Replica a holds 30 answers to draw, b 10: of 4,000 merged draws of 4, each answer is drawn 400 ± 4 binomial
    sds times, wherever it is held. The answers to teach are the most unsure of both."""
    rng = random.Random(5)
    pools = {"a": [f"a{i}" for i in range(30)], "b": [f"b{i}" for i in range(10)]}
    counts = dict.fromkeys(pools["a"] + pools["b"], 0)
    for _ in range(4000):
        replies = [
            {"object": "feedback_suggestions", "family": None, "answers": len(pool), "drawable": len(pool),
             "random": rng.sample(pool, 4), "teach": [], "teach_by": "entropy", "teach_uncertainty": []}
            for pool in pools.values()
        ]  # fmt: skip
        merged = merge_suggestions(replies, 4, rng)
        assert len(merged["random"]) == len(set(merged["random"])) == 4 and merged["drawable"] == 40
        for key in merged["random"]:
            counts[key] += 1
    sd = (4000 * 0.1 * 0.9) ** 0.5
    assert all(abs(count - 400) < 4 * sd for count in counts.values()), counts
    replies[0] |= {"teach": ["a1", "a2"], "teach_uncertainty": [0.9, 0.5]}
    replies[1] |= {"teach": ["b1", "b2"], "teach_uncertainty": [0.95, 0.7]}
    merged = merge_suggestions(replies, 3, rng)
    assert merged["teach"] == ["b1", "a1", "b2"] and merged["teach_uncertainty"] == [0.95, 0.9, 0.7]


def test_health_sums_the_replicas_counters_and_keeps_each():
    one = {"status": "ok", "model": "m", "pending": 1, "max_queue": 16, "prefix_cache": {"hits": 3, "misses": 1}}
    two = {"status": "ok", "model": "m", "pending": 0, "max_queue": 16, "prefix_cache": {"hits": 4, "misses": 2}}
    health = merge_health({"a": one, "b": two}, expected=2)
    assert health["status"] == "ok" and health["model"] == "m"
    assert health["pending"] == 1 and health["max_queue"] == 32
    assert health["prefix_cache"] == {"hits": 7, "misses": 3}
    assert [r["replica"] for r in health["replicas"]] == ["a", "b"]
    assert health["replicas"][1]["prefix_cache"] == {"hits": 4, "misses": 2}
    assert merge_health({"a": one}, expected=2)["status"] == "degraded"
    assert merge_health({"a": one, "b": {**two, "status": "failing"}}, expected=2)["status"] == "degraded"


def test_metrics_of_every_replica_in_one_exposition():
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    texts = {}
    for replica, count in (("a", 2), ("b", 5)):
        registry = CollectorRegistry()
        counter = Counter("typedlm_requests", "Requests", ["route"], registry=registry)
        counter.labels("/v1/systemone").inc(count)
        Histogram("typedlm_seconds", "Seconds", registry=registry, buckets=(1.0,)).observe(0.5)
        texts[replica] = generate_latest(registry).decode()
    merged = {f.name: f for f in text_string_to_metric_families(merge_metrics(texts).decode())}
    requests = {s.labels["replica"]: s.value for s in merged["typedlm_requests"].samples}
    assert requests == {"a": 2.0, "b": 5.0}
    assert merged["typedlm_seconds"].type == "histogram"
    counts = [s for s in merged["typedlm_seconds"].samples if s.name == "typedlm_seconds_count"]
    assert sorted(s.labels["replica"] for s in counts) == ["a", "b"]


# --- the real thing: `typedlm serve --replicas 2` on a local Ray, the embedded model ---

KEY = "replicas-key"  # the replicas require it, so that jevcompat's auth requirements are exercised on them too
AUTH = {"Authorization": f"Bearer {KEY}"}
# Ray Serve's controller gives a starting proxy 5 s to report ready (RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S, read in
# ray/serve/_private/constants.py) and after three misses kills it (proxy_state.py), and with it `serve.start`, which
# waits on that proxy: `typedlm serve` exits. Beside the other tests on two cores a proxy can take longer than those
# 15 s. Here each check waits 60 s, so that the one deadline left is `serve.start`'s own 60 s (HTTP_PROXY_TIMEOUT,
# fixed in Ray); and the proxy's health checks after it as long (RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S, 10 s: after
# three misses the proxy is restarted, and requests meet a closed port meanwhile).
RAY_PATIENCE = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(log: Path, *options: str):
    """`typedlm serve --replicas ...` in a subprocess (its own local Ray) until every replica is up; stopped with
    SIGTERM, as a service manager stops it."""
    port = _free_port()
    command = [sys.executable, "-m", "typedlm.cli", "serve", "--port", str(port), *options]
    with log.open("w") as sink:
        env = {**os.environ, **RAY_PATIENCE}
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the replicas did not start:\n" + log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=30).json().get("status") == "ok":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def replicas_url(tmp_path_factory):
    pytest.importorskip("ray.serve")
    log = tmp_path_factory.mktemp("replicas") / "serve.log"
    feedback = tmp_path_factory.mktemp("replicas") / "feedback.sqlite"  # the replicas share it
    # one request at a time per replica (and as many waiting at the ingress), so that a burst meets the limit;
    # every other test here sends one request at a time
    options = ("--replicas", "2", "--cpus-per-replica", "1", "--max-queue", "1", "--feedback-db", str(feedback))
    options += ("--api-key", KEY)
    with _serving(log, *options) as url:
        yield url


def _benchmark():
    return importlib.import_module("benchmarks.affinity")


def test_repeated_documents_go_to_the_replica_that_has_them(replicas_url, monkeypatch):
    """20 documents, each asked 5 times in shuffled order: every visit after a document's first hits its replica's
    prefix cache (at least 78 of the 80 possible; random routing gets about 61: benchmarks/affinity.py)."""
    benchmark = _benchmark()
    # the benchmark's client, sending the key
    monkeypatch.setattr(benchmark, "httpx", SimpleNamespace(Client=functools.partial(httpx.Client, headers=AUTH)))
    result = benchmark.measure(replicas_url, documents=20, visits=5, seed=1)
    assert result["replicas"] == 2
    assert result["hits"] >= 78, result
    assert result["hits"] + result["partial_hits"] + result["misses"] == 100
    health = httpx.get(f"{replicas_url}/health", timeout=30).json()
    assert all(r["prefix_cache"]["hits"] > 0 for r in health["replicas"])  # both replicas took documents


def test_replicas_answer_as_the_model_in_process(replicas_url, real_decider):
    """The model in this process gives the same answers, within 1e-5: a replica's document is prefilled over what
    its prefix cache held, this process's over what its own held, and float32 sums taken in other pieces (and on
    another number of threads) differ by a few 1e-6 on this model."""
    questions = {
        "happy": {"type": "noul", "instructions": "Is the customer happy?"},
        "urgency": {"type": "score", "criteria": ["can wait", "this week", "today"]},
    }
    for state in ("The parcel came broken and nobody answers.", {"ticket": 4, "text": "Thanks, all good now!"}):
        body = {"state": state, "questions": questions, "x_calibration": "raw", "x_order_reads": 1}
        response = httpx.post(f"{replicas_url}/v1/systemone", json=body, headers=AUTH, timeout=120)
        assert response.status_code == 200, response.text
        got, want = response.json()["answers"], real_decider.respond(body)["answers"]
        assert _numbers(got) == pytest.approx(_numbers(want), abs=1e-5)
        assert set(_numbers(got)) >= {"happy.noul", "happy.x_raw_mass", "urgency.probabilities.2"}


def _numbers(value, path: str = "") -> dict[str, float]:
    """Every number in an answer body, by its dotted path."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _numbers(item, f"{path}{key}.").items()}
    return {path.rstrip("."): value} if isinstance(value, (int, float)) and not isinstance(value, bool) else {}


BAD = [
    ("POST", "/v1/systemone", {"content-type": "application/json"}, b"{not json"),
    ("POST", "/v1/systemone", {}, json.dumps({"state": "x", "questions": {"q": {"type": "maybe"}}}).encode()),
    ("POST", "/v1/systemone", {"content-encoding": "br"}, b"{}"),
    ("POST", "/v1/systemone", {}, b" " * (LIMIT + 1)),
    ("POST", "/v1/chat/completions", {}, json.dumps({"messages": "hello"}).encode()),
    ("GET", "/nowhere", {}, b""),
]  # fmt: skip


def test_bad_requests_get_the_single_servers_answers(replicas_url, server_url):
    with httpx.Client(headers=AUTH, timeout=60) as client:  # the single server's auth is off: it ignores the key
        for method, path, headers, body in BAD:
            want = client.request(method, server_url + path, headers=headers, content=body)
            got = client.request(method, replicas_url + path, headers=headers, content=body)
            assert (got.status_code, got.json()) == (want.status_code, want.json()), (method, path)
            assert 400 <= got.status_code < 500


def test_metrics_carry_every_replicas_series(replicas_url):
    health = httpx.get(f"{replicas_url}/health", timeout=30).json()
    text = httpx.get(f"{replicas_url}/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    labeled = {s.labels.get("replica") for s in families["typedlm_requests"].samples}
    assert labeled >= {r["replica"] for r in health["replicas"]}
    assert len(health["replicas"]) == 2


def test_the_application_builder_takes_serve_runs_key_value_args(monkeypatch):
    """`serve run typedlm.replicas.app:app_builder replicas=3 ...`: strings typed by the options' model, API keys
    also from the environment; a bad value refused before anything starts."""
    pytest.importorskip("ray.serve")
    from pydantic import ValidationError

    from typedlm.decide.config import served_config
    from typedlm.replicas.app import ReplicaArgs, app_builder

    monkeypatch.setenv("TYPEDLM_API_KEYS", "from-env")
    seen = {}
    monkeypatch.setattr("typedlm.replicas.app.build_app", lambda options: seen.setdefault("options", options))
    app_builder({"replicas": "3", "max_queue": "4", "device": "cuda", "affinity": "false", "api_keys": ["k"]})
    options = seen["options"]
    assert isinstance(options, ReplicaArgs)
    assert (options.replicas, options.max_queue, options.on_gpu, options.affinity) == (3, 4, True, False)
    assert options.api_keys == ("k", "from-env")
    assert served_config(options).prefix_cache_bytes == 1024 << 20
    with pytest.raises(ValidationError):
        app_builder({"replicas": "0"})


def test_more_requests_than_the_replicas_take_get_503_with_retry_after(replicas_url):
    """Two replicas taking one request at a time each, and two more waiting at the ingress: of ten requests sent at
    once on new documents, the rest get 503 with Retry-After in the route's own error shape, never another 5xx."""

    async def burst(path: str, body) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=replicas_url, headers=AUTH, timeout=120) as client:
            return await asyncio.gather(*(client.post(path, json=body(i)) for i in range(10)))

    one = asyncio.run(burst("/v1/systemone", lambda i: {"state": f"ticket {i} " * 100, "questions": QUESTIONS}))
    chat = asyncio.run(burst("/v1/chat/completions", lambda i: _chat(f"ticket {i} " * 100)))
    for responses, shape in ((one, "detail"), (chat, "error")):
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 503} and statuses.count(200) >= 2, statuses
        for busy in (r for r in responses if r.status_code == 503):
            assert busy.headers["retry-after"] == "1"
            assert "busy" in json.dumps(busy.json()[shape])


def test_jevcompat_passes_against_the_replicas_with_the_key(replicas_url, tmp_path):
    """The independent conformance suite, as scripts/conformance.sh runs it against a single server, judged by
    scripts/check_conformance.py's rule: no requirement fails (that each passes in some run is the open and keyed
    runs' part), and jevcompat finished every case (none aborted, errored or timed out). Before the feedback test: the
    labels posted there are used for every noul question after it (they count for the question's kind too)."""
    pytest.importorskip("jevcompat")
    judge = runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "check_conformance.py"))["judge"]
    out = tmp_path / "replicas.json"
    jevcompat = Path(sys.executable).with_name("jevcompat")
    command = [str(jevcompat), "test", replicas_url, "--key", KEY, "--timeout", "300", "--json", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert out.exists(), run.stdout + run.stderr
    report = json.loads(out.read_text())
    verdict = judge([report])
    assert not verdict.failed, "\n".join([*verdict.lines(), run.stdout[-8000:]])
    assert report["summary"]["verdict"] == "conformant", run.stdout[-8000:]


def test_feedback_posted_to_one_replica_is_used_by_both(replicas_url):
    """Gold answers posted through the ingress land on one replica (its document's); the other learns them from the
    shared database within its poll (1 s). Questions of a family no other test asks, so their answers are unmoved."""
    question = {"type": "noul", "instructions": "Does the sender mention a delivery?"}
    posts = [("My parcel never came.", True), ("The invoice total is wrong.", False), ("Delivery was late.", True)]
    for document, gold in posts:
        body = {"state": document, "questions": {"delivery": question}, "gold": {"delivery": gold}}
        reply = httpx.post(f"{replicas_url}/v1/systemone/feedback", json=body, headers=AUTH, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["x_feedback_stored"] == 1
    deadline = time.monotonic() + 30
    while True:
        health = httpx.get(f"{replicas_url}/health", timeout=30).json()
        learned = [replica["feedback"]["labels"] for replica in health["replicas"]]
        if learned == [3, 3] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert learned == [3, 3], health
    for document in ("Is my package on its way?", "Nothing arrived today.", "Thanks for the quick shipping!"):
        # with a coverage of 0.5 one fair label is enough for a set (its level the most labeled: other tests' yes/no
        # labels may be there too): scored out of fold on whichever replica answers
        body = {"state": document, "questions": {"delivery": question}, "x_coverage": 0.5}
        reply = httpx.post(f"{replicas_url}/v1/systemone", json=body, headers=AUTH, timeout=120)
        answer = reply.json()["answers"]["delivery"]
        assert answer["x_feedback"] == {"level": "exact", "labels": 3, "readout": "calibrated"}
        assert answer["x_set"]["labels"] >= 3 and answer["x_set"]["guaranteed"] is True


def test_labels_by_id_reach_the_replica_that_holds_their_answers(replicas_url):
    """Answers on new documents land on both replicas; a label by id, sent to the ingress, is stored by the replica
    that gave the answer (any other would answer 404); a list naming answers of both replicas is refused, naming
    them; what to label next is asked of both. After the feedback test: its answers stay as it measures them."""
    question = {"type": "choice", "instructions": "Which product is it about?", "criteria": {"app": None, "web": None}}
    ids = []
    for i in range(8):
        body = {"state": f"Case {i}: the {'app' if i % 2 else 'website'} logs me out.", "questions": {"p": question}}
        reply = httpx.post(f"{replicas_url}/v1/systemone", json=body, headers=AUTH, timeout=120)
        assert reply.status_code == 200, reply.text
        ids.append(reply.json()["answers"]["p"]["x_id"])
    origins = {key.split(".")[0] for key in ids}
    assert len(origins) == 2, ids  # the router spreads new documents over the replicas
    health = httpx.get(f"{replicas_url}/health", timeout=30).json()
    assert origins == {replica["replica"] for replica in health["replicas"]}  # each id names its replica
    by_origin = {origin: [key for key in ids if key.startswith(origin)] for origin in origins}
    both = [{"x_id": keys[0], "gold": "app"} for keys in by_origin.values()]
    refused = httpx.post(f"{replicas_url}/v1/systemone/feedback", json={"labels": both}, headers=AUTH, timeout=60)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "labels"]
    suggested = httpx.get(f"{replicas_url}/v1/systemone/feedback/suggest", params={"n": 3}, headers=AUTH).json()
    assert suggested["answers"] >= 8 and len(suggested["random"]) == 3
    # to teach: the rest of each replica's answers after its own draw of 3 (3 or more of the 8 at one of them)
    assert 0 < len(suggested["teach"]) <= 3 and not set(suggested["teach"]) & set(suggested["random"])
    for key in ids:
        labels = {"x_id": key, "gold": "web"}
        reply = httpx.post(f"{replicas_url}/v1/systemone/feedback", json=labels, headers=AUTH, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["x_feedback_stored"] == 1
    health = httpx.get(f"{replicas_url}/health", timeout=30).json()
    assert sum(replica["answer_window"]["labeled_by_id"] for replica in health["replicas"]) == 8
    assert httpx.get(f"{replicas_url}/v1/systemone/feedback/suggest").status_code == 401  # the key, as each replica
