"""A choice question with many options: its own rows attended as plain causal attention where its suffix is long
(`typedlm.ops.attention.CHAIN_SPLIT_ROWS`), against one masked attention over all of them.

    python -m benchmarks.long_options                              # CPU, the embedded model, 64 / 128 / 255 options
    python -m benchmarks.long_options --device cuda --random-qwen3-0.6b --tokenizer DIR

A question's suffix lists its options, so one with 255 options is thousands of rows of its own. Without the split,
those rows attend through one masked call whose scores cover every pair of them ([S, S], most of them masked out:
the CPU kernel computes them all). In one process, in turns: the same request (a new document each time) with the
split as shipped and with it off, medians; the answers of the two compared. Ends with the JSON path
(results/long_options/DATE-DEVICE.json).
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.harness import (
    Documents,
    add_model_arguments,
    add_output_arguments,
    device_kind,
    host_cpu,
    load_benchmark_model,
    output_path,
    report_head,
    table_head,
    table_row,
    write_report,
)
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import ChoiceQuestion
from typedlm.decide.decider import Decider
from typedlm.ops import attention
from typedlm.text.prompt import ChatLayout

TOPICS = ("a refund", "a late parcel", "a broken box", "a double charge", "a wrong size", "a lost password")


def many_options(n: int) -> dict[str, ChoiceQuestion]:
    """One choice question with `n` options, each named by a few words (as a long taxonomy's would be)."""
    options = tuple((f"category {i}: {TOPICS[i % len(TOPICS)]}, case {i * 37 % 101}", None) for i in range(n))
    return {"category": ChoiceQuestion(options, "Which category does this ticket belong to?")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--options", type=int, nargs="+", default=[64, 128, 255])
    parser.add_argument("--prefix-tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3, help="measured requests per setting (after a warm-up)")
    add_output_arguments(parser, "long_options")
    args = parser.parse_args()
    import torch

    loaded, dtype = load_benchmark_model(args)
    decider = Decider(loaded, calibration=CalibrationMethod.RAW, feedback_db=None, prefix_cache_bytes=0)
    documents = Documents(ChatLayout(decider.tokenizer), args.prefix_tokens)
    shipped = attention.CHAIN_SPLIT_ROWS
    settings = {"split": shipped, "one masked call": 1 << 30}
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def answer(questions, split_rows: int, state: str | None = None) -> tuple[float, dict[str, float]]:
        """One request's time (a new document, or `state`) with the chain split at `split_rows`, and its answer."""
        attention.CHAIN_SPLIT_ROWS = split_rows
        try:
            sync()
            started = time.perf_counter()
            got = decider.decide(state or documents.next(), questions).answers["category"]
            sync()
            return 1e3 * (time.perf_counter() - started), dict(got.probabilities)
        finally:
            attention.CHAIN_SPLIT_ROWS = shipped

    rows = []
    print(table_head(("options", "suffix tokens", "split ms", "one masked call ms", "×", "max |Δp|"), "rrrrrr"))
    for n in args.options:
        questions = many_options(n)
        suffix = len(decider.layout.tokenize(documents.base, list(questions.values())).suffix_ids[0])
        times: dict[str, list[float]] = {name: [] for name in settings}
        # the warm-up: both settings on one document, their answers compared
        split_p, masked_p = (answer(questions, split_rows, documents.base)[1] for split_rows in settings.values())
        for _ in range(args.repeats):
            for name, split_rows in settings.items():
                times[name].append(answer(questions, split_rows)[0])
        split, masked = (statistics.median(times[name]) for name in settings)
        delta = max(abs(split_p[option] - masked_p[option]) for option in split_p)
        rows.append({"options": n, "suffix_tokens": suffix, "split_ms": split, "masked_ms": masked,
                     "max_abs_probability_difference": delta, "all_ms": times})  # fmt: skip
        print(table_row([n, suffix, f"{split:.1f}", f"{masked:.1f}", f"{masked / split:.2f}", f"{delta:.1e}"]))
    report = {**report_head("long_options", decider, args.device, dtype), **host_cpu(),
              "torch_threads": torch.get_num_threads(), "chain_split_rows": shipped,
              "prefix_tokens": args.prefix_tokens, "repeats": args.repeats, "rows": rows}  # fmt: skip
    print(f"wrote {write_report(report, output_path(args, 'long_options', device_kind(args.device)))}")


if __name__ == "__main__":
    main()
