"""What a feedback post costs beside a request: `POST /v1/systemone/feedback` against `POST /v1/systemone`, side by
side in one run, in process and over HTTP, as the labels accumulate.

    python -m benchmarks.feedback_post [--posts 300] [--questions 2]

The embedded model on the CPU. Every round asks a request about a new document and posts gold answers about
another new document, in alternating order (so neither always runs first), first in process (`Decider.respond` /
`Decider.respond_feedback`), then over HTTP to a real server (uvicorn on loopback, the model in the server's
process). A post is the same request plus storing its labels (SQLite, WAL) and refitting the levels they touch, so
its extra over the request is the feedback's own cost; labels accumulate in one question family through the run,
so the refits grow with them (each level is fitted on its latest 4096 labels at most). The table gives medians (and
the 90th percentile) of the request, the post and their difference per round, overall and per hundred labels; the
difference of two requests of a few hundred ms is noisy, so in process the feedback step (storing the labels and
learning them) is also timed alone. Ends with one JSON line and writes it to results/feedback_post/DATE[-label].json.

    python -m benchmarks.feedback_post --by-id [--posts 100] [--baseline 100] [--model M] [--questions 2]

A label by answer id against the post of old, over HTTP (uvicorn on loopback, the model in a process of its own as
`typedlm serve` runs it; `--no-model-process`: in the server's): every round asks a request about a new document
(its answers held, each with its id), then posts its gold answers by the answers' ids (one post listing them); and,
for the first `--baseline` rounds, also posts the gold answers of another new document with its state and questions,
the two posts in alternating order. Gives the medians and 90th percentiles of the request, the post by id and the
post of old (labels accumulate in one family per question, as above).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from benchmarks.harness import add_output_arguments, output_path, write_report
from typedlm.decide.decider import Decider
from typedlm.hosting.model_process import ModelProcess
from typedlm.server import ServerSettings, create_app

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this message about billing?"},
    "team": {"type": "choice", "instructions": "Which team should handle it?",
             "criteria": {"billing": None, "tech": None, "sales": None}},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["can wait", "soon", "now"]},
}  # fmt: skip
GOLD = {"billing": True, "team": "billing", "urgency": 2}


def document(i: int) -> str:
    return f"Ticket {i}: I was charged {i % 7 + 2} times for invoice {1000 + i}. Please refund the extra payments."


def bodies(i: int, questions: int) -> tuple[dict, dict]:
    asked = dict(list(QUESTIONS.items())[:questions])
    request = {"state": document(2 * i), "questions": asked}
    post = {"state": document(2 * i + 1), "questions": asked, "gold": {q: GOLD[q] for q in asked}}
    return request, post


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def measure(ask, post, rounds: int, questions: int, offset: int) -> list[dict[str, float]]:
    rows = []
    for i in range(rounds):
        request, posted = bodies(offset + i, questions)
        times = {}
        for name, call, body in (("request", ask, request), ("post", post, posted))[:: 1 if i % 2 else -1]:
            started = time.perf_counter()
            call(body)
            times[name] = (time.perf_counter() - started) * 1e3
        rows.append(times)
    return rows


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    extra = [r["post"] - r["request"] for r in rows]
    return {
        "rounds": len(rows),
        "request_ms": statistics.median(r["request"] for r in rows),
        "post_ms": statistics.median(r["post"] for r in rows),
        "extra_ms": statistics.median(extra),
        "extra_p90_ms": percentile(extra, 90),
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "median_ms": statistics.median(values), "p90_ms": percentile(values, 90)}


def serve(app) -> tuple[uvicorn.Server, threading.Thread, str]:
    """`app` served on a free loopback port, in a thread: the server, its thread and its URL."""
    server = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


def load_with_feedback(model: str | None, path: str) -> Decider:
    """The benchmark's decider (module level: the model process loads it)."""
    return Decider.load(model, feedback_db=path)


