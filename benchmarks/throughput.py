"""Throughput with many clients, each sending a new document per request: batching on and off, side by side.

Workloads: a long document (P ≈ 1266 tokens) with Q = 1, 4, 32 yes/no questions, and a short one (P ≈ 200, Q = 4);
on request, `score300`: P ≈ 300, Q = 10 (the shape of SGLang's scoring benchmark, for the comparison in
docs/performance.md).
For each, C = 1, 8, 32, 128 clients send requests back to back (every request a document never seen before; the
prefix cache is off), through one of four paths:

  in_process   the server's own model worker (`hosting.worker.ModelWorker`), no HTTP: prepare on the host thread,
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
(`hosting/heap.py`, `gc_pauses.py`; --no-gc-freeze leaves them in).

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
import itertools
import json
import sys
from pathlib import Path

import torch

from benchmarks.gpu_clocks import GpuClocks
from benchmarks.harness import (
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
    table_head,
    wire,
    write_report,
)
from benchmarks.throughput_cells import (
    CLIENT_PROCESSES,
    ModelProcesses,
    attention_decider,
    cost_per_million,
    in_process,
    over_http,
    through_model_process,
)
from typedlm.core.questions import parse_request
from typedlm.decide.decider import Decider
from typedlm.hosting.heap import freeze_start_up_objects
from typedlm.hosting.threads import on_passing_thread
from typedlm.hosting.worker import GATHER_GAP_S, HOST_THREADS, PIPELINE_DEPTH

PATHS = ("in_process", "model_process", "http", "http_model_process")
# name → (prefix tokens, question counts); `score300`: SGLang's scoring benchmark's shape (300-token prompts, 10 items
# scored per request), run on request (--workloads score300), not by default
WORKLOADS = {"long": (1266, (1, 4, 32)), "short": (200, (4,)), "score300": (300, (10,))}
DEFAULT_WORKLOADS = ("long", "short")


def non_embedding_params(model: torch.nn.Module) -> int:
    embedding = model.get_input_embeddings().weight.numel()
    return sum(p.numel() for p in model.parameters()) - embedding  # a tied head is the embedding, counted once


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
    parser.add_argument("--workloads", nargs="+", default=list(DEFAULT_WORKLOADS), choices=list(WORKLOADS))
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
        the model thread keeps OpenMP workers (`hosting.threads`)."""
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
