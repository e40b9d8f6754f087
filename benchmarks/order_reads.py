"""Cost of order-debiased reads: k rotations of every choice/score question, side by side with one read.

The rotations are more suffixes in the same packed pass over the same document, so k reads should cost
less than k single reads. For k = 1..4 this times `Decider.decide(..., order_reads=k)` on a document of
P ≈ 1266 tokens with Q choice and score questions, with the prefix cache off (a new document each time)
and warm (the document cached: only the suffixes run); medians of --repeats runs after a warm-up, and the
ratio to k = 1 measured in the same run. Prints a table, writes JSON (results/order_reads/) and ends with one JSON
line.

    python -m benchmarks.order_reads                       # CPU, the embedded model
    python -m benchmarks.order_reads --device cuda --random-qwen3-0.6b --tokenizer DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date

import torch

from benchmarks.harness import (
    add_model_arguments,
    add_output_arguments,
    device_kind,
    load_benchmark_model,
    make_state,
    output_path,
    write_report,
)
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import ChoiceQuestion, ScoreQuestion
from typedlm.decide.decider import Decider

TOPICS = ("billing", "shipping", "returns", "account access", "product quality", "other")


def make_questions(n: int) -> dict:
    """Alternating choice (six topics) and score (five levels) questions."""
    questions = {}
    for i in range(n):
        if i % 2 == 0:
            options = tuple((topic, None) for topic in TOPICS)
            questions[f"q{i}"] = ChoiceQuestion(options, f"Which topic does message {i} of the thread raise?")
        else:
            levels = ("not at all", "slightly", "somewhat", "very", "extremely")
            questions[f"q{i}"] = ScoreQuestion(levels, f"How upset is the customer in message {i}?")
    return questions


def timed(fn, repeats: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--reads", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    add_output_arguments(parser, "order_reads")
    args = parser.parse_args()
    loaded, dtype = load_benchmark_model(args)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    fresh = Decider(loaded, prefix_cache_bytes=0, calibration=CalibrationMethod.RAW)
    cached = Decider(loaded, calibration=CalibrationMethod.RAW)
    state, questions = make_state(fresh.layout, args.prefix_tokens), make_questions(args.questions)
    rows = []
    for name, decider in (("new document", fresh), ("cached document", cached)):
        for k in args.reads:
            ms = timed(lambda d=decider, k=k: d.decide(state, questions, order_reads=k), args.repeats, sync)
            tokens = decider.decide(state, questions, order_reads=k).usage.input_tokens
            rows.append({"case": name, "reads": k, "ms": round(ms, 1), "tokens": tokens})
        one = next(r["ms"] for r in rows if r["case"] == name and r["reads"] == 1)
        for r in rows:
            if r["case"] == name:
                r["x_one_read"] = round(r["ms"] / one, 2)
                print(f"{name:<16} k={r['reads']}  {r['ms']:>9.1f} ms  {r['x_one_read']:>5.2f}× one read  "
                      f"(k× would be {r['reads']:.2f}×)  tokens {r['tokens']}", flush=True)  # fmt: skip
    report = {
        "benchmark": "order_reads",
        "date": date.today().isoformat(),
        "model": fresh.name,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu x{torch.get_num_threads()}",
        "dtype": dtype,
        "questions": args.questions,
        "prefix_tokens": len(fresh.layout.tokenize(state, list(questions.values())).prefix_ids),
        "repeats": args.repeats,
        "rows": rows,
    }
    write_report(report, output_path(args, "order_reads", device_kind(args.device)))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
