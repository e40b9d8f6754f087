"""What a second thread's OpenMP workers cost the model thread's forwards on a CPU (`hosting.threads`).

    python -m benchmarks.thread_teams                      # a tiny random Qwen3, cached document, Q = 32
    python -m benchmarks.thread_teams --model DIR --questions 4

libgomp keeps a team of OpenMP workers for each thread that has run a parallel operator, as long as that thread
lives; with more workers than cores it puts idle ones to sleep at once instead of letting them spin, and each of
a forward's operators then wakes them by system call. In one process, in rounds: the same requests answered on
this thread while it is the only one that has used OpenMP ("one team"), then while a second live thread has run
one parallel operator ("two teams"), then again once that thread has ended. Ends with the JSON path
(results/thread_teams/DATE.json).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from benchmarks.harness import (
    Documents,
    add_model_arguments,
    add_output_arguments,
    host_cpu,
    load_benchmark_model,
    make_questions,
    output_path,
    table_head,
    table_row,
    tiny_qwen3,
    write_report,
)
from typedlm.core.names import CalibrationMethod
from typedlm.decide.decider import Decider
from typedlm.text.prompt import ChatLayout


def use_openmp_then_wait(torch, release: threading.Event) -> None:
    """A thread that runs one parallel operator (its OpenMP team is made) and lives until `release`."""
    torch.ones(1 << 22).exp().sum()
    release.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, device=None)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--requests", type=int, default=30, help="measured requests per setting and round")
    parser.add_argument("--rounds", type=int, default=3)
    add_output_arguments(parser, "thread_teams")
    args = parser.parse_args()
    import torch

    loaded = tiny_qwen3() if args.model is None and not args.random_qwen3_06b else load_benchmark_model(args, "cpu")[0]
    decider = Decider(loaded, calibration=CalibrationMethod.RAW, feedback_db=None)
    state = Documents(ChatLayout(decider.tokenizer), args.prefix_tokens).next()
    questions = make_questions(args.questions)

    def answer() -> list[float]:
        decider.decide(state, questions)  # warm-up
        times = []
        for _ in range(args.requests):
            started = time.perf_counter()
            decider.decide(state, questions)
            times.append(1e3 * (time.perf_counter() - started))
        return times

    times: dict[str, list[float]] = {"one team": [], "two teams": [], "the second thread ended": []}
    for _ in range(args.rounds):
        times["one team"] += answer()
        release = threading.Event()
        other = threading.Thread(target=use_openmp_then_wait, args=(torch, release))
        other.start()
        time.sleep(0.2)  # its operator done, its workers asleep
        times["two teams"] += answer()
        release.set()
        other.join()
        times["the second thread ended"] += answer()
    rows = [{"setting": name, "ms": statistics.median(values), "all_ms": values} for name, values in times.items()]
    print(table_head(("setting", "median ms", "× one team"), "lrr"))
    for row in rows:
        print(table_row([row["setting"], f"{row['ms']:.2f}", f"{row['ms'] / rows[0]['ms']:.2f}"]))
    report = {
        "benchmark": "thread_teams", "model": loaded.name, "date": time.strftime("%Y-%m-%d"), **host_cpu(),
        "torch_threads": torch.get_num_threads(), "questions": args.questions, "prefix_tokens": args.prefix_tokens,
        "rows": rows,
    }  # fmt: skip
    print(f"wrote {write_report(report, output_path(args, 'thread_teams'))}")


if __name__ == "__main__":
    main()
