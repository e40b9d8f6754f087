"""What a learned readout costs: answering with one against the same labels' calibration alone (Q questions a
request), and a feedback post (which stores the read's features and refits the readouts) against a request.

    python -m benchmarks.readout [--labels 120] [--questions 32] [--rounds 30]

The embedded model on the CPU, a feedback database of its own. First `--labels` posts, each one yes/no question
about a new message (about a payment or not), timed beside a plain request about another new message in alternating
order: the post's extra over the request, median and 90th percentile. Then requests of `--questions` yes/no
questions about new messages, answered in turn three ways on the same decider: with the readouts in force (every
question's answer through the learned readout of its kind), with them set aside (calibration alone: the features are
still read, as on any server with a feedback database), and by a decider without a feedback database (no features
read). The answer step alone (the reads calibrated and typed) is timed too, as the forward dominates a request.
Ends with one JSON line, written to results/readout/DATE[-label].json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import add_output_arguments, output_path, write_report
from typedlm.core.questions import parse_questions
from typedlm.decide import answer as answer_module
from typedlm.decide.decider import Decider
from typedlm.runtime.models import load_model

PAYMENT = [
    "I was charged twice for",
    "Please refund the money for",
    "The invoice is wrong for",
    "My card was billed for",
]
OTHER = ["The app crashes when I open", "I cannot log in to", "The page never loads for", "Notifications stopped for"]
THINGS = ["my subscription", "the family plan", "order 1182", "the yearly account", "the team workspace", "my cart"]


def message(i: int) -> tuple[str, bool]:
    """A new message (numbered, so that no two are alike) and whether it is about a payment."""
    opening, thing = list(itertools.product(PAYMENT + OTHER, THINGS))[i % 48]
    return f"Ticket {i}: {opening} {thing}.", opening in PAYMENT


def questions(n: int) -> dict:
    return {f"q{i}": {"type": "noul", "instructions": f"Is this message about a payment? ({i})"} for i in range(n)}


def median_p90(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(values), "p90": ordered[int(0.9 * (len(ordered) - 1))]}


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return 1e3 * (time.perf_counter() - start)


class StepTimer:
    """The answer step (`decide.answer.respond`) timed, around the module's own function."""

    def __init__(self):
        self.times: list[float] = []
        self.respond = answer_module.respond

    def __enter__(self):
        def wrapped(*args, **kwargs):
            start = time.perf_counter()
            try:
                return self.respond(*args, **kwargs)
            finally:
                self.times.append(1e3 * (time.perf_counter() - start))

        answer_module.respond = wrapped
        import typedlm.decide.decider as decider_module

        decider_module.respond = wrapped
        return self

    def __exit__(self, *exc):
        import typedlm.decide.decider as decider_module

        answer_module.respond = decider_module.respond = self.respond


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels", type=int, default=120)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30)
    add_output_arguments(parser, "readout")
    args = parser.parse_args()
    loaded = load_model(None, "cpu", "float32")
    with tempfile.TemporaryDirectory() as tmp:
        decider, plain = Decider(loaded, feedback_db=Path(tmp) / "f.sqlite"), Decider(loaded)
        asked = {"q": questions(1)["q0"]}
        extra = []
        for i in range(args.labels):
            text, gold = message(2 * i)
            request = {"state": message(2 * i + 1)[0], "questions": asked}
            post = {"state": text, "questions": asked, "gold": {"q": gold}}
            calls = [lambda r=request: decider.respond(r), lambda p=post: decider.respond_feedback(p)]
            took = [timed(call) for call in (calls if i % 2 else calls[::-1])]
            extra.append(took[1] - took[0] if i % 2 else took[0] - took[1])
        decider.feedback.settle()  # the fold models' readouts learn on a thread of their own
        many = parse_questions(questions(args.questions))
        readouts = decider.calibrators.feedback.out_of_fold.readouts
        learned = readouts.snapshot
        probe = decider.decide(message(10_001)[0], many).to_wire()["answers"]
        share = sum(a.get("x_feedback", {}).get("readout") == "learned" for a in probe.values()) / len(probe)
        ways = {
            "learned readout": lambda s: decider.decide(s, many),
            "calibration alone": lambda s: decider.decide(s, many),
            "no feedback database": lambda s: plain.decide(s, many),
        }
        totals = {way: [] for way in ways}
        steps = {way: [] for way in ways}
        for r in range(args.rounds):
            for j, way in enumerate(sorted(ways, key=lambda w: (hash(w) + r) % 3)):
                readouts.snapshot = learned if way == "learned readout" else {}
                text = message(20_000 + 3 * r + j)[0]
                with StepTimer() as step:
                    totals[way].append(timed(lambda t=text, w=way: ways[w](t)))
                steps[way].append(step.times[-1])
        readouts.snapshot = learned
        decider.close()
    rows = {way: {"request_ms": median_p90(totals[way]), "answer_step_ms": median_p90(steps[way])} for way in ways}
    print(f"posts: {args.labels} labels; a post's extra over a request: {median_p90(extra)} ms")
    print(f"Q = {args.questions}: {share:.0%} of the answers through a learned readout")
    print(f"{'answered by':<22} {'request ms (p90)':>18} {'answer step ms (p90)':>22}")
    for way, row in rows.items():
        req, step = row["request_ms"], row["answer_step_ms"]
        print(f"{way:<22} {req['median']:>9.2f} ({req['p90']:>6.2f}) {step['median']:>13.3f} ({step['p90']:>6.3f})")
    report = {
        "benchmark": "readout",
        "labels": args.labels,
        "questions": args.questions,
        "rounds": args.rounds,
        "post_extra_ms": median_p90(extra),
        "learned_share": share,
        "ways": rows,
    }
    print(json.dumps(report))
    write_report(report, output_path(args, "readout"))


if __name__ == "__main__":
    main()
