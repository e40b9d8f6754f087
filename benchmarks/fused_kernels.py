"""The model's own small kernels against the fused ones (kernels.py), side by side in one process, on CUDA.

    python benchmarks/fused_kernels.py --random-qwen3-0.6b --tokenizer DIR

A decider with the model's own kernels captures its CUDA graphs first; then a second decider swaps in the
fused kernels and captures its own. Captured graphs keep the kernels they recorded, so both replay side by
side on the same documents and questions (P ≈ 1266 tokens, Q noul questions). Reports, per Q, the median
graph replay alone and the median whole request (`decide`, host work included), in alternating rounds, and
how far the two deciders' answers differ. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from latency import make_questions, make_state, random_qwen3_06b

from typedlm.decider import Decider
from typedlm.kernels import unfuse_rope
from typedlm.models import load_model


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--random-qwen3-0.6b", dest="random_qwen3_06b", action="store_true")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if args.random_qwen3_06b:
        loaded = random_qwen3_06b(Path(args.tokenizer), "cuda", args.dtype)
    else:
        loaded = load_model(args.model, "cuda", args.dtype)
    unfuse_rope(loaded.model)
    own = Decider(loaded, prefix_cache_bytes=0, calibration="raw", fused_kernels=False)
    work = {}
    for q in args.questions:  # the model's own kernels, captured before anything is swapped
        questions = make_questions(q)
        states = [make_state(own, args.prefix_tokens, v) for v in range(3)]
        for state in states:
            own.decide(state, questions)
        work[q] = (questions, states, next(reversed(own.engine.runner.slots.values())))
    fused = Decider(loaded, prefix_cache_bytes=0, calibration="raw")
    assert fused.engine.fusion is not None, "liger-kernel is not installed: pip install 'typedlm[cuda]'"
    print(f"{fused.engine.fusion}")
    rows = []
    for q, (questions, states, own_slot) in work.items():
        for state in states:
            fused.decide(state, questions)
        fused_slot = next(reversed(fused.engine.runner.slots.values()))
        a, b = own.decide(states[0], questions).answers, fused.decide(states[0], questions).answers
        diff = max(abs(a[k].p_yes - b[k].p_yes) for k in a)
        turn = iter(range(1 << 30))
        times: dict[str, list[float]] = {"own_replay": [], "fused_replay": [], "own_decide": [], "fused_decide": []}
        for _ in range(args.rounds):
            times["own_replay"].append(median_ms(own_slot.graph.replay, args.repeats))
            times["fused_replay"].append(median_ms(fused_slot.graph.replay, args.repeats))
            for name, decider in (("own_decide", own), ("fused_decide", fused)):
                ms = median_ms(
                    lambda d=decider, s=states, qs=questions, t=turn: d.decide(s[next(t) % 3], qs), args.repeats
                )
                times[name].append(ms)
        row = {"questions": q, **{k: round(statistics.median(v), 2) for k, v in times.items()}}
        row["max_p_yes_difference"] = round(diff, 4)
        rows.append(row)
        print(
            f"Q={q:>3}  replay own {row['own_replay']:6.2f} ms  fused {row['fused_replay']:6.2f} ms   "
            f"decide own {row['own_decide']:6.2f} ms  fused {row['fused_decide']:6.2f} ms   max |Δp| {diff:.4f}"
        )
    report = {
        "benchmark": "fused_kernels",
        "device": torch.cuda.get_device_name(),
        "model": fused.name,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "fused_kernels": str(fused.engine.fusion),
        "rounds": args.rounds,
        "repeats": args.repeats,
        "rows": rows,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
