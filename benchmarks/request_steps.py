"""Where one request's time goes: the steps of `Decider.decide`, timed one by one.

    python -m benchmarks.request_steps --device cuda --random-qwen3-0.6b --tokenizer DIR [--questions 1 32]
    python -m benchmarks.request_steps                       # CPU, the embedded model

A request is host work (tokenizing, the prefix-cache lookup, packing, writing the static inputs, reading the
masses, calibrating, building the answers) around one forward (on CUDA: one graph replay). Each step's
function is wrapped to note the time as it starts and ends; the table gives, per pair of consecutive notes,
the median over --repeats requests (three documents of P ≈ 1266 tokens taking turns, after a warm-up), and
on CUDA the graph's own GPU time (events) and the time its launch takes on the host. Ends with one JSON line.
The wrapping adds about a microsecond per step; the request's total is timed with it.

With --documents N, each forward answers N new documents together (as the server's model worker batches
them): N requests are prepared (timed as one step), then answered by `Decider.launch_prepared`; a step that
runs once per document is summed over them. The row is one forward's; divide by N for a document's share.

With --profile (CUDA) each row also lists where one replay's GPU time goes, from `torch.profiler` over
--repeats replays: per kind of kernel (the attention kernel, the matrix products, the fused Triton kernels, the
rest) and the kernels that take the most, in µs per forward; "idle" is the replay's GPU time (events) that no
kernel fills (the gaps between them).

With --no-forward (any device) the request runs the static path (as on CUDA) with each forward replaced by
a constant output of its size (every label step at log 1/2): what is left is the host work alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time

import torch

from benchmarks.harness import add_model_arguments, load_benchmark_model, make_questions, make_state
from typedlm.core.options import EngineOptions
from typedlm.decide.decider import Decider
from typedlm.runtime import forwards, static_inputs

NOTES: list[tuple[str, float]] = []


def note(name: str) -> None:
    NOTES.append((name, time.perf_counter()))


def timed_steps(owner, attribute: str, name: str, static: bool = False) -> None:
    """Replace owner.attribute by a wrapper that notes `name<` before it runs and `name>` after."""
    function = getattr(owner, attribute)

    def wrapper(*args, **kwargs):
        note(f"{name}<")
        result = function(*args, **kwargs)
        note(f"{name}>")
        return result

    setattr(owner, attribute, staticmethod(wrapper) if static else wrapper)


def graph_times(slot, device: str, repeats: int) -> dict[str, float]:
    """The graph alone: its GPU time (events), the launch's host time, and launch + wait."""
    gpu, launch, whole = [], [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        start.record()
        slot.graph.replay()
        t1 = time.perf_counter()
        end.record()
        torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        gpu.append(start.elapsed_time(end))
        launch.append((t1 - t0) * 1e3)
        whole.append((t2 - t0) * 1e3)
    return {
        "graph_gpu_ms": round(statistics.median(gpu), 3),
        "graph_launch_ms": round(statistics.median(launch), 3),
        "graph_replay_ms": round(statistics.median(whole), 3),
    }


def kernel_kind(name: str) -> str:
    """A kernel's kind, by its name: what the profile table sums."""
    if "cascade_kernel" in name:
        return "attention (cascade kernel)"
    if any(mark in name.lower() for mark in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "wgmma")):
        return "matrix products"
    if name.startswith("_") and name.endswith("_kernel"):
        return "fused (Triton)"
    return "other (copies, elementwise)"


def kernel_profile(slot, repeats: int, gpu_ms: float) -> dict:
    """Where one replay's GPU time goes: µs per forward by kind and by kernel (the 12 largest), from the
    profiler over `repeats` replays; `idle`: the GPU time (events) no kernel fills."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            slot.graph.replay()
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
        if us and event.key and not event.key.startswith(("ProfilerStep", "cudaGraph")):
            kernels[event.key] = kernels.get(event.key, 0.0) + us / repeats
    kinds: dict[str, float] = {}
    for name, us in kernels.items():
        kind = kernel_kind(name)
        kinds[kind] = kinds.get(kind, 0.0) + us
    kinds["idle"] = max(gpu_ms * 1e3 - sum(kernels.values()), 0.0)
    largest = sorted(kernels.items(), key=lambda item: -item[1])[:12]
    return {
        "kinds_us": {kind: round(us, 1) for kind, us in sorted(kinds.items(), key=lambda item: -item[1])},
        "kernels_us": {name[:90]: round(us, 1) for name, us in largest},
    }


def without_forward(runner) -> None:
    """Replace the runner's forward by a constant output of the size it gives (the host work stays as it is)."""

    def constant(slot):
        return torch.full(slot.field("step_read").shape, -math.log(2.0))

    runner.capture = False  # the static path, eagerly: no graph replays a forward that no longer runs
    runner.forward = constant


