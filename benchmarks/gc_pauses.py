"""Python's garbage collector while serving: its full collections' pauses, with and without `gc.freeze()`.

    python -m benchmarks.gc_pauses                          # CPU, the embedded model's host work
    python -m benchmarks.gc_pauses --seconds 10 --rounds 1  # a quick look

A serving process holds about 400,000 Python objects from start-up (torch, transformers, the model, the
tokenizer), and CPython's full (generation 2) collection walks every one, holding the interpreter lock: no thread
tokenizes, launches a forward or answers meanwhile. `typedlm serve` freezes what start-up made
(`hosting.heap.freeze_start_up_objects`); this measures what that changes. The host work of serving runs as fast
as it can: --documents new documents of P ≈ --prefix-tokens tokens per forward, --questions yes/no questions
each, prepared and answered by the decider on its static path with the forward replaced by a constant output of
its size (`request_steps --no-forward`), so the collector sees a fast GPU server's allocations. Settings
alternate in one process, --rounds times each, --seconds each: "plain" (everything unfrozen: `gc.unfreeze()`)
and "frozen" (a collection, then `gc.freeze()`). Per round: documents/s, full collections, their median and
longest pause, and the share of the time they took. Ends with one JSON line; the JSON goes to
results/gc_pauses/DATE-DEVICE[-label].json.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
import time

from benchmarks.harness import (
    Documents,
    add_model_arguments,
    add_output_arguments,
    device_kind,
    load_benchmark_model,
    make_questions,
    output_path,
    table_head,
    table_row,
    write_report,
)
from benchmarks.request_steps import without_forward
from typedlm.core.options import EngineOptions
from typedlm.decide.decider import Decider
from typedlm.hosting.heap import freeze_start_up_objects


class FullCollections:
    """The pauses (ms) of the full collections that ran while it was installed (`gc.callbacks`)."""

    def __init__(self):
        self.pauses: list[float] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif info["generation"] == 2:
            self.pauses.append(1e3 * (time.perf_counter() - self._started))

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_) -> None:
        gc.callbacks.remove(self)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--documents", type=int, default=8, help="new documents per forward")
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--seconds", type=float, default=30.0, help="per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each setting, alternating")
    add_output_arguments(parser, "gc_pauses")
    args = parser.parse_args()
    loaded, _ = load_benchmark_model(args)
    decider = Decider(loaded, prefix_cache_bytes=0, engine=EngineOptions(cuda_graphs=True))
    without_forward(decider.engine.forward.runner)
    questions = make_questions(args.questions)
    documents = Documents(decider.layout, args.prefix_tokens)  # each new

    def forward() -> None:  # one forward's documents
        decider.launch_prepared([decider.prepare_request(documents.next(), questions) for _ in range(args.documents)])()

    for _ in range(5):  # warm-up: caches filled, as in a server
        forward()
    rows = []
    columns = ("round", "setting", "docs/s", "full collections", "median ms", "longest ms", "share of the time",
               "objects walked")  # fmt: skip
    print(table_head(columns, "rlrrrrrr"))
    for round_, setting in enumerate(["plain", "frozen"] * args.rounds):
        gc.unfreeze()
        if setting == "frozen":
            freeze_start_up_objects()
        before, started = documents.count, time.perf_counter()
        with FullCollections() as collections:
            while time.perf_counter() - started < args.seconds:
                forward()
        seconds = time.perf_counter() - started
        pauses = collections.pauses
        row = {
            "setting": setting,
            "docs_per_s": round((documents.count - before) / seconds, 1),
            "full_collections": len(pauses),
            "median_ms": round(statistics.median(pauses), 2) if pauses else None,
            "longest_ms": round(max(pauses), 2) if pauses else None,
            "share": round(sum(pauses) / 1e3 / seconds, 4),
            "objects_walked": len(gc.get_objects()),
            "seconds": round(seconds, 1),
        }
        rows.append(row)
        cells = (round_ + 1, setting, row["docs_per_s"], len(pauses), row["median_ms"] or "-", row["longest_ms"] or "-")
        print(table_row((*cells, f"{100 * row['share']:.2f}%", row["objects_walked"])), flush=True)
    gc.unfreeze()
    report = {
        "benchmark": "gc_pauses",
        "date": str(datetime.date.today()),
        "model": loaded.name,
        "device": args.device,
        "python": sys.version.split()[0],
        "questions": args.questions,
        "documents_per_forward": args.documents,
        "prefix_tokens": args.prefix_tokens,
        "rows": rows,
    }
    write_report(report, output_path(args, "gc_pauses", device_kind(args.device)))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
