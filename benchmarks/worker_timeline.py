"""Where a throughput cell's time goes: the model worker's timeline, and why the device waited when it did.

    python -m benchmarks.worker_timeline                                                          # CPU
    python -m benchmarks.worker_timeline --device cuda --random-qwen3-0.6b --tokenizer DIR --cells 1:32 32:32

Each cell is throughput's in-process cell (`Q:clients`, optionally `:pipeline` and `:on`/`:off` for
batching; new documents of P ≈ 1266 tokens, the prefix cache off), with its requests' steps timed on the host
clock: per request, its preparation (tokenizing, labels, limits) on a host thread; per forward, the model thread's
launch, the device's span (CUDA events recorded around the launch, put on the host clock by one event recorded
when the device was idle; on a CPU the forward runs inside the launch, so the launch is its span), and the
finishing thread's wait and answers. Per cell it prints:

- the device's busy share, and its idle time between forwards split by what the next forward waited for:
  **requests** (a slot was free, but the batch's first request was still being prepared), a **slot** (the
  requests were ready, but the finishing thread had not yet freed a forward's place), or **launching** (the model
  thread was still writing the next forward's inputs when the device ran dry); **other** is idle time after a
  launch that ended in time (none is expected);
- medians: a request's preparation, a forward's launch (and per document), and the finishing after the device
  (the wait's end and the answers);
- with one client, a request's chain step by step (prepared, queued, launched, on the device, finished, the
  client's next request), where one client's latency goes.

Throughput's "model thread waits" column says which side set the pace over a whole cell; this says, gap
by gap, why the device idled. `--piece-chars 0` tokenizes each new document whole instead of in pieces side by side
(`typedlm.text.pieces`), to compare the two. Ends with one JSON line; the JSON goes to
results/worker_timeline/DATE-DEVICE[-label].json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.harness import (
    Documents,
    add_model_arguments,
    add_output_arguments,
    device_kind,
    host_cpu,
    load_benchmark_model,
    make_questions,
    output_path,
    report_head,
    table_head,
    write_report,
)
from benchmarks.throughput_cells import GpuBusy, attention_decider, run_clients
from typedlm.decide.decider import Decider
from typedlm.hosting.heap import freeze_start_up_objects
from typedlm.hosting.worker import HOST_THREADS, PIPELINE_DEPTH, ModelWorker
from typedlm.text.pieces import PIECE_CHARS
from typedlm.text.prompt import ChatLayout

PREFIX_TOKENS = 1266


@dataclass
class Forward:
    """One forward's times on the host clock (seconds), and the preparations of its requests (start, end)."""

    requests: int
    prepared: list[tuple[float, float]]
    launch: tuple[float, float] = (0.0, 0.0)
    device: tuple[float, float] = (0.0, 0.0)
    finish: tuple[float, float] = (0.0, 0.0)


class DeviceClock:
    """`throughput_cells.GpuBusy`'s events around each launch of a static runner, read back on the host clock: one
    event recorded while the device is idle marks a known host time, and every later event is that time plus its
    elapsed time."""

    def __init__(self, runner):
        torch.cuda.synchronize()
        self.reference = torch.cuda.Event(enable_timing=True)
        self.reference.record()
        torch.cuda.synchronize()
        self.reference_at = time.perf_counter()
        self.monitor = GpuBusy(runner)

    def settle(self, forwards: list[Forward]) -> None:
        """Each forward's device span on the host clock (after the cell: waits for the device). The monitor's
        events and `forwards` are both in launch order, one per launch."""
        torch.cuda.synchronize()
        for forward, events in zip(forwards, self.monitor.events, strict=True):
            forward.device = tuple(self.reference_at + self.reference.elapsed_time(e) / 1000 for e in events)

    def close(self) -> None:
        self.monitor.close()