def by_id(args: argparse.Namespace) -> None:
    """The post by answer id against the post of old, over HTTP (see the module)."""
    folder = Path(tempfile.mkdtemp(prefix="typedlm-feedback-"))
    load = functools.partial(load_with_feedback, args.model, str(folder / "feedback.sqlite"))
    settings = ServerSettings(request_timeout_s=600)
    model = ModelProcess(load, settings) if args.model_process else load()
    server, thread, url = serve(create_app(model, settings))
    times: dict[str, list[float]] = {"request": [], "by id": [], "state and questions": []}
    with httpx.Client(base_url=url, timeout=600) as client:

        def timed(way: str, path: str, body: dict) -> dict:
            started = time.perf_counter()
            reply = client.post(path, json=body)
            times[way].append((time.perf_counter() - started) * 1e3)
            assert reply.status_code == 200, reply.text
            return reply.json()

        warm = bodies(10**6, args.questions)[0]
        client.post("/v1/systemone", json=warm).raise_for_status()
        for i in range(args.posts):
            request, posted = bodies(i, args.questions)
            answered = timed("request", "/v1/systemone", request)
            labels = [{"x_id": answered["answers"][q]["x_id"], "gold": GOLD[q]} for q in request["questions"]]
            ways = [("by id", "/v1/systemone/feedback", {"labels": labels})]
            if i < args.baseline:
                ways.append(("state and questions", "/v1/systemone/feedback", posted))
            for way, path, body in ways[:: 1 if i % 2 else -1]:
                stored = timed(way, path, body)["x_feedback_stored"]
                assert stored == args.questions, stored
        window = client.get("/health").json()["answer_window"]
        about = client.get("/v1/models").json()["models"][0]["name"]
    server.should_exit = True
    thread.join()
    if args.model_process:
        model.close()
    report = {way: spread(values) for way, values in times.items() if values}
    print(f"feedback by answer id vs the post of old over HTTP, {about}, {args.questions} questions per body")
    for way, s in report.items():
        print(f"{way:<22} n={s['n']:<4} median {s['median_ms']:9.2f} ms   p90 {s['p90_ms']:9.2f} ms")
    result = {
        "benchmark": "feedback_post",
        "mode": "by id",
        "date": datetime.date.today().isoformat(),
        "model": about,
        "model_process": args.model_process,
        "questions": args.questions,
        "labels": args.questions * (args.posts + min(args.baseline, args.posts)),
        "results": report,
        "by_id_ms": [round(value, 3) for value in times["by id"]],  # in order: where the slow ones fall
        "answer_window": window,
    }
    write_report(result, output_path(args, "feedback_post"))
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--posts", type=int, default=None, help="rounds (default 300; 100 with --by-id)")
    parser.add_argument("--questions", type=int, default=2, choices=(1, 2, 3), help="questions per body")
    parser.add_argument("--by-id", action="store_true", help="labels by answer id against the post of old, over HTTP")
    parser.add_argument("--baseline", type=int, default=None, help="with --by-id: rounds with a post of old too")
    parser.add_argument("--model", default=None, help="with --by-id: the model (default: the embedded one)")
    parser.add_argument(
        "--model-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --by-id: the model in a process of its own, as typedlm serve runs it (default)",
    )
    add_output_arguments(parser, "feedback_post")
    args = parser.parse_args()
    if args.by_id:
        args.posts = args.posts or 100
        args.baseline = args.posts if args.baseline is None else args.baseline
        by_id(args)
        return
    args.posts = args.posts or 300
    folder = Path(tempfile.mkdtemp(prefix="typedlm-feedback-"))
    decider = Decider.load(feedback_db=folder / "feedback.sqlite")
    warm = bodies(10**6, args.questions)
    decider.respond(warm[0])
    results = {}
    learning: list[float] = []  # in process: each post's own feedback step (store, learn), timed alone
    record = decider.record_feedback

    def timed_record(posted, response):
        started = time.perf_counter()
        try:
            return record(posted, response)
        finally:
            learning.append((time.perf_counter() - started) * 1e3)

    decider.record_feedback = timed_record
    rows = measure(decider.respond, decider.respond_feedback, args.posts, args.questions, 0)
    decider.record_feedback = record
    results["in process"] = rows
    server = uvicorn.Server(uvicorn.Config(create_app(decider, ServerSettings()), port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:

        def over(path: str):
            def call(body: dict) -> None:
                reply = client.post(path, json=body)
                assert reply.status_code == 200, reply.text

            return call

        results["over HTTP"] = measure(
            over("/v1/systemone"), over("/v1/systemone/feedback"), args.posts, args.questions, args.posts
        )
    labels = decider.feedback.store.count()
    server.should_exit = True
    thread.join()  # the app's shutdown closes the decider's feedback database
    print(f"feedback post vs request, embedded model on CPU, {args.questions} questions, {labels} labels at the end")
    print(f"{'way':<12} {'labels':>11} {'request ms':>11} {'post ms':>9} {'extra ms':>9} {'extra p90':>10}")
    report = {}
    per_round = args.questions
    for way, rows in results.items():
        start = 0 if way == "in process" else args.posts * per_round
        chunks = {"all": rows}
        for at in range(0, len(rows), 100):
            chunks[f"{start + at * per_round}-{start + (at + 100) * per_round}"] = rows[at : at + 100]
        report[way] = {}
        for label, chunk in chunks.items():
            s = report[way][label] = summary(chunk)
            print(
                f"{way:<12} {label:>11} {s['request_ms']:>11.2f} {s['post_ms']:>9.2f} {s['extra_ms']:>9.2f} "
                f"{s['extra_p90_ms']:>10.2f}"
            )
    steps = {
        f"{at * per_round}-{(at + 100) * per_round}": {
            "median_ms": statistics.median(learning[at : at + 100]),
            "p90_ms": percentile(learning[at : at + 100], 90),
            "max_ms": max(learning[at : at + 100]),
        }
        for at in range(0, len(learning), 100)
    }
    print("\nin process, the feedback step alone (store the labels, learn them), per post")
    for label, s in steps.items():
        print(
            f"{'labels ' + label:<20} median {s['median_ms']:.2f} ms, p90 {s['p90_ms']:.2f} ms, "
            f"max {s['max_ms']:.1f} ms"
        )
    result = {
        "benchmark": "feedback_post",
        "date": datetime.date.today().isoformat(),
        "questions": args.questions,
        "labels": labels,
        "results": report,
        "feedback_step": steps,
    }
    write_report(result, output_path(args, "feedback_post"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
