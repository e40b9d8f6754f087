"""The cascade kernel's tile sizes, timed alone on one document and on sixteen (CUDA; Qwen3-0.6B's heads, bf16).

    python -m benchmarks.kernel_tiles
    git show REV:src/typedlm/ops/cascade_kernel.py > /tmp/before.py
    python -m benchmarks.kernel_tiles --baseline /tmp/before.py     # another version side by side

One layer's attention (`ops.cascade_kernel`) for P cached (default 64) and T = 1200 new rows per document and
Q = 1 or 32 questions of 31 rows, 1 or 16 documents per launch, under each (rows per program, keys per step,
warps, stages); `triton.testing.do_bench` medians, and the attention arithmetic's rate (4·D flops per query
head and key seen). The first configuration is the shipped one; the others are checked against its output.
With `--baseline`, that file's `cascade_attention` is timed right after the shipped module's in every cell and
checked against it too. Prints a line per configuration, writes JSON (default
results/kernel_tiles/DATE-cuda[-label].json).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from datetime import date

import torch
import triton

from benchmarks.harness import add_output_arguments, output_path, write_report
from typedlm.ops import cascade_kernel, kernel_blocks

HEADS, KV_HEADS, HEAD_DIM, ROWS_PER_QUESTION, WIDTH = 16, 8, 128, 31, 32
CONFIGS = [(64, 64, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2)]
CONFIGS += [(64, 64, 4, 3), (32, 64, 4, 2), (64, 64, 4, 4), (128, 64, 8, 4), (64, 128, 4, 3)]


def flops(documents: int, cached: int, rows: int, questions: int) -> float:
    """Attention arithmetic of one launch: 4·D per query head and key it sees (q·k, then p·v)."""
    own = ROWS_PER_QUESTION * (ROWS_PER_QUESTION + 1) // 2
    keys = rows * cached + rows * (rows + 1) // 2 + questions * (ROWS_PER_QUESTION * (cached + rows) + own)
    return 4.0 * HEAD_DIM * HEADS * documents * keys


def load_kernel(path: str):
    """A module from a file holding a version of `ops/cascade_kernel.py`."""
    spec = importlib.util.spec_from_file_location("cascade_kernel_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    add_output_arguments(parser, "kernel_tiles")
    parser.add_argument("--cached", type=int, default=64, help="cached keys before each document's rows")
    parser.add_argument("--baseline", default=None, help="a file holding another version of ops/cascade_kernel.py")
    parser.add_argument(
        "--configs", nargs="+", default=None, help="only these, as rows/keys/warps/stages (default: all of CONFIGS)"
    )
    args = parser.parse_args()
    configs = [tuple(int(x) for x in c.split("/")) for c in args.configs] if args.configs else CONFIGS
    shapes = {f"{d} doc{'s' if d > 1 else ''} Q{q}": (d, args.cached, 1200, q) for d in (1, 16) for q in (1, 32)}
    cases = {name: case(*shape) for name, shape in shapes.items()}
    kernels = {"shipped": cascade_kernel}
    if args.baseline:
        kernels["baseline"] = load_kernel(args.baseline)
    results, reference = [], {}
    for rows, keys, warps, stages in configs:
        kernel_blocks.BLOCK_ROWS = rows
        for module in kernels.values():
            module.KEY_BLOCK, module.NUM_WARPS, module.NUM_STAGES = keys, warps, stages
        cells = []
        for name, c in cases.items():
            blocks = table(c, kernel_blocks.block_tokens(HEADS // KV_HEADS))
            for kernel, module in kernels.items():

                def attend(c=c, blocks=blocks, module=module):
                    return module.cascade_attention(
                        *c["tensors"], blocks, c["slots"], c["own"], c["doc_rows"], HEAD_DIM**-0.5
                    )

                try:
                    out = attend()
                except triton.runtime.errors.OutOfResources as error:  # tiles too large for this GPU's memory
                    cells.append(f"{name} {kernel}: {error}")
                    continue
                ms = triton.testing.do_bench(attend, warmup=10, rep=50)
                error = (out.float() - reference.setdefault(name, out).float()).abs().max().item()
                tflops = flops(*shapes[name]) / ms / 1e9
                results.append(dict(kernel=kernel, rows=rows, keys=keys, warps=warps, stages=stages, case=name,
                                    us=1000 * ms, tflops=tflops, error=error))  # fmt: skip
                cells.append(f"{name} {kernel}: {1000 * ms:.0f} us {tflops:.0f} TFLOP/s (|d| {error:.1e})")
        print(f"rows {rows} keys {keys} warps {warps} stages {stages}: " + "; ".join(cells), flush=True)
    report = {"benchmark": "kernel_tiles", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "date": date.today().isoformat(), "rows": results}  # fmt: skip
    out = write_report(report, output_path(args, "kernel_tiles", "cuda"))
    print(json.dumps({"benchmark": "kernel_tiles", "out": str(out), "rows": len(results)}))


if __name__ == "__main__":
    main()