def timed_cell(
    decider: Decider, documents: Documents, questions: dict, clients: int, per_client: int, pipeline: int,
    batching: bool, warmup: int,
) -> tuple[list[Forward], float]:  # fmt: skip
    """`throughput_cells.in_process`'s cell, every step timed: the forwards of the measured part, and its seconds."""
    runner = getattr(decider.engine.forward, "runner", None)
    clock = DeviceClock(runner) if runner is not None and runner.device.type == "cuda" else None
    forwards: list[Forward] = []
    prepared: dict[int, tuple[float, float]] = {}  # a prepared request's id → its preparation's start and end

    def launch_batch(requests: list) -> object:  # on the model thread
        forward = Forward(len(requests), [prepared.pop(id(request)) for request in requests])
        started = time.perf_counter()
        finish = decider.launch_prepared(requests)
        forward.launch = (started, time.perf_counter())
        forward.device = forward.launch  # replaced by the events' span on a GPU
        forwards.append(forward)

        def timed_finish():  # on the finishing thread
            begun = time.perf_counter()
            responses = finish()
            forward.finish = (begun, time.perf_counter())
            return responses

        return timed_finish

    async def run() -> tuple[float, int]:
        worker = ModelWorker(
            max_pending=10_000, max_batch=decider.max_batch if batching else 1, pipeline_depth=pipeline
        )  # fmt: skip

        async def ask():
            state = documents.next()

            def prepare():
                started = time.perf_counter()
                request = decider.prepare_request(state, questions)
                prepared[id(request)] = (started, time.perf_counter())
                return request

            return await worker.submit_batch(prepare, launch_batch, lambda request: request.tokens, timeout_s=600)

        try:
            await run_clients(clients, warmup, ask)
            first = len(forwards)
            _, seconds = await run_clients(clients, per_client, ask)
        finally:
            worker.close()
        return seconds, first

    try:
        seconds, first = asyncio.run(run())
        if clock is not None:
            clock.settle(forwards)
    finally:
        if clock is not None:
            clock.close()
    return forwards[first:], seconds


def idle_causes(forwards: list[Forward], pipeline: int) -> dict[str, float]:
    """The device's idle time between forwards (seconds), by what the next forward waited for (module doc)."""
    idle = {"requests": 0.0, "slot": 0.0, "launching": 0.0, "other": 0.0}
    for k in range(1, len(forwards)):
        before, forward = forwards[k - 1], forwards[k]
        gap = forward.device[0] - before.device[1]
        if gap <= 0:
            continue
        if forward.launch[0] <= before.device[1]:  # launched in time, or launching when the device ran dry
            idle["other" if forward.launch[1] <= before.device[1] else "launching"] += gap
            continue
        slot_freed = forwards[k - pipeline].finish[1] if k >= pipeline else 0.0
        first_ready = min(end for _, end in forward.prepared)
        idle["slot" if slot_freed > first_ready else "requests"] += gap
    return idle


def one_client_chain(forwards: list[Forward]) -> dict[str, float]:
    """With one client (one request per forward): each step of a request's chain, median ms."""

    def median(values) -> float:
        return round(1000 * statistics.median(values), 3)

    pairs = list(itertools.pairwise(forwards))
    return {
        "prepare": median(f.prepared[0][1] - f.prepared[0][0] for f in forwards),
        "queued": median(f.launch[0] - f.prepared[0][1] for f in forwards),
        "launch": median(f.launch[1] - f.launch[0] for f in forwards),
        "to_device": median(f.device[0] - f.launch[0] for f in forwards),
        "device": median(f.device[1] - f.device[0] for f in forwards),
        "finished_after_device": median(f.finish[1] - f.device[1] for f in forwards),
        "to_next_request": median(b.prepared[0][0] - a.finish[1] for a, b in pairs),
        "request": median(b.prepared[0][0] - a.prepared[0][0] for a, b in pairs),
    }


def summarise(forwards: list[Forward], seconds: float, pipeline: int, clients: int) -> dict:
    span = forwards[-1].device[1] - forwards[0].device[0]
    busy = sum(f.device[1] - f.device[0] for f in forwards)
    documents = sum(f.requests for f in forwards)
    preparations = sorted(end - start for f in forwards for start, end in f.prepared)
    summary = {
        "documents": documents,
        "docs_per_s": documents / seconds,
        "forwards": len(forwards),
        "mean_batch": documents / len(forwards),
        "device_busy": busy / span,
        "idle_ms": {cause: 1000 * s for cause, s in idle_causes(forwards, pipeline).items()},
        "span_ms": 1000 * span,
        "prepare_ms": 1000 * statistics.median(preparations),
        "prepare_p90_ms": 1000 * preparations[int(0.9 * (len(preparations) - 1))],
        "launch_ms": 1000 * statistics.median(f.launch[1] - f.launch[0] for f in forwards),
        "launch_ms_per_doc": 1000 * sum(f.launch[1] - f.launch[0] for f in forwards) / documents,
        "finished_after_device_ms": 1000 * statistics.median(f.finish[1] - f.device[1] for f in forwards),
    }
    if clients == 1 and len(forwards) > 1:
        summary["one_client_chain_ms"] = one_client_chain(forwards)
    return summary


