"""How a serving process gives memory back, and what each way costs a CPU forward (`typedlm.hosting.heap`).

    python -m benchmarks.heap_policy                       # the embedded model
    python -m benchmarks.heap_policy --model DIR --requests 40

One process per policy (`POLICIES`) loads the same model: glibc's mmap threshold fixed at 128 KiB (what the model
process did before), left to glibc, or fixed at 16 MiB (`return_freed_memory`); the last two trim
(`trim_freed_memory`) where asked, as the model worker does once idle. They answer the same requests in turns, one
request at a time (the others wait; who goes first rotates): new documents of about --prefix-tokens tokens with 1
and with 32 yes/no questions, then one large request (--large-tokens, 64 questions). Each times `Decider.respond`
in its own process; medians per cell, and each process's resident memory before the large request, its peak so far
(`ru_maxrss`), after it, and after a trim.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import time

from benchmarks.harness import (
    Documents,
    add_output_arguments,
    host_cpu,
    make_questions,
    output_path,
    table_head,
    table_row,
    wire,
    write_report,
)

# a policy: the mmap threshold fixed (bytes) or glibc's own (None), and whether the process trims once idle
POLICIES = {
    "128 KiB fixed": (128 << 10, False),
    "glibc's, trimmed": (None, True),
    "16 MiB fixed, trimmed": (16 << 20, True),
}


def _serve(policy: str, model: str | None, conn) -> None:
    """A policy's process: answers (body → milliseconds) until told None; ("rss",) → its resident MB; ("trim",)."""
    import psutil

    from typedlm.core.names import CalibrationMethod
    from typedlm.decide.decider import Decider
    from typedlm.hosting.heap import return_freed_memory, trim_freed_memory

    threshold, trims = POLICIES[policy]
    if threshold is not None:
        return_freed_memory(threshold)
    decider = Decider.load(model, device="cpu", calibration=CalibrationMethod.RAW, feedback_db=None)
    conn.send(decider.name)
    while (message := conn.recv()) is not None:
        if message == ("rss",):
            conn.send(psutil.Process().memory_info().rss / 2**20)
        elif message == ("peak",):
            conn.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10)
        elif message == ("trim",):
            conn.send(trim_freed_memory() if trims else False)
        else:
            started = time.perf_counter()
            try:
                decider.respond(message)
            except Exception as exc:  # the parent says what failed
                conn.send(exc)
                continue
            conn.send(1e3 * (time.perf_counter() - started))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--requests", type=int, default=8, help="measured requests per cell and policy")
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--large-tokens", type=int, default=3500)
    add_output_arguments(parser, "heap_policy")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from benchmarks.harness import embedded_tokenizer_dir
    from typedlm.text.prompt import ChatLayout

    layout = ChatLayout(AutoTokenizer.from_pretrained(args.model or embedded_tokenizer_dir()))
    documents, large = Documents(layout, args.prefix_tokens), Documents(layout, args.large_tokens)
    context = multiprocessing.get_context("spawn")
    pipes, processes = {}, []
    for policy in POLICIES:
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(policy, args.model, theirs), daemon=True)
        process.start()
        pipes[policy] = ours
        processes.append(process)
    name = [pipes[policy].recv() for policy in POLICIES].pop()

    def ask(policy: str, message):
        pipes[policy].send(message)
        answer = pipes[policy].recv()
        if isinstance(answer, Exception):
            raise SystemExit(f"{policy}: {type(answer).__name__}: {answer}")
        return answer

    rows = []
    print(table_head(("cell", *(f"{p} ms" for p in POLICIES)), "l" + "r" * len(POLICIES)))
    for questions in (1, 32):
        body = {"questions": wire(make_questions(questions))}
        times: dict[str, list[float]] = {policy: [] for policy in POLICIES}
        for i in range(args.requests + 2):  # the first two: warm-up
            state = documents.next()
            turn = list(POLICIES)
            for policy in turn[i % len(turn) :] + turn[: i % len(turn)]:  # who goes first rotates
                ms = ask(policy, {**body, "state": state})
                if i >= 2:
                    times[policy].append(ms)
        medians = {policy: statistics.median(values) for policy, values in times.items()}
        row = {"cell": f"Q = {questions}, new document", "median_ms": medians, "ms": times}
        rows.append(row)
        print(table_row((row["cell"], *(f"{medians[p]:.1f}" for p in POLICIES))))
    memory: dict[str, dict[str, float]] = {policy: {"before_large_mb": ask(policy, ("rss",))} for policy in POLICIES}
    body = {"questions": wire(make_questions(64)), "state": large.next()}
    for policy in POLICIES:
        memory[policy]["large_request_ms"] = ask(policy, body)
        memory[policy]["after_large_mb"] = ask(policy, ("rss",))
        memory[policy]["peak_mb"] = ask(policy, ("peak",))
        memory[policy]["trimmed"] = ask(policy, ("trim",))
        memory[policy]["after_trim_mb"] = ask(policy, ("rss",))
    columns = ("policy", "MB before the large request", "peak", "after it", "after a trim", "its ms")
    print(table_head(columns, "lrrrrr"))
    for policy, row in memory.items():
        cells = (row["before_large_mb"], row["peak_mb"], row["after_large_mb"], row["after_trim_mb"])
        cells += (row["large_request_ms"],)
        print(table_row((policy, *(f"{value:.0f}" for value in cells))))
    for policy in POLICIES:
        pipes[policy].send(None)
    for process in processes:
        process.join(timeout=60)
    report = {
        "benchmark": "heap_policy", "model": name, "date": time.strftime("%Y-%m-%d"), **host_cpu(),
        "prefix_tokens": args.prefix_tokens, "large_tokens": args.large_tokens, "rows": rows, "memory": memory,
    }  # fmt: skip
    print(f"wrote {write_report(report, output_path(args, 'heap_policy'))}")


if __name__ == "__main__":
    main()
