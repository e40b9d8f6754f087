"""The batch job's overhead: `typedlm.jobs.batch.run_batch` (reading JSON Lines, the progress bar, writing records,
errors per row) against calling `Decider.decide` in a loop over the same requests, side by side.

    python -m benchmarks.batch_job [--rows 40] [--repeats 3] [--model M]

Both run the same rows (new documents, the prefix cache off) alternately, `--repeats` times each; prints rows/s
of each (medians) and their ratio, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from typedlm.core.questions import parse_request
from typedlm.decide.decider import Decider
from typedlm.jobs.batch import run_batch
from typedlm.runtime.models import load_model

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "topic": {"type": "choice", "criteria": {"billing": None, "shipping": None, "account": None}},
    "urgency": {"type": "score", "criteria": ["can wait", "this week", "today"]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    decider = Decider(load_model(args.model, "cpu", "float32"), prefix_cache_bytes=0)
    rounds = iter(range(10**6))

    def rows() -> list[dict]:
        r = next(rounds)
        return [
            {"id": i, "state": f"Ticket {r}-{i}: order {1000 * r + i} was charged twice and arrived late.",
             "questions": QUESTIONS}
            for i in range(args.rows)
        ]  # fmt: skip

    def loop() -> float:
        bodies = [parse_request(row) for row in rows()]
        started = time.perf_counter()
        for request in bodies:
            decider.decide(request.state, request.questions, request.calibration, request.order_reads).to_wire()
        return args.rows / (time.perf_counter() - started)

    def job() -> float:
        with tempfile.TemporaryDirectory() as folder:
            source, out = Path(folder) / "in.jsonl", Path(folder) / "out.jsonl"
            source.write_text("".join(json.dumps(row) + "\n" for row in rows()), encoding="utf-8")
            started = time.perf_counter()
            run_batch(decider, source, out, progress=lambda it, total, done: tqdm(it, total=total, unit="row"))
            return args.rows / (time.perf_counter() - started)

    loop(), job()  # warm-up
    results = {"decider loop": [], "batch job": []}
    for _ in range(args.repeats):
        results["decider loop"].append(loop())
        results["batch job"].append(job())
    medians = {name: statistics.median(values) for name, values in results.items()}
    print(f"{decider.name}, {args.rows} rows of 3 questions, medians of {args.repeats}", file=sys.stderr)
    for name, value in medians.items():
        print(f"  {name:<14} {value:.2f} rows/s", file=sys.stderr)
    ratio = medians["batch job"] / medians["decider loop"]
    print(f"  batch job / loop: {ratio:.3f}", file=sys.stderr)
    print(json.dumps({"benchmark": "batch_job", "rows": args.rows, "rows_per_s": medians, "ratio": ratio}))


if __name__ == "__main__":
    main()