def parse_cell(text: str) -> tuple[int, int, int, bool]:
    """`Q:clients[:pipeline[:on|off]]` → (Q, clients, pipeline, batching)."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 4 or (len(parts) == 4 and parts[3] not in ("on", "off")):
        raise argparse.ArgumentTypeError(f"a cell is Q:clients[:pipeline[:on|off]], not {text!r}")
    try:
        q, clients = int(parts[0]), int(parts[1])
        pipeline = int(parts[2]) if len(parts) > 2 else PIPELINE_DEPTH
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a cell is Q:clients[:pipeline[:on|off]], not {text!r}") from exc
    if min(q, clients, pipeline) < 1:
        raise argparse.ArgumentTypeError(f"Q, clients and pipeline are at least 1 in {text!r}")
    return q, clients, pipeline, parts[3] != "off" if len(parts) == 4 else True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument(
        "--cells", type=parse_cell, nargs="+", default=[parse_cell(c) for c in ("1:1", "1:32", "32:1", "32:32")],
        help="Q:clients[:pipeline[:on|off]] (default: 1:1 1:32 32:1 32:32; pipeline 2, batching on)",
    )  # fmt: skip
    parser.add_argument("--requests", type=int, default=256, help="requests per cell (at least 2 per client)")
    parser.add_argument("--warmup", type=int, default=4, help="requests per client before a cell is measured")
    add_output_arguments(parser, "worker_timeline")
    parser.add_argument("--piece-chars", type=int, default=PIECE_CHARS, help="a new document's pieces (0: whole)")
    args = parser.parse_args()
    host = host_cpu()
    loaded, dtype = load_benchmark_model(args)
    decider = attention_decider(loaded, "auto")
    if args.piece_chars != PIECE_CHARS:  # the same layout but for how a new document is cut
        decider.layout = ChatLayout(loaded.tokenizer, decider.prompt_version, piece_chars=args.piece_chars)
    documents = Documents(decider.layout, PREFIX_TOKENS)
    frozen = freeze_start_up_objects()  # as `serve` does
    print(f"{decider.name} on {args.device} ({dtype}); {host['cpus']} CPUs, load {host['load_1m']:.2f}", flush=True)
    columns = (
        "Q", "clients", "pipeline", "batching", "docs/s", "mean batch", "device busy",
        "idle ms: requests / slot / launching / other", "prepare ms (p90)", "launch ms (per doc)",
        "finished after device ms",
    )  # fmt: skip
    print(table_head(columns, "rrrlrrrlrrr"))
    rows = []
    for q, clients, pipeline, batching in args.cells:
        pipeline = pipeline if batching else 1  # batching off: one forward in flight, the worker before batching
        per_client = max(2, args.requests // clients)
        forwards, seconds = timed_cell(
            decider, documents, make_questions(q), clients, per_client, pipeline, batching, args.warmup
        )  # fmt: skip
        row = {"questions": q, "clients": clients, "pipeline": pipeline, "batching": batching}
        row.update(summarise(forwards, seconds, pipeline, clients))
        rows.append(row)
        idle = " / ".join(f"{row['idle_ms'][cause]:.1f}" for cause in ("requests", "slot", "launching", "other"))
        print(
            f"| {q} | {clients} | {pipeline} | {'on' if batching else 'off'} | {row['docs_per_s']:.1f} | "
            f"{row['mean_batch']:.1f} | {100 * row['device_busy']:.1f}% | {idle} | {row['prepare_ms']:.2f} "
            f"({row['prepare_p90_ms']:.2f}) | {row['launch_ms']:.2f} ({row['launch_ms_per_doc']:.2f}) | "
            f"{row['finished_after_device_ms']:.2f} |",
            flush=True,
        )
    for row in rows:
        if "one_client_chain_ms" in row:
            chain = ", ".join(f"{step} {ms:.2f}" for step, ms in row["one_client_chain_ms"].items())
            print(f"one client, Q = {row['questions']}, pipeline {row['pipeline']}, median ms: {chain}")
    report = {
        **report_head("worker_timeline", decider, args.device, dtype),
        "prefix_tokens": PREFIX_TOKENS,
        "host": host,
        "host_threads": HOST_THREADS,
        "piece_chars": args.piece_chars,
        "gc_frozen_objects": frozen,
        "rows": rows,
    }
    out = write_report(report, output_path(args, "worker_timeline", device_kind(args.device)))
    print(json.dumps({"benchmark": "worker_timeline", "out": str(out), "rows": len(rows)}))


if __name__ == "__main__":
    main()
