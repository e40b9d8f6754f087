"""The model's own kernels against the fused ones, side by side in one process, on CUDA.

    python -m benchmarks.fused_kernels --random-qwen3-0.6b --tokenizer DIR

Three deciders, each capturing its CUDA graphs in turn:

- `own`: the model's own small operations, torch's attention kernels (cascade split and merged);
- `fused`: norms, rotary and SwiGLU as Triton kernels (liger-kernel's rotary and SwiGLU, typedlm's RMSNorm),
  gate and up projections as one product (kernels.py), torch's attention kernels;
- `attention`: the same, and the attention as one Triton launch per layer (cascade_kernel.py).

`own` runs on its own copy of the model (the same seeded weights): fusing moves the other copy's gate/up
weights into one tensor, which graphs captured before would not see. Captured graphs keep the kernels they
recorded, so all three replay side by side on the same documents and questions (P ≈ 1266 tokens, Q noul
questions). Reports, per Q, the median graph replay alone and the median whole request (`decide`, host work
included), in alternating rounds, and how far each decider's answers are from `own`'s; then liger-kernel's
RMSNorm against typedlm's on the model's norm shapes, each graphed. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.harness import add_model_arguments, load_benchmark_model, make_questions, make_state
from typedlm.core.names import CalibrationMethod
from typedlm.core.options import EngineOptions
from typedlm.decide.decider import Decider
from typedlm.runtime.patching import unfuse_rope

VARIANTS = {  # captured in this order: `own` before anything is swapped
    "own": EngineOptions(fused_kernels=False),
    "fused": EngineOptions(attention_kernel=False),
    "attention": EngineOptions(attention_kernel=True),
}


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def graphed_us(fn, repeats: int, calls: int = 20) -> float:
    """Median µs of one call of `fn`, `calls` calls captured in one CUDA graph and replayed `repeats` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return 1e3 * median_ms(graph.replay, repeats) / calls


def norm_rows(model: torch.nn.Module, questions: list[int], prefix_tokens: int, repeats: int) -> list[dict]:
    """liger-kernel's RMSNorm against typedlm's (triton_ops.rms_norm) on this model's norm shapes, side by side."""
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    from typedlm.ops.triton_ops import rms_norm

    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shapes = {"hidden": (config.hidden_size,), "q heads": (config.num_attention_heads, head_dim)}
    shapes["k heads"] = (config.num_key_value_heads, head_dim)
    dtype = next(model.parameters()).dtype
    rows = []
    for q in questions:
        tokens = prefix_tokens + 31 * q
        for name, shape in shapes.items():
            x = torch.randn(1, tokens, *shape, device="cuda", dtype=dtype)
            weight = torch.randn(shape[-1], device="cuda", dtype=dtype)
            liger = graphed_us(
                lambda x=x, w=weight: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False), repeats
            )
            own = graphed_us(lambda x=x, w=weight: rms_norm(x, w, 1e-6), repeats)
            row = {"questions": q, "norm": name, "tokens": tokens, "liger_us": round(liger, 2)}
            rows.append({**row, "typedlm_us": round(own, 2)})
            size = " × ".join(map(str, shape))
            print(f"RMSNorm Q={q:>3} {name:<8} [{tokens} × {size}]  liger {liger:6.2f} µs  typedlm {own:6.2f} µs")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, device=None, dtype="bfloat16")  # on CUDA
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    own_copy, loaded = (load_benchmark_model(args, "cuda")[0] for _ in range(2))  # the same seeded weights
    unfuse_rope(loaded.model)
    deciders, slots, work = {}, {}, {}
    for name, options in VARIANTS.items():
        model = own_copy if name == "own" else loaded
        decider = deciders[name] = Decider(
            model, prefix_cache_bytes=0, calibration=CalibrationMethod.RAW, engine=options
        )
        print(f"{name}: {decider.features.fusion or 'the model own kernels'}")
        for q in args.questions:
            questions = work.setdefault(q, make_questions(q))
            states = [make_state(decider.layout, args.prefix_tokens, v) for v in range(3)]
            for state in states:
                decider.decide(state, questions)
            slots[name, q] = next(reversed(decider.engine.forward.runner.slots.values()))
    assert deciders["fused"].features.fusion is not None, "liger-kernel is not installed: pip install 'typedlm[cuda]'"
    rows = []
    for q, questions in work.items():
        states = [make_state(deciders["own"].layout, args.prefix_tokens, v) for v in range(3)]
        reference = deciders["own"].decide(states[0], questions).answers
        row: dict = {"questions": q}
        turn = iter(range(1 << 30))
        times: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, decider in deciders.items():
                times.setdefault(f"{name}_replay", []).append(median_ms(slots[name, q].graph.replay, args.repeats))
                ms = median_ms(
                    lambda d=decider, s=states, qs=questions, t=turn: d.decide(s[next(t) % 3], qs), args.repeats
                )
                times.setdefault(f"{name}_decide", []).append(ms)
        row.update({k: round(statistics.median(v), 2) for k, v in times.items()})
        for name, decider in deciders.items():
            answers = decider.decide(states[0], questions).answers
            row[f"{name}_max_p_yes_difference"] = round(
                max(abs(answers[k].p_yes - reference[k].p_yes) for k in answers), 4
            )
        rows.append(row)
        print(
            f"Q={q:>3}  replay "
            + "  ".join(f"{name} {row[f'{name}_replay']:6.2f}" for name in deciders)
            + " ms   decide "
            + "  ".join(f"{name} {row[f'{name}_decide']:6.2f}" for name in deciders)
            + " ms   max |Δp| vs own "
            + "  ".join(f"{row[f'{name}_max_p_yes_difference']:.4f}" for name in deciders)
        )
    report = {
        "benchmark": "fused_kernels",
        "device": torch.cuda.get_device_name(),
        "model": deciders["own"].name,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "fused_kernels": str(deciders["fused"].features.fusion),
        "rounds": args.rounds,
        "repeats": args.repeats,
        "rows": rows,
        "rms_norm": norm_rows(loaded.model, args.questions, args.prefix_tokens, args.repeats),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
