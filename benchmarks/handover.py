"""What answer sets and selective answers cost: a request with `x_coverage` and `x_min_accuracy` against the same
request without them, side by side, on a server whose questions have fair labels.

    python -m benchmarks.handover [--labels 200] [--rounds 100] [--questions 4]

The embedded model on the CPU, in process (`Decider.respond`). First `--labels` gold answers are posted (fair
samples, about new documents) for every question, so every answer's set and abstention come from labels scored out
of fold. Then each round asks one request about a new document with and without the two fields, in alternating
order; the table gives the medians (and 90th percentiles) of both and of their difference. Timed apart: the
handover step alone (`hand_over` of every answer of a request, cached scores), the calibration step alone (every
answer of a request from its reads through the learned calibration: `answer_step_ms`), and the first request that
asks for sets right after a post (the fold models' readouts learning the new label on their own thread meanwhile,
`OutOfFold`).
Ends with one JSON line and writes it to results/handover/DATE[-label].json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import add_output_arguments, output_path, write_report
from typedlm.core.questions import Handover, parse_request
from typedlm.decide.decider import Decider

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this message about billing?"},
    "team": {"type": "choice", "instructions": "Which team should handle it?",
             "criteria": {"billing": None, "tech": None, "sales": None}},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["can wait", "soon", "now"]},
    "refund": {"type": "noul", "instructions": "Does it ask for a refund?"},
}  # fmt: skip
ASKED = {"x_coverage": 0.9, "x_min_accuracy": 0.9}


def document(i: int) -> str:
    return f"Ticket {i}: I was charged {i % 7 + 2} times for invoice {1000 + i}. Please refund the extra payments."


def gold(i: int) -> dict:
    return {"billing": i % 3 != 0, "team": ("billing", "tech", "sales")[i % 3], "urgency": i % 3, "refund": i % 2 == 0}


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def timed(call, *args) -> float:
    started = time.perf_counter()
    call(*args)
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels", type=int, default=200, help="gold answers posted per question first")
    parser.add_argument("--rounds", type=int, default=100, help="requests timed each way (default 100)")
    parser.add_argument("--questions", type=int, default=4, choices=range(1, 5), help="questions per request")
    add_output_arguments(parser, "handover")
    args = parser.parse_args()
    asked = dict(list(QUESTIONS.items())[: args.questions])
    decider = Decider.load(feedback_db=Path(tempfile.mkdtemp(prefix="typedlm-handover-")) / "feedback.sqlite")
    for i in range(args.labels):
        g = gold(i)
        decider.respond_feedback({"state": document(10**6 + i), "questions": asked, "gold": {q: g[q] for q in asked}})
    first = []  # the first request asking for sets after a post: the fold learners catch up
    for i in range(5):
        decider.respond_feedback({"state": document(2 * 10**6 + i), "questions": asked, "gold": {"billing": True}})
        first.append(timed(decider.respond, {"state": document(3 * 10**6 + i), "questions": asked, **ASKED}))
    # steady state: what the posts taught is learned (the fold models' readouts learn on a thread of their own)
    decider.feedback.settle()
    rows = []
    for i in range(args.rounds):
        plain = {"state": document(2 * i), "questions": asked}
        handed = {"state": document(2 * i + 1), "questions": asked, **ASKED}
        order = (("plain", plain), ("handover", handed))[:: 1 if i % 2 else -1]
        rows.append({name: timed(decider.respond, body) for name, body in order})
    # the handover step alone: every answer of one request through `hand_over`, scores cached
    request = parse_request({"state": document(0), "questions": asked})
    prepared = decider.prepare_request(request.state, request.questions, keep_reading=True)
    response = decider.launch_prepared([prepared])()[0]
    calibrator = decider.calibrators.default
    handover = Handover(**{"coverage": 0.9, "min_accuracy": 0.9})
    step, answering = [], []
    for _ in range(200):
        started = time.perf_counter()
        for q, answer in response.answers.items():
            calibrator.hand_over(request.questions[q], response.reading.reads[q], answer, handover)
        step.append((time.perf_counter() - started) * 1e3)
        # the calibration step alone: every answer of one request from its reads (the learned calibration)
        started = time.perf_counter()
        for q in response.answers:
            calibrator.answer(request.questions[q], response.reading.reads[q])
        answering.append((time.perf_counter() - started) * 1e3)
    answer = decider.respond({"state": document(0), "questions": asked, **ASKED})["answers"]
    extra = [r["handover"] - r["plain"] for r in rows]
    report = {
        "date": datetime.date.today().isoformat(),
        "model": decider.name,
        "questions": args.questions,
        "labels_per_question": args.labels,
        "rounds": args.rounds,
        "plain_ms": statistics.median(r["plain"] for r in rows),
        "handover_ms": statistics.median(r["handover"] for r in rows),
        "extra_ms": statistics.median(extra),
        "extra_p90_ms": percentile(extra, 90),
        "plain_p90_ms": percentile([r["plain"] for r in rows], 90),
        "step_ms": statistics.median(step),
        "answer_step_ms": statistics.median(answering),
        "first_after_post_ms": statistics.median(first),
        "sets": {q: a["x_set"] for q, a in answer.items()},
    }
    print(f"x_coverage + x_min_accuracy, embedded model on CPU, {args.questions} questions, {args.labels} labels each")
    print(f"{'request ms':>11} {'with ms':>8} {'extra ms':>9} {'extra p90':>10} {'step ms':>8} {'answer step':>12} "
          f"{'first after post':>17}")  # fmt: skip
    r = report
    print(f"{r['plain_ms']:>11.1f} {r['handover_ms']:>8.1f} {r['extra_ms']:>9.2f} "
          f"{r['extra_p90_ms']:>10.1f} {r['step_ms']:>8.3f} {r['answer_step_ms']:>12.3f} "
          f"{r['first_after_post_ms']:>17.1f}")  # fmt: skip
    path = write_report(report, output_path(args, "handover"))
    print(json.dumps(report))
    print(f"written to {path}")
    decider.close()


if __name__ == "__main__":
    main()
