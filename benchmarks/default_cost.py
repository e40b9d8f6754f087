"""What the default calibration costs: the README's example request (Q = 3) under the old default (contextual,
one read) and the model's default now (its shipped calibration file and the order reads it was fitted with),
timed alternately in one process, with the prefix cache off so each request prefills its document.

    python -m benchmarks.default_cost [--model qwen2.5-coder-0.5b] [--repeats 20]

Prints a table of medians and their ratio; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from benchmarks.harness import example_request
from typedlm import Decider
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import parse_request
from typedlm.runtime.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    loaded = load_model(args.model)
    decider = Decider(loaded, prefix_cache_bytes=0)
    request = parse_request(example_request())
    setups = {
        "contextual, 1 read": (CalibrationMethod.CONTEXTUAL, 1),
        "default": (decider.calibration, decider.config.order_reads),
    }
    times: dict[str, list[float]] = {name: [] for name in setups}
    for method, reads in setups.values():  # warm-up: content-free priors, shapes
        decider.decide(request.state, request.questions, method, reads)
    for _ in range(args.repeats):
        for name, (method, reads) in setups.items():
            start = time.perf_counter()
            decider.decide(request.state, request.questions, method, reads)
            times[name].append((time.perf_counter() - start) * 1e3)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["default"] / medians["contextual, 1 read"]
    print(f"{decider.name}, CPU, README example (Q = {len(request.questions)}), medians of {args.repeats}")
    for name, (method, reads) in setups.items():
        print(f"  {name:<20} {method:>10}, {reads} order read(s): {medians[name]:8.1f} ms")
    print(f"  default / contextual, 1 read: {ratio:.2f}x")
    row = {"benchmark": "default_cost", "model": decider.name, "questions": len(request.questions)}
    row.update({"default": setups["default"], "medians_ms": medians, "ratio": round(ratio, 3)})
    print(json.dumps(row))


if __name__ == "__main__":
    main()
