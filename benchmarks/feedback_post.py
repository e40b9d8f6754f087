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
"""

from __future__ import annotations

import argparse
import datetime
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--posts", type=int, default=300, help="rounds in each of the two ways (default 300)")
    parser.add_argument("--questions", type=int, default=2, choices=(1, 2, 3), help="questions per body")
    add_output_arguments(parser, "feedback_post")
    args = parser.parse_args()
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
