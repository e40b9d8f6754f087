"""Where one request's time goes: the steps of `Decider.decide`, timed one by one.

    python benchmarks/request_steps.py --device cuda --random-qwen3-0.6b --tokenizer DIR [--questions 1 32]
    python benchmarks/request_steps.py                       # CPU, the embedded model

A request is host work (tokenizing, the prefix-cache lookup, packing, writing the static inputs, reading the
masses, calibrating, building the answers) around one forward (on CUDA: one graph replay). Each step's
function is wrapped to note the time as it starts and ends; the table gives, per pair of consecutive notes,
the median over --repeats requests (three documents of P ≈ 1266 tokens taking turns, after a warm-up), and
on CUDA the graph's own GPU time (events) and the time its launch takes on the host. Ends with one JSON line.
The wrapping adds about a microsecond per step; the request's total is timed with it.

With --no-forward (any device) the request runs the static path (as on CUDA) with each shape's forward
replaced by the output it gave the first time: what is left is the host work alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from latency import make_questions, make_state, random_qwen3_06b

from typedlm.core.options import EngineOptions
from typedlm.decide.decider import Decider
from typedlm.runtime import forwards, graphs
from typedlm.runtime.models import load_model

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


def without_forward(runner) -> None:
    """Replace the runner's forward by the output each shape gave first (the host work stays as it is)."""
    forward, outputs = runner.forward, {}

    def remembered(slot):
        if slot.shape not in outputs:
            outputs[slot.shape] = forward(slot)
        return outputs[slot.shape]

    runner.capture = False  # the static path, eagerly: no graph replays a forward that no longer runs
    runner.forward = remembered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--random-qwen3-0.6b", dest="random_qwen3_06b", action="store_true")
    parser.add_argument("--tokenizer", default=None, help="tokenizer dir for --random-qwen3-0.6b")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--no-forward", action="store_true", help="time the host work alone (see above)")
    args = parser.parse_args()
    if args.random_qwen3_06b:
        loaded = random_qwen3_06b(Path(args.tokenizer), args.device, args.dtype or "bfloat16")
    else:
        loaded = load_model(args.model, args.device, args.dtype)
    # as latency.py's typedlm: the document prefilled each time
    decider = Decider(loaded, prefix_cache_bytes=0, engine=EngineOptions(cuda_graphs=True if args.no_forward else None))
    cuda = args.device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(args.device)) if cuda else (lambda: None)
    timed_steps(decider.layout, "tokenize", "tokenize")
    timed_steps(decider.prefix_cache, "lookup", "lookup")
    timed_steps(forwards, "pack", "pack")
    timed_steps(graphs.Slot, "fill", "fill")
    timed_steps(torch.cuda.CUDAGraph, "replay", "replay")
    timed_steps(forwards, "group_masses", "masses")
    timed_steps(Decider, "_content_free", "priors")
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
    for q in args.questions:
        questions = make_questions(q)
        states = [make_state(decider, args.prefix_tokens, v) for v in range(3)]
        for state in states:
            decider.decide(state, questions)
        if args.no_forward:
            without_forward(decider.engine.forward.runner)
        sync()
        row: dict = {"questions": q}
        runner = getattr(decider.engine.forward, "runner", None)  # the static forward's
        if cuda and runner is not None and runner.slots:
            row.update(graph_times(next(reversed(runner.slots.values())), args.device, args.repeats))
        steps: dict[str, list[float]] = {}
        totals = []
        for i in range(args.repeats):
            sync()
            NOTES.clear()
            note("start")
            decider.decide(states[i % 3], questions)
            sync()
            note("end")
            totals.append((NOTES[-1][1] - NOTES[0][1]) * 1e3)
            for (a, ta), (b, tb) in itertools.pairwise(NOTES):
                steps.setdefault(f"{a} {b}", []).append((tb - ta) * 1e3)
        row["request_ms"] = round(statistics.median(totals), 3)
        row["steps_ms"] = {k: round(statistics.median(v), 3) for k, v in steps.items() if len(v) == args.repeats}
        report["rows"].append(row)
        graph = (
            f", graph: GPU {row['graph_gpu_ms']} ms, launch {row['graph_launch_ms']} ms"
            if "graph_gpu_ms" in row
            else ""
        )
        print(f"Q = {q}: request {row['request_ms']} ms{graph}")
        for step, ms in row["steps_ms"].items():
            print(f"  {step:26s} {ms:8.3f} ms")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
