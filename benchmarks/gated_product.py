"""The MLP's gate/up product and SwiGLU: one kernel (`ops.gated_product`) against the product, then the activation.

    python benchmarks/gated_product.py        # CUDA, Qwen3-0.6B's MLP (K = 1024, F = 3072), bfloat16

For the rows of one forward (one document of P ≈ 1266 tokens with Q = 1 or 32 questions of 31 rows: 1,297 and
2,258 rows; 16 such documents: 20,752 and 36,128), `triton.testing.do_bench` medians of:

- `unfused`: what runs without the kernel: `linear(x, joined)` (cuBLAS) writing [rows, 2F], then
  `triton_ops.silu_mul_joined` reading it back to write [rows, F];
- `product only`: the `linear` alone, for scale (the matrix rate's share of the unfused time);
- `fused`: `gated_product` under each tile configuration (rows / columns / depth per tile, warps, stages), read
  through tensor descriptors and, for the shipped tiles, through pointers too.

Each fused result is checked against the unfused one (max |difference| relative to the largest value). Prints
a line per row count, writes JSON (default results/gated-product-cuda-<date>.json), ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

import torch
import triton

from typedlm.ops import gated_product as gp
from typedlm.ops.triton_ops import silu_mul_joined

DEPTH, COLUMNS = 1024, 3072  # Qwen3-0.6B: hidden size, intermediate size
ROWS = [1297, 2258, 20752, 36128]
CONFIGS = [  # rows, columns, depth per tile, warps, stages; the first is the shipped one
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 3),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 128, 32, 8, 4),
    (128, 64, 64, 8, 3),
]


def set_config(rows: int, columns: int, depth: int, warps: int, stages: int) -> None:
    gp.BLOCK_M, gp.BLOCK_N, gp.BLOCK_K, gp.NUM_WARPS, gp.NUM_STAGES = rows, columns, depth, warps, stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=ROWS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    shipped = (gp.BLOCK_M, gp.BLOCK_N, gp.BLOCK_K, gp.NUM_WARPS, gp.NUM_STAGES)
    torch.manual_seed(0)
    joined = (torch.randn(2 * COLUMNS, DEPTH, device="cuda") / DEPTH**0.5).to(torch.bfloat16)
    results = []
    for rows in args.rows:
        x = torch.randn(rows, DEPTH, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * rows * DEPTH * 2 * COLUMNS
        want = silu_mul_joined(torch.nn.functional.linear(x, joined)).float()
        scale = want.abs().max().item()
        timed = {
            "unfused": lambda x=x: silu_mul_joined(torch.nn.functional.linear(x, joined)),
            "product only": lambda x=x: torch.nn.functional.linear(x, joined),
        }
        cells = []
        for name, fn in timed.items():
            ms = triton.testing.do_bench(fn, warmup=10, rep=100)
            results.append(dict(rows=rows, variant=name, us=1000 * ms, tflops=flops / ms / 1e9, error=0.0))
            cells.append(f"{name} {1000 * ms:.0f} us ({flops / ms / 1e9:.0f} TFLOP/s)")
        for config in CONFIGS:
            for path in ("descriptors", "pointers") if config == CONFIGS[0] else ("descriptors",):
                set_config(*config)
                gp.DESCRIPTORS = path == "descriptors"
                try:
                    got = gp.gated_product(x, joined)
                except triton.runtime.errors.OutOfResources:
                    cells.append(f"{'/'.join(map(str, config))} {path}: out of resources")
                    continue
                error = (got.float() - want).abs().max().item() / scale
                ms = triton.testing.do_bench(lambda x=x: gp.gated_product(x, joined), warmup=10, rep=100)
                name = f"fused {'/'.join(map(str, config))} {path}"
                results.append(dict(rows=rows, variant=name, us=1000 * ms, tflops=flops / ms / 1e9, error=error))
                cells.append(f"{name} {1000 * ms:.0f} us ({flops / ms / 1e9:.0f} TFLOP/s, |d| {error:.1e})")
        print(f"rows {rows}: " + "; ".join(cells), flush=True)
    set_config(*shipped)
    gp.DESCRIPTORS = True
    report = {"benchmark": "gated_product", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "date": date.today().isoformat(), "rows": results}  # fmt: skip
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"gated-product-cuda-{report['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    best = {}
    for row in results:
        if row["variant"].startswith("fused") and row["us"] < best.get(row["rows"], {"us": float("inf")})["us"]:
            best[row["rows"]] = row
    unfused = {row["rows"]: row["us"] for row in results if row["variant"] == "unfused"}
    for rows, row in best.items():
        print(f"rows {rows}: best {row['variant']} {row['us']:.0f} us vs unfused {unfused[rows]:.0f} us")
    print(json.dumps({"benchmark": "gated_product", "out": str(out), "rows": len(results)}))


if __name__ == "__main__":
    main()
