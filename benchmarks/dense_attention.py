"""The questions' share of a batched forward's attention through PyTorch's dense attention kernels (CUDA).

    python -m benchmarks.dense_attention [--documents 16] [--questions 32] [--rows 1200] [--cached 46]

At Q = 32 most of the cascade kernel's arithmetic is the packed question rows attending to their whole document,
with no mask: a dense product that the vendor kernels (cuDNN's attention, FlashAttention-2 in PyTorch) may run
faster than the cascade kernel's ~300 TFLOP/s, their log-sum-exp then merged with the rows' own-question keys.
This measures whether that would pay, and in which layout, before anything is built on it: one layer, Qwen3-0.6B's
heads, bf16; every document's question rows over its cached prefix and its rows, each call with its log-sum-exp:

- cudnn, flash, efficient: the three backends, the grouped keys expanded to every query head;
- cudnn, grouped keys: the 8 key/value heads passed as they are (`enable_gqa`);
- cudnn, token-major: q/k/v as strided views of [tokens, heads, D] storage, as the engine holds them;
- cudnn, key-padding bias: a third of the documents 200 keys shorter, masked by an additive bias;
- cudnn, the engine's layout, zero-padded: grouped heads, token-major views, and the shorter documents' missing
  keys and values zero instead of masked: each adds exactly e⁰ to its row's sum and nothing to its output, so the
  output over the real keys is out / (1 − n_pad·e^−L) (checked here; a merge would do it in float32);
- cudnn / flash, variable lengths: the same documents packed end to end with cumulative lengths (wall time);

and whether the dense cuDNN call and the variable-length one can be captured in a CUDA graph, against the cascade
kernel's whole launch at Q and at 1 (the difference is roughly what the question rows cost it). Medians of
`triton.testing.do_bench` (variable lengths: wall time per call, 5 calls); prints a line per row, writes JSON
(default results/dense_attention/DATE-cuda[-label].json).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.harness import add_output_arguments, output_path, write_report
from benchmarks.kernel_tiles import HEAD_DIM, HEADS, KV_HEADS, ROWS_PER_QUESTION, case, table
from typedlm.ops import cascade_kernel, kernel_blocks

GROUPS = HEADS // KV_HEADS
SHORTER = 200  # keys fewer for every third document in the padded and variable-length rows


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: int | None = None) -> torch.Tensor:
    """softmax(q kᵀ / √D) v in float32 over the first `keys` keys; q [H, M, D], k/v [Hkv, N, D]."""
    k, v = (x[:, :keys].repeat_interleave(GROUPS, 0).float() for x in (k, v))
    return torch.softmax(q.float() @ k.transpose(-1, -2) * HEAD_DIM**-0.5, -1) @ v


def dense_calls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """name → a call returning (out [B, H, M, D], ...) for q [B, H, M, D], k/v [B, Hkv, N, D]."""
    wide_k, wide_v = (x.repeat_interleave(GROUPS, dim=1) for x in (k, v))
    scale = HEAD_DIM**-0.5
    aten = torch.ops.aten
    token_major = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, wide_k, wide_v)]
    lengths = torch.full((q.shape[0],), k.shape[2], device=q.device)
    lengths[::3] -= SHORTER
    beyond = torch.arange(k.shape[2], device=q.device)[None] >= lengths[:, None]  # [B, N]: keys a document lacks
    padding = torch.where(beyond, float("-inf"), 0.0).to(q.dtype)
    padding = padding[:, None, None, :].expand(q.shape[0], HEADS, q.shape[2], k.shape[2])
    zeroed = [x.transpose(1, 2).contiguous().masked_fill(beyond[:, :, None, None], 0.0).transpose(1, 2) for x in (k, v)]

    def grouped():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return (F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=scale),)

    def cudnn(*tensors, bias=None):
        return lambda: aten._scaled_dot_product_cudnn_attention(*tensors, bias, True, 0.0, False, False, scale=scale)

    def flash():
        return aten._scaled_dot_product_flash_attention(q, wide_k, wide_v, 0.0, False, False, scale=scale)

    def efficient():
        return aten._scaled_dot_product_efficient_attention(q, wide_k, wide_v, None, True, 0.0, False, scale=scale)

    calls = {
        "cudnn": cudnn(q, wide_k, wide_v),
        "flash": flash,
        "efficient": efficient,
        "cudnn, grouped keys": grouped,
        "cudnn, token-major": cudnn(*token_major),
        "cudnn, key-padding bias": cudnn(q, wide_k, wide_v, bias=padding),
        "cudnn, the engine's layout, zero-padded": cudnn(token_major[0], *zeroed),
    }
    return calls, lengths


def variable_calls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> tuple[dict, list]:
    """The documents packed end to end ([tokens, heads, D], cumulative lengths on the GPU), keys `lengths` long."""
    queries = torch.cat([x.transpose(0, 1) for x in q])
    keys, values = (torch.cat([x[:, :n].transpose(0, 1) for x, n in zip(t, lengths.tolist())]) for t in (k, v))
    wide_k, wide_v = (x.repeat_interleave(GROUPS, dim=1) for x in (keys, values))
    cum_q = torch.arange(q.shape[0] + 1, device=q.device, dtype=torch.int32) * q.shape[2]
    cum_k = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    m, n, scale = q.shape[2], k.shape[2], HEAD_DIM**-0.5
    aten = torch.ops.aten

    def cudnn():
        return aten._cudnn_attention_forward(
            queries, wide_k, wide_v, None, cum_q, cum_k, m, n, True, 0.0, False, False, scale=scale
        )

    def flash():
        return aten._flash_attention_forward(
            queries, wide_k, wide_v, cum_q, cum_k, m, n, 0.0, False, False, scale=scale
        )

    calls = {"cudnn, variable lengths": cudnn, "flash, variable lengths": flash}
    return calls, [int(x) for x in cum_k.tolist()]


def capturable(call) -> bool:
    """Whether `call` can be captured in a CUDA graph (and replayed)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        torch.cuda.synchronize()
        return True
    except RuntimeError:  # capture invalidated (a host synchronisation inside)
        torch.cuda.synchronize()
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--rows", type=int, default=1200, help="new rows per document")
    parser.add_argument("--cached", type=int, default=46, help="cached keys before each document's rows")
    add_output_arguments(parser, "dense_attention")
    args = parser.parse_args()
    d, n = args.documents, args.cached + args.rows
    m = args.questions * ROWS_PER_QUESTION
    options = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(d, HEADS, m, HEAD_DIM, **options)
    k, v = (torch.randn(d, KV_HEADS, n, HEAD_DIM, **options) for _ in range(2))
    work = 4.0 * HEAD_DIM * HEADS * m  # flops per key of one document
    dense, lengths = dense_calls(q, k, v)
    variable, cum_k = variable_calls(q, k, v, lengths)
    calls = {**dense, **variable}
    rows = []
    for name, call in calls.items():
        padded, packed = "bias" in name or "zero-padded" in name, "variable" in name
        try:
            result = call()
            out = result[0]
        except RuntimeError as error:  # a backend this build or GPU lacks
            rows.append(dict(backend=name, error=str(error).splitlines()[0]))
            print(f"{name}: not available ({rows[-1]['error'][:120]})", flush=True)
            continue
        if packed:  # wall time: host work per call counts
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            us = (time.perf_counter() - start) / 5 * 1e6
        else:
            us = 1000 * triton.testing.do_bench(call, warmup=10, rep=100)
        if "zero-padded" in name:  # the zero keys taken out of each row's sum
            missing = (n - lengths).float()[:, None, None]
            fix = 1 - missing * torch.exp(-result[1].reshape(d, HEADS, m).float())
            out = out.float() / fix[..., None]
        errors = []
        for i in (0, 1, d - 1):  # the first two documents (the first one shorter) and the last
            keys = int(lengths[i]) if (padded or packed) else n
            got = out[i * m : (i + 1) * m].transpose(0, 1) if packed else out[i]
            errors.append((got.float() - reference(q[i], k[i], v[i], keys)).abs().max().item())
        flops = work * (sum(lengths.tolist()) if (padded or packed) else d * n)
        rows.append(dict(backend=name, us=us, tflops=flops / us / 1e6, error=max(errors)))
        print(f"{name}: {us:.0f} us, {flops / us / 1e6:.0f} TFLOP/s (|d| {max(errors):.1e})", flush=True)
    cascade = {}
    for questions in (1, args.questions):
        c = case(d, args.cached, args.rows, questions)
        blocks = table(c, kernel_blocks.block_tokens(GROUPS))

        def attend(c=c, blocks=blocks):
            return cascade_kernel.cascade_attention(
                *c["tensors"], blocks, c["slots"], c["own"], c["doc_rows"], HEAD_DIM**-0.5
            )

        cascade[questions] = 1000 * triton.testing.do_bench(attend, warmup=10, rep=100)
        print(f"cascade kernel, whole launch, Q = {questions}: {cascade[questions]:.0f} us", flush=True)
    for row in rows:  # last: a capture that fails may leave the stream's work undone
        if "us" in row:
            row["graph"] = capturable(calls[row["backend"]])
            print(f"{row['backend']}: {'can' if row['graph'] else 'cannot'} be captured in a CUDA graph", flush=True)
    share = cascade[args.questions] - cascade[1]
    print(f"cascade kernel, the difference (about the question rows): {share:.0f} us, "
          f"{work * d * n / share / 1e6:.0f} TFLOP/s on the dense share")  # fmt: skip
    report = {"benchmark": "dense_attention", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "date": date.today().isoformat(), "documents": d,
              "questions": args.questions, "query_rows": m, "keys": n, "shorter_keys": cum_k, "rows": rows,
              "cascade_us": {str(k): v for k, v in cascade.items()}}  # fmt: skip
    out = write_report(report, output_path(args, "dense_attention", "cuda"))
    print(json.dumps({"benchmark": "dense_attention", "out": str(out)}))


if __name__ == "__main__":
    main()
