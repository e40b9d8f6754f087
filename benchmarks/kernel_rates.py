"""The fused Triton kernels of `ops/triton_ops.py` alone, at a forward's shapes: time, bytes, rate, and settings.

    python -m benchmarks.kernel_rates                       # CUDA; Qwen3-0.6B's widths, 16 documents' rows
    python -m benchmarks.kernel_rates --rows 20416 34304    # a 16-document forward at Q = 1 and at Q = 32
    python -m benchmarks.kernel_rates --device cpu --rows 64 --repeats 2   # Triton's interpreter: a smoke run

Between the matrix products and the attention, a layer runs three kernels of its own over every row: the
residual adds fused with their norms (`add_rms_norm`, twice), the q/k norms with the rotary (`norm_rope`) and the
MLP's SwiGLU (`silu_mul_joined`). They move bytes and do little arithmetic, so each has a floor: the bytes it
must read and write at the memory's rate. This script times each on random inputs of the model's widths (the
q/k norms reading the heads of a joined q/k/v product in place, as the model hands them over), for every
setting of the module's three knobs (`ELEMENTS_PER_PROGRAM`, `COLUMNS_PER_PROGRAM`, `NUM_WARPS`) that the kernel
reads, and checks that each setting gives the shipped setting's output bit for bit. Median over --repeats
timings of 10 calls each (CUDA events); the rate is the bytes each call must move over its time, and its share
of --peak-tbs. Ends with one JSON line; the JSON goes to results/kernel_rates/DATE-DEVICE[-label].json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time

import torch

from benchmarks.harness import add_output_arguments, device_kind, output_path, table_head, write_report

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 1024, 16, 8, 128, 3072  # Qwen3-0.6B
KNOBS = {
    "ELEMENTS_PER_PROGRAM": (2048, 4096, 8192, 16384),
    "COLUMNS_PER_PROGRAM": (1024, 2048, 4096),
    "NUM_WARPS": (2, 4, 8),
}
READS = {  # the knobs each kernel reads
    "add_rms_norm": ("ELEMENTS_PER_PROGRAM", "NUM_WARPS"),
    "norm_rope": ("ELEMENTS_PER_PROGRAM", "NUM_WARPS"),
    "silu_mul_joined": ("COLUMNS_PER_PROGRAM", "NUM_WARPS"),
}


def cases(ops, rows: int, device: str, dtype: torch.dtype) -> dict:
    """Each kernel's call on random inputs of `rows` rows, and the bytes it must read and write."""
    generator = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=device).to(dtype)

    x, residual, weight = rand(1, rows, HIDDEN), rand(1, rows, HIDDEN), rand(HIDDEN)
    joined = rand(1, rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM)  # the q/k/v product: q and k read in place
    q = joined[..., : HEADS * HEAD_DIM].view(1, rows, HEADS, HEAD_DIM)
    k = joined[..., HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(1, rows, KV_HEADS, HEAD_DIM)
    q_weight, k_weight = rand(HEAD_DIM), rand(HEAD_DIM)
    angles = torch.randn(1, rows, HEAD_DIM // 2, generator=generator, device=device)
    cos, sin = (f(torch.cat((angles, angles), dim=-1)).to(dtype) for f in (torch.cos, torch.sin))
    gate_up = rand(1, rows, 2 * INTERMEDIATE)
    size = torch.tensor([], dtype=dtype).element_size()
    return {
        "add_rms_norm": (lambda: ops.add_rms_norm(x, residual, weight, 1e-6), 4 * rows * HIDDEN * size),
        "norm_rope": (
            lambda: ops.norm_rope(q, k, q_weight, k_weight, 1e-6, cos, sin),
            (2 * (HEADS + KV_HEADS) + 2) * rows * HEAD_DIM * size,  # q and k read and written; cos and sin read
        ),
        "silu_mul_joined": (lambda: ops.silu_mul_joined(gate_up), 3 * rows * INTERMEDIATE * size),
    }


def timed(call, device: str, repeats: int) -> float:
    """Median µs per call over `repeats` timings of 10 calls each."""
    cuda = device.startswith("cuda")
    call()
    samples = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                call()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 100.0)  # ms for 10 calls -> µs per call
        else:
            t0 = time.perf_counter()
            for _ in range(10):
                call()
            samples.append((time.perf_counter() - t0) * 1e5)
    return statistics.median(samples)


def outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, tuple) else [result]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, nargs="+", default=[34304], help="rows of the forward (default: 16 docs)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--peak-tbs", type=float, default=4.8, help="the memory's rate, TB/s (an H200's HBM3e)")
    add_output_arguments(parser, "kernel_rates")
    args = parser.parse_args()
    if not args.device.startswith("cuda"):
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: its kernels run on CPU tensors
    from typedlm.ops import triton_ops

    dtype = getattr(torch, args.dtype)
    shipped = {name: getattr(triton_ops, name) for name in KNOBS}
    rows_out = []
    columns = ("rows", "kernel", *KNOBS, "µs", "GB/s", f"share of {args.peak_tbs} TB/s", "same output")
    print(table_head(columns, "rl" + "r" * len(KNOBS) + "rrrl"))
    for rows in args.rows:
        for kernel, (call, size) in cases(triton_ops, rows, args.device, dtype).items():
            want = outputs(call())
            settings = [
                dict(zip(READS[kernel], values)) for values in itertools.product(*(KNOBS[k] for k in READS[kernel]))
            ]
            for setting in settings:
                for name, value in {**shipped, **setting}.items():
                    setattr(triton_ops, name, value)
                try:
                    same = all(torch.equal(g, w) for g, w in zip(outputs(call()), want, strict=True))
                    us = timed(call, args.device, args.repeats)
                finally:
                    for name, value in shipped.items():
                        setattr(triton_ops, name, value)
                knobs = {name: setting.get(name, shipped[name]) for name in KNOBS}
                rate = size / us / 1e3  # GB/s
                share = rate / (args.peak_tbs * 1e3)
                row = dict(rows=rows, kernel=kernel, **knobs, us=round(us, 1), bytes=size, gb_per_s=round(rate, 1))
                row.update(share=round(share, 3), same=same, shipped=knobs == shipped)
                rows_out.append(row)
                mark = " (shipped)" if row["shipped"] else ""
                cells = " | ".join(str(knobs[name]) for name in KNOBS)
                print(f"| {rows} | {kernel}{mark} | {cells} | {row['us']} | {row['gb_per_s']} | {share:.0%} | {same} |")
    report = {
        "benchmark": "kernel_rates",
        "device": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "widths": dict(hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate=INTERMEDIATE),
        "shipped": shipped,
        "peak_tbs": args.peak_tbs,
        "rows": rows_out,
    }
    out = write_report(report, output_path(args, "kernel_rates", device_kind(args.device)))
    print(json.dumps({"benchmark": "kernel_rates", "out": str(out), "rows": len(rows_out)}))


if __name__ == "__main__":
    main()
