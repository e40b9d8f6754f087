"""The cascade kernel's tile sizes, timed alone on one document and on sixteen (CUDA; Qwen3-0.6B's heads, bf16).

    python benchmarks/kernel_tiles.py

One layer's attention (`ops.cascade_kernel`) for P = 64 cached and T = 1200 new rows per document and Q = 1 or
32 questions of 31 rows, 1 or 16 documents per launch, under each (rows per program, keys per step, warps,
stages); `triton.testing.do_bench` medians. The first configuration is the shipped one; the others are checked
against its output. Prints a line per configuration, writes JSON (default results/kernel-tiles-cuda-<date>.json).
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

import torch
import triton

from typedlm.ops import cascade_kernel, kernel_blocks

HEADS, KV_HEADS, HEAD_DIM, ROWS_PER_QUESTION, WIDTH = 16, 8, 128, 31, 32
CONFIGS = [(64, 64, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2)]
CONFIGS += [(64, 64, 4, 3), (32, 64, 4, 2)]


def case(documents: int, cached: int, rows: int, questions: int) -> dict:
    """Random inputs of one launch: `documents` documents of `rows` new rows after `cached` keys each."""
    doc_rows, packed = documents * rows, documents * questions * ROWS_PER_QUESTION
    options = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(doc_rows + packed, HEADS, HEAD_DIM, **options)
    k, v = (torch.randn(doc_rows + packed, KV_HEADS, HEAD_DIM, **options) for _ in range(2))
    kbuf, vbuf = (torch.randn(documents * (cached + rows) + 64, KV_HEADS, HEAD_DIM, **options) for _ in range(2))
    segments = documents * questions
    own = torch.zeros(segments, WIDTH, WIDTH, dtype=torch.bool, device="cuda")
    own[:, :ROWS_PER_QUESTION, :ROWS_PER_QUESTION] = torch.ones(ROWS_PER_QUESTION, ROWS_PER_QUESTION).tril().bool()
    slots = torch.tensor([g * WIDTH + s for g in range(segments) for s in range(ROWS_PER_QUESTION)], device="cuda")
    shape = ([rows] * documents, [cached] * documents, [i * (cached + rows) for i in range(documents)])
    return dict(tensors=(q, k, v, kbuf, vbuf), own=own, slots=slots, doc_rows=doc_rows, packed=packed,
                shape=shape, questions=[questions * ROWS_PER_QUESTION] * documents)  # fmt: skip


def table(c: dict, tokens: int) -> torch.Tensor:
    documents = len(c["questions"])
    size = kernel_blocks.capacity(c["doc_rows"], c["packed"], documents, tokens)
    blocks = kernel_blocks.block_table(*c["shape"], c["questions"], c["doc_rows"], c["packed"], tokens, size)
    return torch.from_numpy(blocks).cuda()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cases = {f"{d} doc{'s' if d > 1 else ''} Q{q}": case(d, 64, 1200, q) for d in (1, 16) for q in (1, 32)}
    results, reference = [], {}
    for rows, keys, warps, stages in CONFIGS:
        kernel_blocks.BLOCK_ROWS, cascade_kernel.KEY_BLOCK = rows, keys
        cascade_kernel.NUM_WARPS, cascade_kernel.NUM_STAGES = warps, stages
        cells = []
        for name, c in cases.items():
            blocks = table(c, kernel_blocks.block_tokens(HEADS // KV_HEADS))

            def attend(c=c, blocks=blocks):
                return cascade_kernel.cascade_attention(
                    *c["tensors"], blocks, c["slots"], c["own"], c["doc_rows"], HEAD_DIM**-0.5
                )

            out = attend()
            ms = triton.testing.do_bench(attend, warmup=10, rep=50)
            error = (out.float() - reference.setdefault(name, out).float()).abs().max().item()
            results.append(dict(rows=rows, keys=keys, warps=warps, stages=stages, case=name, us=1000 * ms, error=error))
            cells.append(f"{name}: {1000 * ms:.0f} us (|d| {error:.1e})")
        print(f"rows {rows} keys {keys} warps {warps} stages {stages}: " + "; ".join(cells), flush=True)
    report = {"benchmark": "kernel_tiles", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "date": date.today().isoformat(), "rows": results}  # fmt: skip
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"kernel-tiles-cuda-{report['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"benchmark": "kernel_tiles", "out": str(out), "rows": len(results)}))


if __name__ == "__main__":
    main()
