"""The questions' rows over their whole documents as one dense attention call per layer (cuDNN on CUDA).

With many questions per document, most of the cascade's arithmetic is every packed row attending to its
document's whole key range (cached prefix, then new rows) with no mask: a dense product, which cuDNN's attention
runs about 1.7× faster than the cascade kernel (`benchmarks/dense_attention.py`). For it a forward lays its
documents out evenly (`DenseBatch`):

- document b's keys take the buffer's range [b·N, (b + 1)·N) (N = `key_stride`), zero past its cached prefix and
  new rows (`zero_tails`, once per forward, before the first layer writes anything);
- its questions' rows are gathered into M = `question_stride` rows of a dense batch: q [B, H, M, D] against
  k/v [B, Hkv, N, D], the latter strided views of the buffer (no copies).

A zero key adds e⁰ = 1 to its row's softmax sum and nothing to its output, so with n_pad zero keys the output
over the real keys is out / (1 − n_pad·e^−L), and its log-sum-exp L + log(1 − n_pad·e^−L): `cascade_kernel`'s
second launch takes that as its rows' starting state and adds their own question's keys (see there). No mask,
no variable-length call: both cost more than the padding saves (measured in the benchmark above).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from typedlm.ops.attention import attend_with_lse, plain_attention

ZERO_BLOCK = 4096  # buffer elements per step of `zero_tails`


@dataclass(frozen=True)
class DenseBatch:
    """A forward's dense batch: B = `documents` ranges of `key_stride` keys, `question_stride` query rows each.

    `rows` [B·M] int64: the forward's row whose query fills each place of the batch (padding places: any row,
    their output is never read); `tails` [B, 2] int64: each range's part to zero, [start, end) of the buffer
    (unused ranges: empty)."""

    rows: torch.Tensor
    tails: torch.Tensor
    documents: int
    question_stride: int
    key_stride: int


def attend(
    q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, batch: DenseBatch, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [R, H, D] a forward's queries; kbuf/vbuf: [C, Hkv, D] the key/value buffer. Returns every dense place's
    attention over its document's whole range, zero keys included: out [B, H, M, D] and lse [B, H, M] (float32),
    any strides."""
    b, m, n = batch.documents, batch.question_stride, batch.key_stride
    heads, dim = q.shape[1:]
    queries = q.index_select(0, batch.rows).view(b, m, heads, dim).transpose(1, 2)  # [B, H, M, D]
    keys, values = (x[: b * n].view(b, n, x.shape[1], dim).transpose(1, 2) for x in (kbuf, vbuf))  # [B, Hkv, N, D]
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            queries, keys, values, None, True, 0.0, False, False, scale=scale
        )[:2]
        return out, lse.view(b, heads, m)
    return attend_with_lse(queries, keys, values, scale)


@torch.inference_mode()
def cudnn_agrees(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `attend` runs here through cuDNN for these shapes, grouped heads as they are, and computes what
    `plain_attention` computes (False where this build, GPU or shape lacks it)."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    generator = torch.Generator().manual_seed(0)
    b, m, n = 2, 16, 128
    q = torch.randn(b * m, heads, head_dim, generator=generator).to(device, dtype)
    kbuf, vbuf = (torch.randn(b * n, kv_heads, head_dim, generator=generator).to(device, dtype) for _ in range(2))
    rows = torch.arange(b * m, device=device)
    batch = DenseBatch(rows, torch.zeros(b, 2, dtype=torch.int64, device=device), b, m, n)
    try:
        out, lse = attend(q, kbuf, vbuf, batch, head_dim**-0.5)
    except RuntimeError:  # no cuDNN attention in this build, or not for these shapes
        return False
    queries = q.view(b, m, heads, head_dim).transpose(1, 2)
    keys, values = (
        x.view(b, n, kv_heads, head_dim).transpose(1, 2).repeat_interleave(heads // kv_heads, 1) for x in (kbuf, vbuf)
    )
    want, want_lse = plain_attention(queries, keys, values, head_dim**-0.5)
    return bool((out.float() - want.float()).abs().max().item() <= 3e-2 and (lse - want_lse).abs().max().item() <= 1e-2)


@triton.jit
def _zero_tails_kernel(BUF, TAILS, plane_stride, row_elements, BLOCK: tl.constexpr):
    document, plane = tl.program_id(0), tl.program_id(1).to(tl.int64)
    start = tl.load(TAILS + 2 * document) * row_elements
    end = tl.load(TAILS + 2 * document + 1) * row_elements
    base = BUF + plane * plane_stride
    for offset in range(start, end, BLOCK):
        at = offset + tl.arange(0, BLOCK)
        tl.store(base + at, tl.zeros((BLOCK,), dtype=BUF.dtype.element_ty), mask=at < end)


def zero_tails(kv: torch.Tensor, tails: torch.Tensor) -> None:
    """kv [L, 2, C, Hkv, D]: zero every layer's keys and values at the buffer rows [start, end) of each `tails`
    [B, 2] (int64, on kv's device), in one launch."""
    assert kv.is_contiguous()
    layers, pairs, capacity = kv.shape[:3]
    row_elements = kv.shape[3] * kv.shape[4]
    _zero_tails_kernel[(tails.shape[0], layers * pairs)](kv, tails, capacity * row_elements, row_elements, ZERO_BLOCK)
