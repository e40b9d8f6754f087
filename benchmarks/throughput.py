"""Throughput with many clients, each sending a new document per request: batching on and off, side by side.

Workloads: a long document (P ≈ 1266 tokens) with Q = 1, 4, 32 yes/no questions, and a short one (P ≈ 200, Q = 4).
For each, C = 1, 8, 32, 128 clients send requests back to back (every request a document never seen before; the
prefix cache is off), through one of four paths:

  in_process   the server's own model worker (`serving.worker.ModelWorker`), no HTTP: prepare on the host thread,
               waiting requests answered together by one forward (batching on) or one forward each (off, and
               one forward in flight at a time: the worker before batching); --pipeline gives the forwards in
               flight of the batching rows (2, the server's: the next launched while the last is finished; 1:
               one at a time)
  http         the real server (uvicorn, `create_app`) on a loopback port, in a thread of this process; the
               clients over HTTP (httpx) in --client-processes processes of their own (`http_clients`), so
               that their Python does not share the server's interpreter lock; batching off is the server with
               `--max-batch 1` (its own forwards in flight as ever); the model in the server's process
               (`typedlm serve --no-model-process`)
  model_process
               the model in a process of its own (`ModelProcess`, as `typedlm serve` runs it), the requests handed
               to it as the server does, no HTTP: what the process boundary costs
  http_model_process
               the same as http with the model in a process of its own (`ModelProcess`, as `typedlm serve` runs it):
               the HTTP work and the model's threads on two interpreter locks; no GPU-busy columns (the forwards
               run in the other process)

Per cell: documents/s, questions/s, p50 / p99 latency, mean requests per forward, the share of the matrix-rate
limit reached (2 · non-embedding parameters · tokens per second, against --peak-tflops; on CUDA the H200's dense
bf16 790 TFLOP/s by default) and, on CUDA, the share of the time the GPU spent in forwards (events
around each launch's device work: what is left is the GPU waiting for the host) and the GPU's time per document
(those events' sum over the documents answered: what `request_steps.py` measures for one forward, here under
sustained load). --gather-gap gives the batching rows' wait for more requests while a forward is in flight (the
worker's `gather_gap_s`; 0 turns it off). --switch-interval sets Python's
thread switch interval for a row (the threads preparing, launching and finishing share one interpreter lock).
--warmup sets the requests each client sends before a cell is measured (graphs of the batch shapes they meet are
captured then; "graphs" is how many shapes the engine holds after the cell, "(+n)" the graphs captured while it was
measured: each holds up the forwards behind it). On CUDA with `nvidia-smi`, each cell also carries the GPU's SM
clock while it ran, its warm-up included (the median, and the lowest in parentheses; `sm_mhz`, `sm_mhz_min` and
`power_w` in the JSON, see `gpu_clocks.py`): under load the chip runs at its power cap, and a slow spell shows there
as a lower clock. In process, "CPU ms/doc" is this process's CPU time over the cell (every thread: the clients,
tokenizing, the worker's) per document: where the GPU waits for the host, it says whether the host did more work
or had less room (the JSON's `host` names the CPU and its load before the run). "Model thread waits" (in process,
and through a model process as of its last forward) are the shares of the cell the model thread spent waiting for
a slot (every forward allowed in flight: the device, or the answers, set the pace) and for a request with a slot
free (the clients, or the threads preparing requests, set it): `ModelWorker.stats`. As `typedlm serve`'s
processes do, this one freezes start-up's objects out of the garbage collector's full walks before measuring
(`serving/heap.py`, `gc_pauses.py`; --no-gc-freeze leaves them in).

What a cell's measured rate costs (`cost_per_million`), per million documents and per million questions: on CUDA,
`gpu_s_per_m_docs` and `gpu_s_per_m_questions` are the device-seconds of one GPU serving at the cell's rate
(1e6 / docs_per_s, 1e6 / questions_per_s: the GPU counted whole, busy or not, as a rented one is); on a CPU the
same quotients are named `cpu_wall_s_per_m_docs` and `_questions`, the wall seconds of the whole machine (all its
cores, shared with whatever else ran), not CPU-seconds. In process, `host_cpu_s_per_m_docs` and `_questions` are
"CPU ms/doc" scaled to a million: the host's CPU-seconds, the in-process clients' own work included. The other
paths have none: part of their work (the HTTP clients, or the model process) runs in processes whose CPU time this
one does not count.

Prints a table, writes JSON and a PNG plot, and ends with one JSON line.

    python -m benchmarks.throughput                                   # CPU, the embedded model
    python -m benchmarks.throughput --device cuda --random-qwen3-0.6b --tokenizer DIR
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.gpu_clocks import GpuClocks
from benchmarks.harness import (
    ClientProcesses,
    Documents,
    add_model_arguments,
    add_output_arguments,
    device_kind,
    host_cpu,
    load_benchmark_model,
    make_questions,
    output_path,
    pyplot,
    report_head,
    served_app,
    table_head,
    wire,
    write_report,
)
from typedlm.core.options import EngineOptions
from typedlm.core.questions import parse_request
from typedlm.decide.decider import Decider
from typedlm.serving.heap import freeze_start_up_objects
from typedlm.serving.model_process import ModelProcess
from typedlm.serving.settings import ServerSettings
from typedlm.serving.threads import on_passing_thread
from typedlm.serving.worker import GATHER_GAP_S, HOST_THREADS, PIPELINE_DEPTH, ModelWorker

CLIENT_PROCESSES = 4  # the HTTP rows' client processes (at most one per client)
PATHS = ("in_process", "model_process", "http", "http_model_process")
KERNEL = {"auto": None, "kernel": True, "torch": False}  # --attention → EngineOptions.attention_kernel
WORKLOADS = {"long": (1266, (1, 4, 32)), "short": (200, (4,))}  # name → (prefix tokens, question counts)


class GpuBusy:
    """The share of the time the GPU spends in the forwards of a static runner: a CUDA event recorded before each
    launch's device work and one after it (forwards run one after another on one stream)."""

    def __init__(self, runner):
        self.runner, self.events = runner, []
        self.launch = runner.launch_documents

        def timed(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launched = self.launch(*args, **kwargs)
            end.record()
            self.events.append((start, end))
            return launched

        runner.launch_documents = timed

    def busy_ms(self) -> float:
        """The GPU's time in the forwards, ms."""
        torch.cuda.synchronize()
        return sum(start.elapsed_time(end) for start, end in self.events)

    def share(self) -> float | None:
        """Of the time from the first forward's start to the last one's end, the share spent in forwards."""
        if not self.events:
            return None
        return self.busy_ms() / self.events[0][0].elapsed_time(self.events[-1][1])

    def per_doc(self, forwards: Forwards) -> tuple[float, float] | None:
        """(busy share, GPU ms per document) over the forwards counted, None if none ran."""
        return (self.share(), self.busy_ms() / sum(forwards.batches)) if forwards.batches else None

    def close(self) -> None:
        self.runner.launch_documents = self.launch


class Forwards:
    """A worker's `on_batch`: the requests of each forward and their tokens since the last `clear`, each forward
    passed on to `then` first (the server's metrics) where given."""

    def __init__(self, then: Callable[[int, int], None] | None = None):
        self.then, self.batches, self.tokens = then, [], 0

    def __call__(self, requests: int, tokens: int) -> None:
        if self.then is not None:
            self.then(requests, tokens)
        self.batches.append(requests)
        self.tokens += tokens

    def clear(self) -> None:
        self.batches.clear()
        self.tokens = 0


def non_embedding_params(model: torch.nn.Module) -> int:
    embedding = model.get_input_embeddings().weight.numel()
    return sum(p.numel() for p in model.parameters()) - embedding  # a tied head is the embedding, counted once


def wait_shares(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """The model thread's waits over a cell (`ModelWorker.stats` before and after it) as shares of its time."""
    return {
        "slot_wait_share": (after["waited_for_slot_seconds"] - before["waited_for_slot_seconds"]) / seconds,
        "request_wait_share": (after["waited_for_requests_seconds"] - before["waited_for_requests_seconds"]) / seconds,
    }


def cost_per_million(row: dict, cuda: bool) -> dict[str, float]:
    """A cell's row (its rates, its Q in `questions`) as seconds per million documents and per million questions
    (see the module's docstring): the device's (`gpu_` on CUDA, `cpu_wall_` on a CPU) and, where the cell measured
    its CPU time, the host's."""
    device = "gpu" if cuda else "cpu_wall"
    costs = {
        f"{device}_s_per_m_docs": 1e6 / row["docs_per_s"],
        f"{device}_s_per_m_questions": 1e6 / row["questions_per_s"],
    }
    if row.get("cpu_ms_per_doc") is not None:  # ms per document × 1e6 documents / 1000 ms per s
        costs["host_cpu_s_per_m_docs"] = 1000 * row["cpu_ms_per_doc"]
        costs["host_cpu_s_per_m_questions"] = 1000 * row["cpu_ms_per_doc"] / row["questions"]
    return costs


def summarise(latencies: list[float], seconds: float, questions: int, forwards: Forwards) -> dict:
    latencies = sorted(latencies)
    n = len(latencies)
    return {
        "requests": n,
        "docs_per_s": n / seconds,
        "questions_per_s": n * questions / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(n - 1, int(0.99 * n))],
        "mean_batch": statistics.mean(forwards.batches) if forwards.batches else 1.0,
        "tokens_per_s": forwards.tokens / seconds,
    }


async def run_clients(clients: int, per_client: int, ask) -> tuple[list[float], float]:
    """`clients` coroutines, each awaiting `ask()` `per_client` times back to back: each request's latency, and
    the seconds from the first request to the last answer."""
    latencies: list[float] = []

    async def client() -> None:
        for _ in range(per_client):
            started = time.perf_counter()
            await ask()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, time.perf_counter() - started


def in_process(
    decider: Decider,
    documents: Documents,
    questions: dict,
    clients: int,
    per_client: int,
    batching: bool,
    host_threads: int = HOST_THREADS,
    pipeline_depth: int = PIPELINE_DEPTH,
    warmup: int = 2,
    gather_gap_s: float = GATHER_GAP_S,
):
    runner = getattr(decider.engine.forward, "runner", None)
    cuda = runner is not None and runner.device.type == "cuda"
    forwards = Forwards()

    async def run() -> tuple[list[float], float, tuple[float, float] | None]:
        batch = decider.max_batch if batching else 1
        worker = ModelWorker(
            max_pending=10_000, max_batch=batch, on_batch=forwards, host_threads=host_threads,
            pipeline_depth=pipeline_depth, gather_gap_s=gather_gap_s,
        )  # fmt: skip

        async def ask():
            state = documents.next()
            return await worker.submit_batch(
                lambda: decider.prepare_request(state, questions),
                decider.launch_prepared,
                lambda prepared: prepared.tokens,
                timeout_s=600,
            )

        await run_clients(clients, warmup, ask)  # outside the measurement (graphs of these batch shapes captured)
        forwards.clear()
        monitor = GpuBusy(runner) if cuda else None
        captures = runner.captures if runner is not None else 0
        cpu = time.process_time()  # every thread of this process: the clients, the worker's, tokenizing
        waits = worker.stats()
        try:
            latencies, seconds = await run_clients(clients, per_client, ask)
        finally:
            cpu = time.process_time() - cpu
            waits = wait_shares(waits, worker.stats(), seconds)
            worker.close()
            if monitor is not None:
                monitor.close()
        gpu = monitor.per_doc(forwards) if monitor is not None else None
        return latencies, seconds, gpu, (runner.captures - captures if runner is not None else None), cpu, waits

    latencies, seconds, gpu, captured, cpu, waits = asyncio.run(run())
    graphs = len(runner.slots) if runner is not None else None  # shapes captured and held after the cell
    gpu_busy, gpu_ms_per_doc = gpu or (None, None)
    summary = summarise(latencies, seconds, len(questions), forwards)
    return {
        **summary, "gpu_busy": gpu_busy, "gpu_ms_per_doc": gpu_ms_per_doc, "graphs": graphs, "captured": captured,
        "cpu_ms_per_doc": 1000 * cpu / len(latencies), **waits,
    }  # fmt: skip


def through_model_process(
    model: ModelProcess, documents: Documents, questions: dict, clients: int, per_client: int, warmup: int = 2
) -> dict:
    """The clients' requests handed to a model process as the server hands them (`ModelProcess.answer`), no HTTP:
    what the process boundary costs, against `in_process`."""
    forwards = Forwards()

    async def ask():
        return await model.answer(documents.next(), questions, None, None)

    async def run() -> tuple[list[float], float, dict]:
        await run_clients(clients, warmup, ask)
        forwards.clear()
        waits = model.stats()["model_thread"]  # as of the model process's last forward
        latencies, seconds = await run_clients(clients, per_client, ask)
        return latencies, seconds, wait_shares(waits, model.stats()["model_thread"], seconds)

    model.on_batch = forwards
    latencies, seconds, waits = asyncio.run(run())
    model.on_batch = None
    summary = summarise(latencies, seconds, len(questions), forwards)
    return {**summary, "gpu_busy": None, "gpu_ms_per_doc": None, **waits}


def over_http(
    decider: Decider,
    model,
    documents: Documents,
    wired: dict,
    clients: int,
    per_client: int,
    batching: bool,
    warmup: int = 2,
    processes: int = CLIENT_PROCESSES,
) -> dict:
    """The real server (uvicorn, `create_app`) in a thread of this process, on a loopback port, answering with
    `decider` here or, given one, with `model` (a `ModelProcess` of the same decider); the clients in `processes`
    processes of their own (`benchmarks.http_clients`), so that they do not share the server's interpreter lock.
    Batching off is the server run with `--max-batch 1`."""
    from typedlm.server import create_app

    app = create_app(model or decider, server_settings(decider, batching))
    forwards = Forwards(then=app.state.model.on_batch)  # the server's metrics still see every forward
    app.state.model.on_batch = forwards
    runner = getattr(decider.engine.forward, "runner", None) if model is None else None  # not seen in another process
    monitor = GpuBusy(runner) if runner is not None and runner.device.type == "cuda" else None
    shares = [clients // processes + (i < clients % processes) for i in range(min(processes, clients))]
    with served_app(app) as (url, _):
        jobs = []
        for share in shares:
            documents_of_share = [documents.next() for _ in range(share * (warmup + per_client))]
            jobs.append(
                {"url": url, "questions": wired, "clients": share, "warmup": warmup, "requests": per_client,
                 "documents": documents_of_share}
            )  # fmt: skip
        loads = ClientProcesses(jobs)
        try:
            loads.ready()
            forwards.clear()
            if monitor is not None:
                monitor.events.clear()
            started = loads.go()
            results = loads.results()
            gpu = monitor.per_doc(forwards) if monitor is not None else None
        finally:
            loads.close()
            if monitor is not None:
                monitor.close()
    latencies = [seconds for result in results for seconds in result["latencies"]]
    summary = summarise(latencies, max(result["end"] for result in results) - started, len(wired), forwards)
    gpu_busy, gpu_ms_per_doc = gpu or (None, None)
    return {**summary, "gpu_busy": gpu_busy, "gpu_ms_per_doc": gpu_ms_per_doc, "client_processes": len(shares)}


def server_settings(decider: Decider, batching: bool) -> ServerSettings:
    return ServerSettings(max_queue=10_000, request_timeout_s=600, max_batch=decider.max_batch if batching else 1)


def attention_decider(loaded, attention: str) -> Decider:
    """The decider of an `--attention` row: the raw readout, no prefix cache (every document is new)."""
    engine = EngineOptions(attention_kernel=KERNEL[attention])
    return Decider(loaded, prefix_cache_bytes=0, calibration="raw", engine=engine)


def benchmark_decider(args: argparse.Namespace, attention: str) -> Decider:
    """The same from the model options, loaded anew: what a model process runs."""
    return attention_decider(load_benchmark_model(args)[0], attention)


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for (workload, q, path_name, batching, threads, attention, depth, switch, gap), rows in _series(report).items():
        xs = [row["clients"] for row in rows]
        label = (
            f"{workload} Q={q} {path_name} {attention} {'on' if batching else 'off'} host {threads} pipe {depth}"
            f" switch {1000 * switch:g} ms gather {1000 * gap:g} ms"
        )
        ax.plot(xs, [row["docs_per_s"] for row in rows], marker="o", linestyle="-" if batching else ":", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("documents / s")
    ax.set_title(f"{report['model']} on {report['device']}")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _series(report: dict) -> dict:
    series: dict = {}
    for row in report["rows"]:
        key = (
            row["workload"], row["questions"], row["path"], row["batching"], row.get("host_threads", 1),
            row.get("attention", "auto"), row.get("pipeline_depth", 1), row.get("switch_interval_s", 0.005),
            row.get("gather_gap_s", 0.0),
        )  # fmt: skip
        series.setdefault(key, []).append(row)
    return series


class ModelProcesses:
    """The model_process and http_model_process rows' models: a `ModelProcess` per attention and batching, loaded
    once for every cell and closed when the block ends."""

    def __init__(self, args: argparse.Namespace, decider: Decider):
        self.args, self.decider, self.open = args, decider, {}

    def get(self, attention: str, batching: bool) -> ModelProcess:
        if (attention, batching) not in self.open:
            load = functools.partial(benchmark_decider, self.args, attention)
            self.open[attention, batching] = ModelProcess(load, server_settings(self.decider, batching))
        return self.open[attention, batching]

    def __enter__(self) -> ModelProcesses:
        return self

    def __exit__(self, *exc) -> None:
        for model in self.open.values():
            model.close()


def measure(
    args: argparse.Namespace, deciders: dict[str, Decider], params: int, peak: float | None, models: ModelProcesses
) -> list[dict]:
    """Every cell's row, printed as it is measured."""
    rows = []
    decider = next(iter(deciders.values()))
    default_switch = sys.getswitchinterval()
    cuda = args.device.startswith("cuda")
    device = "gpu" if cuda else "cpu_wall"
    for workload in args.workloads:
        prefix_tokens, counts = WORKLOADS[workload]
        documents = Documents(decider.layout, prefix_tokens)
        for q in counts:
            if args.questions and q not in args.questions:
                continue
            questions = make_questions(q)
            wired = wire(questions)
            assert parse_request({"state": "x", "questions": wired}).questions == questions
            for path in args.paths:
                batchings = (True,) if args.no_unbatched else (True, False)
                threads = args.host_threads if path == "in_process" else [HOST_THREADS]
                depths = args.pipeline if path == "in_process" else [PIPELINE_DEPTH]
                gaps = args.gather_gap if path == "in_process" else [GATHER_GAP_S]
                cells = [
                    (batching, depth, gap, *cell)
                    for batching in batchings
                    for depth in (depths if batching or path != "in_process" else [1])
                    for gap in (gaps if batching else [0.0])
                    for cell in itertools.product(args.switch_interval, threads, args.clients, deciders.items())
                ]
                for batching, depth, gap, switch, host_threads, clients, (attention, each) in cells:
                    sys.setswitchinterval(switch or default_switch)
                    per_client = max(2, args.requests // clients)
                    with GpuClocks(args.device) as clocks:
                        if path == "in_process":
                            row = in_process(
                                each, documents, questions, clients, per_client, batching, host_threads, depth,
                                args.warmup, gap,
                            )  # fmt: skip
                        elif path == "model_process":
                            row = through_model_process(
                                models.get(attention, batching), documents, questions, clients, per_client, args.warmup
                            )
                        else:
                            model = models.get(attention, batching) if path == "http_model_process" else None
                            row = over_http(
                                each, model, documents, wired, clients, per_client, batching, args.warmup,
                                args.client_processes,
                            )  # fmt: skip
                    row.update(clocks.summary())
                    flops = 2 * params * row["tokens_per_s"]
                    row.update(
                        workload=workload, prefix_tokens=prefix_tokens, questions=q, path=path, attention=attention,
                        attention_kernel=each.features.attention_kernel, batching=batching, pipeline_depth=depth,
                        gather_gap_s=gap, switch_interval_s=sys.getswitchinterval(), host_threads=host_threads,
                        clients=clients, matrix_rate=flops / (peak * 1e12) if peak else None,
                    )  # fmt: skip
                    row.update(cost_per_million(row, cuda))
                    rows.append(row)
                    share = f"{100 * row['matrix_rate']:.1f}%" if peak else "-"
                    gpu = f"{100 * row['gpu_busy']:.1f}%" if row.get("gpu_busy") else "-"
                    graphs = row.get("graphs") or "-"
                    if row.get("captured"):  # graphs captured while the cell was measured (their time counts)
                        graphs = f"{graphs} (+{row['captured']})"
                    per_doc = f"{row['gpu_ms_per_doc']:.2f}" if row.get("gpu_ms_per_doc") else "-"
                    mhz = f"{row['sm_mhz']:.0f} (≥ {row['sm_mhz_min']:.0f})" if row.get("sm_mhz") else "-"
                    cpu = f"{row['cpu_ms_per_doc']:.2f}" if row.get("cpu_ms_per_doc") else "-"
                    waited = (
                        f"{100 * row['slot_wait_share']:.0f}% / {100 * row['request_wait_share']:.0f}%"
                        if "slot_wait_share" in row
                        else "-"
                    )
                    costs = " | ".join(
                        f"{row[key]:,.0f}" if key in row else "-"
                        for key in (
                            f"{device}_s_per_m_docs", f"{device}_s_per_m_questions", "host_cpu_s_per_m_docs",
                            "host_cpu_s_per_m_questions",
                        )
                    )  # fmt: skip
                    print(
                        f"| {workload} | {q} | {path} | {attention} | {'on' if batching else 'off'} | {depth} | "
                        f"{1000 * gap:g} | {1000 * sys.getswitchinterval():g} | {host_threads} | "
                        f"{clients} | {row['docs_per_s']:.1f} | {row['questions_per_s']:.0f} | {row['p50_ms']:.1f} | "
                        f"{row['p99_ms']:.1f} | {row['mean_batch']:.1f} | {share} | {gpu} | {per_doc} | {graphs} | "
                        f"{mhz} | {cpu} | {waited} | {costs} |",
                        flush=True,
                    )
    sys.setswitchinterval(default_switch)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=256, help="requests per cell (at least 2 per client)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--questions", type=int, nargs="+", default=None, help="only these Q of each workload")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--no-unbatched", action="store_true", help="skip the batching-off rows")
    parser.add_argument(
        "--host-threads",
        type=int,
        nargs="+",
        default=[HOST_THREADS],
        help=f"in process: threads preparing requests, one row each (default {HOST_THREADS}, the server's)",
    )
    parser.add_argument(
        "--attention",
        nargs="+",
        default=["auto"],
        choices=["auto", "kernel", "torch"],
        help="the cascade's attention, rows for each: the engine's choice, the one Triton kernel, torch's kernels",
    )
    parser.add_argument(
        "--pipeline",
        type=int,
        nargs="+",
        default=[PIPELINE_DEPTH],
        help=f"in process, batching on: forwards in flight, one row each (default {PIPELINE_DEPTH}, the server's)",
    )
    parser.add_argument(
        "--gather-gap",
        type=float,
        nargs="+",
        default=[GATHER_GAP_S],
        help=f"in process, batching on: the worker's gather gap in seconds, one row each (default {GATHER_GAP_S})",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        nargs="+",
        default=[None],
        help="Python's thread switch interval in seconds, one row each (default: the interpreter's, 0.005)",
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="requests per client before a cell is measured (default 2)"
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=CLIENT_PROCESSES,
        help=f"HTTP rows: processes the clients are spread over (default {CLIENT_PROCESSES})",
    )
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="leave start-up's objects in the collector's walks (see above)"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="matrix rate (default: 790 on CUDA)")
    add_output_arguments(parser, "throughput")
    args = parser.parse_args()
    host = host_cpu()  # before loading: the load average is the machine's, not this run's

    def load() -> tuple:
        """The model and its deciders, loaded as the server loads them: on a thread that ends, so that on a CPU only
        the model thread keeps OpenMP workers (`serving.threads`)."""
        loaded, dtype = load_benchmark_model(args)
        return loaded, dtype, {attention: attention_decider(loaded, attention) for attention in args.attention}

    loaded, dtype, deciders = on_passing_thread(load)
    decider = next(iter(deciders.values()))
    params = non_embedding_params(loaded.model)
    peak = args.peak_tflops or (790.0 if args.device.startswith("cuda") else None)
    print(f"{decider.name} on {args.device} ({dtype}); {params / 1e6:.1f} M non-embedding parameters", flush=True)
    for attention, each in deciders.items():
        print(f"attention {attention}: {each.features.summary()}")
    columns = (
        "workload", "Q", "path", "attention", "batching", "pipeline", "gather ms", "switch ms", "host threads",
        "clients", "docs/s", "questions/s", "p50 ms", "p99 ms", "mean batch", "of matrix rate", "GPU busy",
        "GPU ms/doc", "graphs", "SM MHz", "CPU ms/doc", "model thread waits: slot / requests",
        *(f"{'GPU' if args.device.startswith('cuda') else 'CPU wall'} s/M {unit}" for unit in ("docs", "q")),
        "host CPU s/M docs", "host CPU s/M q",
    )  # fmt: skip
    print(table_head(columns, "lrlllrrrrrrrrrrrrrrrrrrrrr"))
    with ModelProcesses(args, decider) as model_processes:
        frozen = 0 if args.no_gc_freeze else freeze_start_up_objects()
        rows = measure(args, deciders, params, peak, model_processes)
    report = {
        **report_head("throughput", decider, args.device, dtype),
        "non_embedding_params": params,
        "peak_tflops": peak,
        "features": {attention: each.features.summary() for attention, each in deciders.items()},
        "host": host,
        "gc_frozen_objects": frozen,
        "rows": rows,
    }
    out = write_report(report, output_path(args, "throughput", device_kind(args.device)))
    plot(report, out.with_suffix(".png"))
    print(json.dumps({"benchmark": "throughput", "out": str(out), "rows": len(rows)}))


if __name__ == "__main__":
    main()
