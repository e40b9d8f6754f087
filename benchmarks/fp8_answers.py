"""Whether FP8 projections would keep a real model's answers: the same labeled questions answered with every
projection of every decoder layer in bfloat16 (what the engine runs) and through FP8, compared answer by answer.

    python -m benchmarks.fp8_answers [--model qwen2.5-coder-1.5b] [--sets boolq rotten_tomatoes bbc_news arc
                                     amazon_sentiment] [--per-set 30]

FP8 is emulated where the product runs (any device, the CPU included): every `torch.nn.functional.linear` of the
decoder layers (q/k/v joined, the attention's output, gate/up joined, down; the LM head is not one) quantizes its
input per row and its weight per output row to e4m3 (a float32 scale each, amax / 448, as `fp8_projections` times
them), multiplies the dequantized values in float32 and rounds the result to the model's dtype. That is what an FP8
product with a float32 accumulator and those scales computes, up to the order of the sums. Each way has a decider of
its own, so the system prompt's cached keys are the ones its way computes, and every document is new to each.

For scale, the same answers in float32 too: how far bfloat16 itself already moves them (bfloat16 is the engine's
default on a GPU). The examples are a class-balanced sample of each set's held-out split (`typedlm.offline.evaldata`).
Per answer: the largest change of any option's probability (the raw probabilities, before calibration); per set and
over all: the median, 99th percentile and largest change, the share of answers that moved by more than 0.01, the
share whose top answer changed, and the accuracy before and after. The bound asked of FP8 is answers within 0.01 of
bfloat16's. Prints a table and writes results/fp8_answers/DATE[-label].json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np
import torch

from benchmarks.fp8_projections import quantize_rows
from benchmarks.harness import add_output_arguments, output_path, table_head, table_row, write_report
from typedlm.decide.decider import Decider
from typedlm.offline.evaluate import load_examples
from typedlm.offline.readouts import Readout, record

DEFAULT_SETS = ("boolq", "rotten_tomatoes", "bbc_news", "arc", "amazon_sentiment")
MOVED = 0.01  # the bound asked for on an answer's change
WAYS = {"float32": "float32", "bfloat16": "bfloat16", "fp8": "bfloat16"}  # way → the model's dtype
COMPARED = (("bfloat16", "fp8"), ("float32", "bfloat16"))  # (before, after): what FP8 moves; what bfloat16 does


def fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] rounded through e4m3 with one float32 scale per row (`fp8_projections.quantize_rows`), back in
    float32."""
    q, scale = quantize_rows(x)
    return q.float() * scale


@contextlib.contextmanager
def fp8_projections():
    """Every `torch.nn.functional.linear` inside as an emulated FP8 product (weights rounded once each)."""
    plain = torch.nn.functional.linear
    rounded: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(weight) → (weight, its FP8 rounding)

    def linear(x, weight, bias=None):
        kept = rounded.get(id(weight))
        if kept is None or kept[0] is not weight:
            kept = rounded[id(weight)] = (weight, fp8_rows(weight))
        out = fp8_rows(x) @ kept[1].T
        if bias is not None:
            out = out + bias.float()
        return out.to(x.dtype)

    torch.nn.functional.linear = linear
    try:
        yield
    finally:
        torch.nn.functional.linear = plain


def probabilities(readout: Readout) -> np.ndarray:
    masses = np.asarray(readout.masses[0], dtype=np.float64)
    return masses / masses.sum()


def compare(plain: list[Readout], fp8: list[Readout]) -> dict:
    """The change per answer from `plain` to `fp8`, summarized; the accuracy before and after."""
    changes, flips, right_plain, right_fp8 = [], 0, 0, 0
    for a, b in zip(plain, fp8, strict=True):
        assert (a.example, a.question) == (b.example, b.question)
        pa, pb = probabilities(a), probabilities(b)
        changes.append(float(np.abs(pa - pb).max()))
        flips += int(pa.argmax() != pb.argmax())
        right_plain += int(pa.argmax() == a.gold)
        right_fp8 += int(pb.argmax() == b.gold)
    n = len(changes)
    return {
        "answers": n,
        "median_change": statistics.median(changes),
        "p99_change": float(np.quantile(changes, 0.99)),
        "max_change": max(changes),
        "moved_share": sum(c > MOVED for c in changes) / n,
        "top_changed_share": flips / n,
        "accuracy_before": right_plain / n,
        "accuracy_after": right_fp8 / n,
    }


def _cells(row: dict) -> list[str]:
    return [
        f"{row['median_change']:.4f}",
        f"{row['p99_change']:.4f}",
        f"{row['max_change']:.4f}",
        f"{row['moved_share']:.1%}",
        f"{row['top_changed_share']:.1%}",
        f"{row['accuracy_before']:.3f}",
        f"{row['accuracy_after']:.3f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="an installed model's name, a path or hub id")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sets", nargs="+", default=list(DEFAULT_SETS))
    parser.add_argument("--per-set", type=int, default=30, help="held-out examples per set (class-balanced)")
    add_output_arguments(parser, "fp8_answers")
    args = parser.parse_args()

    examples = {name: load_examples(name, "held_out", args.per_set) for name in args.sets}
    readouts: dict[str, dict[str, list[Readout]]] = {}
    seconds = {}
    for way, dtype in WAYS.items():
        start = time.perf_counter()
        with fp8_projections() if way == "fp8" else contextlib.nullcontext():
            decider = Decider.load(args.model, args.device, dtype)
            readouts[way] = {name: record(decider, sample, name) for name, sample in examples.items()}
        seconds[way] = round(time.perf_counter() - start, 1)
        del decider

    comparisons = {}
    columns = ["ways", "set", "answers", "median Δp", "p99 Δp", "max Δp", f"Δp > {MOVED}", "top changed", "acc", "acc"]
    print(table_head(columns, "llrrrrrrrr"))
    for before, after in COMPARED:
        rows = {name: compare(readouts[before][name], readouts[after][name]) for name in args.sets}
        rows["all"] = compare(
            [r for name in args.sets for r in readouts[before][name]],
            [r for name in args.sets for r in readouts[after][name]],
        )
        comparisons[f"{before} → {after}"] = rows
        for name, row in rows.items():
            print(table_row([f"{before} → {after}", name, row["answers"], *_cells(row)]))
    report = {
        "benchmark": "fp8_answers",
        "model": args.model,
        "device": args.device,
        "per_set": args.per_set,
        "seconds": seconds,
        "comparisons": comparisons,
    }
    print(write_report(report, output_path(args, "fp8_answers")))


if __name__ == "__main__":
    main()
