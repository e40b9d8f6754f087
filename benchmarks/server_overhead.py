"""The server's own CPU per request, thread by thread: what HTTP costs around the model.

    python -m benchmarks.server_overhead                  # a tiny random Qwen3 (the embedded tokenizer), CPU
    python -m benchmarks.server_overhead --model ID_OR_PATH [--device cuda]

The real server (`create_app`, run as `typedlm serve` runs it: uvicorn, the head-deadline protocol, no access
log) in a thread of this process; --clients clients in another process (`benchmarks.http_clients`) send --requests
requests of a new document (P ≈ --prefix-tokens) and --questions yes/no questions each. Every thread of this
process is timed by the kernel's CPU accounting (psutil) over the measured requests: the event loop's thread
(HTTP parsing, the routes, JSON in and out, the metrics) is the one HTTP adds; the others are the model worker's
(preparing, the forward, the answers). In one interpreter they all share one lock, so the event loop's CPU per
request is taken from what the model thread can use at high request rates. Prints a line per round (--rounds)
and ends with one JSON line. The tiny model keeps the forward short, so the rounds are quick; the event loop's
share does not depend on the model.
"""

from __future__ import annotations

import argparse
import json
import statistics

import psutil

from benchmarks.harness import ClientProcesses, make_questions, served_app, tiny_qwen3, wire
from typedlm.core.names import CalibrationMethod
from typedlm.core.settings import ServerSettings
from typedlm.decide.decider import Decider
from typedlm.runtime.models import load_model
from typedlm.server import create_app


def cpu_by_thread() -> dict[int, float]:
    return {thread.id: thread.user_time + thread.system_time for thread in psutil.Process().threads()}


def one_round(decider: Decider, args: argparse.Namespace, round_: int) -> dict:
    questions = wire(make_questions(args.questions))
    line = "Message {i}: the customer writes about a refund for order {i}, charged twice last week. "
    base = "".join(line.format(i=i) for i in range(args.prefix_tokens // 20))
    per_client = max(1, args.requests // args.clients)
    warmup = 2
    app = create_app(decider, ServerSettings(max_queue=10_000, request_timeout_s=600))
    with served_app(app) as (url, thread):
        job = {
            "url": url, "questions": questions, "clients": args.clients, "warmup": warmup, "requests": per_client,
            "documents": [f"Ticket {round_}-{i}.\n{base}" for i in range(args.clients * (warmup + per_client))],
        }  # fmt: skip
        load = ClientProcesses([job])
        try:
            load.ready()
            before = cpu_by_thread()
            started = load.go()
            (result,) = load.results()
            after = cpu_by_thread()
        finally:
            load.close()
    n = len(result["latencies"])
    per_thread = {tid: 1000 * (after[tid] - before.get(tid, 0.0)) / n for tid in after}
    loop_ms = per_thread.pop(thread.native_id, 0.0)
    others = sorted((ms for ms in per_thread.values() if ms >= 0.01), reverse=True)
    return {
        "requests": n,
        "requests_per_s": n / (result["end"] - started),
        "event_loop_cpu_ms": loop_ms,
        "process_cpu_ms": loop_ms + sum(per_thread.values()),
        "other_threads_cpu_ms": others,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: a tiny random Qwen3 over the embedded tokenizer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=200, help="measured requests per round")
    parser.add_argument("--questions", type=int, default=1)
    parser.add_argument("--prefix-tokens", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    loaded = load_model(args.model, args.device) if args.model else tiny_qwen3()
    decider = Decider(loaded, prefix_cache_bytes=0, calibration=CalibrationMethod.RAW)
    rounds = []
    for round_ in range(args.rounds):
        row = one_round(decider, args, round_)
        rounds.append(row)
        others = ", ".join(f"{ms:.2f}" for ms in row["other_threads_cpu_ms"][:4])
        print(
            f"round {round_ + 1}: {row['requests_per_s']:.0f} requests/s; CPU per request: event loop "
            f"{row['event_loop_cpu_ms']:.2f} ms, the whole process {row['process_cpu_ms']:.2f} ms (busiest other "
            f"threads {others})",
            flush=True,
        )
    summary = {
        "benchmark": "server_overhead",
        "model": decider.name,
        "device": args.device,
        "clients": args.clients,
        "questions": args.questions,
        "prefix_tokens": args.prefix_tokens,
        "event_loop_cpu_ms_median": statistics.median(row["event_loop_cpu_ms"] for row in rounds),
        "rounds": rounds,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