def measure(decider: Decider, args, q: int, n: int, sync) -> dict:
    """One row: Q = `q` questions on each of `n` new documents per forward, `args.repeats` forwards."""
    questions = make_questions(q)
    # no two alike in a forward
    states = [make_state(decider.layout, args.prefix_tokens, v) for v in range(max(3, 2 * n))]

    def documents(i: int) -> list[str]:
        return [states[(i * n + j) % len(states)] for j in range(n)]

    def answer(i: int) -> None:
        note("prepare<")
        requests = [decider.prepare_request(state, questions) for state in documents(i)]
        note("prepare>")
        decider.launch_prepared(requests)()

    runner = getattr(decider.engine.forward, "runner", None)  # the static forward's
    if args.no_forward:
        without_forward(runner)
    for i in range(3):
        answer(i)
    sync()
    row: dict = {"questions": q, "documents": n}
    if args.device.startswith("cuda") and runner is not None and runner.slots:
        slot = next(reversed(runner.slots.values()))
        row.update(graph_times(slot, args.device, args.repeats))
        if args.profile:
            row["profile"] = kernel_profile(slot, args.repeats, row["graph_gpu_ms"])
    steps: dict[str, list[float]] = {}
    totals = []
    for i in range(args.repeats):
        sync()
        NOTES.clear()
        note("start")
        answer(i)
        sync()
        note("end")
        totals.append((NOTES[-1][1] - NOTES[0][1]) * 1e3)
        summed: dict[str, float] = {}  # a step met once per document counts once, its times summed
        for (a, ta), (b, tb) in itertools.pairwise(NOTES):
            summed[f"{a} {b}"] = summed.get(f"{a} {b}", 0.0) + (tb - ta) * 1e3
        for step, ms in summed.items():
            steps.setdefault(step, []).append(ms)
    row["forward_ms"] = round(statistics.median(totals), 3)
    row["per_document_ms"] = round(row["forward_ms"] / n, 3)
    row["steps_ms"] = {k: round(statistics.median(v), 3) for k, v in steps.items() if len(v) == args.repeats}
    graph = (
        f", graph: GPU {row['graph_gpu_ms']} ms, launch {row['graph_launch_ms']} ms" if "graph_gpu_ms" in row else ""
    )
    per_document = f"{row['per_document_ms']} per document"
    print(f"Q = {q}, {n} document(s) per forward: {row['forward_ms']} ms ({per_document}){graph}")
    for step, ms in row["steps_ms"].items():
        print(f"  {step:26s} {ms:8.3f} ms")
    for table in ("kinds_us", "kernels_us"):
        for name, us in row.get("profile", {}).get(table, {}).items():
            print(f"  {name[:60]:60s} {us:10.1f} µs")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--no-forward", action="store_true", help="time the host work alone (see above)")
    parser.add_argument("--documents", type=int, nargs="+", default=[1], help="new documents per forward")
    parser.add_argument("--profile", action="store_true", help="CUDA: the GPU time by kernel (see above)")
    args = parser.parse_args()
    if args.random_qwen3_06b and args.dtype is None:  # this benchmark's random weights: bfloat16 on any device
        args.dtype = "bfloat16"
    loaded, _ = load_benchmark_model(args)
    # as latency's typedlm: the document prefilled each time
    decider = Decider(loaded, prefix_cache_bytes=0, engine=EngineOptions(cuda_graphs=True if args.no_forward else None))
    cuda = args.device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(args.device)) if cuda else (lambda: None)
    timed_steps(decider.layout, "tokenize", "tokenize")
    timed_steps(decider.prefix_cache, "lookup", "lookup")
    timed_steps(forwards, "pack", "pack")
    timed_steps(static_inputs.Slot, "fill", "fill")
    timed_steps(torch.cuda.CUDAGraph, "replay", "replay")
    timed_steps(forwards, "group_masses", "masses")
    timed_steps(decider.calibrators.contextual, "priors", "priors")  # the content-free priors, where read
    report = {
        "benchmark": "request_steps",
        "device": torch.cuda.get_device_name(args.device) if cuda else "cpu",
        "model": loaded.name,
        "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "kernels": str(decider.features.fusion or "the model's own"),
        "calibration": decider.calibration,
        "repeats": args.repeats,
        "rows": [],
    }
    print(f"{report['model']} on {report['device']}, {report['dtype']}; kernels: {report['kernels']}")
    for q, n in itertools.product(args.questions, args.documents):
        report["rows"].append(measure(decider, args, q, n, sync))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
