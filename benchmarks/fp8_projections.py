"""Whether FP8 matrix products would pay for a decoder's projections at the row counts a batched forward has.

    python -m benchmarks.fp8_projections [--rows 1300 10400 41600] [--repeats 50]

Qwen3-0.6B's projections (hidden 1024; q/k/v joined 1024 → 4096, the output 2048 → 1024, gate/up joined 1024 →
6144, down 3072 → 1024), each timed three ways on the GPU with CUDA events, taking turns, medians of --repeats:
bfloat16 `x @ w.T` (what the engine runs), the FP8 product alone on inputs quantized beforehand (`torch._scaled_mm`,
e4m3, a scale per row of x and per row of w: the most FP8 could save), and the FP8 product with x quantized inside
the timing (its amax, scale and cast per row: what a forward would pay, the weights quantized once at load). Rows
of 1,300 are one new document of ~1,270 tokens; 10,400 and 41,600 are 8 and 32 of them in one forward. The error
column is the FP8 output's relative Frobenius error against bfloat16's on random inputs (answers on real weights
need a real model: not measured here). Prints a table and the JSON path (results/fp8_projections/DATE.json).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.harness import add_output_arguments, output_path, table_head, table_row, write_report

PROJECTIONS = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024)}
E4M3_MAX = 448.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] as e4m3 with one float32 scale per row (x ≈ q · scale)."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def measure(m: int, k: int, n: int, repeats: int) -> dict:
    """One projection [m, k] × [k, n] timed the three ways, taking turns; and the FP8 output's relative error."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    wq, w_scale = quantize_rows(w)
    xq, x_scale = quantize_rows(x)

    def fp8_quantizing():
        q, s = quantize_rows(x)
        return torch._scaled_mm(q, wq.T, s, w_scale.T, out_dtype=torch.bfloat16)

    ways = {
        "bf16": lambda: x @ w.T,
        "fp8_product": lambda: torch._scaled_mm(xq, wq.T, x_scale, w_scale.T, out_dtype=torch.bfloat16),
        "fp8_quantizing": fp8_quantizing,
    }
    for fn in ways.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(max(1, repeats // 10)):  # in turns
        for way, fn in ways.items():
            times[way] += timed(fn, 10)
    want = ways["bf16"]().float()
    error = ((fp8_quantizing().float() - want).norm() / want.norm()).item()
    row = {"rows": m, "k": k, "n": n}
    row.update({f"{way}_ms": round(statistics.median(t), 4) for way, t in times.items()})
    return {**row, "relative_error": round(error, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1300, 10400, 41600])
    parser.add_argument("--repeats", type=int, default=50)
    add_output_arguments(parser, "fp8_projections")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    columns = ["rows", "projection", "bf16 ms", "fp8 product ms", "fp8 with quantizing ms", "rel. error"]
    print(table_head(columns, "rlrrrr"))
    for m in args.rows:
        for name, (k, n) in PROJECTIONS.items():
            row = {"projection": name, **measure(m, k, n, args.repeats)}
            rows.append(row)
            print(
                table_row(
                    [m, name, row["bf16_ms"], row["fp8_product_ms"], row["fp8_quantizing_ms"], row["relative_error"]]
                )
            )
    report = {"benchmark": "fp8_projections", "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(write_report({**report, "repeats": args.repeats, "rows": rows}, output_path(args, "fp8_projections")))


if __name__ == "__main__":
    main()
