"""Throughput's cells (`benchmarks.throughput`, whose docstring says what each path is): one cell measured on each
path, the deciders and model processes the rows ask, and what a cell's row holds. Not a benchmark of its own.

Contract:
- `in_process`, `through_model_process` and `over_http` each run `clients` clients sending `per_client` requests
  back to back, every request a new document, after `warmup` requests each that are not measured, and return the
  cell's row: rates, p50 / p99 latency, mean requests per forward, tokens per second and, where the path can see
  them, the GPU's busy share and time per document, the graphs held and captured, the host's CPU time per
  document and the model thread's waits.
- `cost_per_million(row, cuda)`: what a cell's measured rate costs per million documents and questions.
- `attention_decider` and `ModelProcesses`: the decider of an `--attention` row, and the model processes of a run,
  each loaded once.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.harness import ClientProcesses, Documents, load_benchmark_model, served_app
from typedlm.core.names import CalibrationMethod
from typedlm.core.options import EngineOptions
from typedlm.core.settings import ServerSettings
from typedlm.decide.decider import Decider
from typedlm.hosting.model_process import ModelProcess
from typedlm.hosting.worker import GATHER_GAP_S, HOST_THREADS, PIPELINE_DEPTH, ModelWorker

CLIENT_PROCESSES = 4  # the HTTP rows' client processes (at most one per client)
KERNEL = {"auto": None, "kernel": True, "torch": False}  # --attention → EngineOptions.attention_kernel


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


def wait_shares(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """The model thread's waits over a cell (`ModelWorker.stats` before and after it) as shares of its time."""
    return {
        "slot_wait_share": (after["waited_for_slot_seconds"] - before["waited_for_slot_seconds"]) / seconds,
        "request_wait_share": (after["waited_for_requests_seconds"] - before["waited_for_requests_seconds"]) / seconds,
    }


def cost_per_million(row: dict, cuda: bool) -> dict[str, float]:
    """A cell's row (its rates, its Q in `questions`) as seconds per million documents and per million questions
    (see `throughput`'s docstring): the device's (`gpu_` on CUDA, `cpu_wall_` on a CPU) and, where the cell measured
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
    return Decider(loaded, prefix_cache_bytes=0, calibration=CalibrationMethod.RAW, engine=engine)


def benchmark_decider(args: argparse.Namespace, attention: str) -> Decider:
    """The same from the model options, loaded anew: what a model process runs."""
    return attention_decider(load_benchmark_model(args)[0], attention)


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
