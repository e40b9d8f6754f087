"""The static cascade's attention in one Triton kernel per row kind: no partial outputs, no merge, no copies.

`attention.attend_ranges` and friends compute a forward's attention as separate calls (document rows over the
cache; packed rows over the prefix; packed rows over their own question), then merge the partial outputs by
log-sum-exp. On a GPU each call, gather, scatter and merge is a kernel launch and a trip through memory, and
at this model size those cost more than the arithmetic. Here one program takes a block of rows of one
key/value head (the query heads that share it folded into the block's rows, so grouped keys are read once) and
runs an online softmax over every key that block may see:

- document rows (`document_attention`): keys [0, p + i] of the key/value buffer (the cached prefix, then the
  document causally);
- packed rows (`packed_attention`): keys [0, p + t) of the buffer (the whole prefix), then the rows of their
  own question that `own_mask` lets them see (its ancestors and itself).

Both are exactly softmax attention over the union of those keys: the split and merge disappear. Without a GPU
the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`), which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
BLOCK_ROWS = 64  # query rows (tokens × grouped heads) per program, at most (a question's block may be smaller)
MIN_ROWS = 16  # the matrix units' smallest tile
NUM_WARPS = 4  # these four: the fastest of 16 combinations on an H200 for Qwen3-0.6B shapes (benchmarks/README.md)
NUM_STAGES = 2
KEY_BLOCK = 64  # keys per step of the online softmax


@triton.jit
def _online_step(acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, visible, scale_log2, PRECISION: tl.constexpr):
    """One block of keys into the running softmax. k_ptrs [D, N], v_ptrs [N, D]; visible [M, N]."""
    k = tl.load(k_ptrs, mask=d_ok[:, None] & key_ok[None, :], other=0.0)  # [D, N]
    scores = tl.where(
        visible, tl.dot(q, k, input_precision=PRECISION) * scale_log2, float("-inf")
    )  # [M, N], in log2 units
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)  # [N, D]
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _cascade_kernel(
    Q,  # [R, H, D] this forward's queries
    KB,  # [C, Hkv, D] key buffer: the cached prefix, then the document rows
    VB,
    KR,  # [R, Hkv, D] this forward's keys (the packed rows' own keys are read from here)
    VR,
    OUT,  # [R, H, D]
    CU,  # int32 [6]: (0, t, 0, p + t, 0, packed rows)
    SEG,  # int64 [G, 2]: (first packed row, rows) of each question; 0 rows for padding
    MASK,  # bool [G, S, S]: own_mask
    stride_qr,
    stride_qh,
    stride_bc,
    stride_bh,
    stride_rr,
    stride_rh,
    stride_or,
    stride_oh,
    doc_rows,
    width,
    blocks_per_segment,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    DIM: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    GROUPS: tl.constexpr,  # query heads per key/value head
    GROUP_ROWS: tl.constexpr,  # GROUPS rounded up to a power of two: a program has TOKENS × GROUP_ROWS rows
    TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PACKED: tl.constexpr,
    PRECISION: tl.constexpr,  # of the matrix products: "ieee" keeps float32 inputs in float32 (no TF32)
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    m = tl.arange(0, TOKENS * GROUP_ROWS)
    token = m // GROUP_ROWS
    head_ok = m % GROUP_ROWS < GROUPS
    head = kvh * GROUPS + m % GROUP_ROWS
    d = tl.arange(0, DIM)
    d_ok = d < HEAD_DIM
    n = tl.arange(0, BLOCK_N)
    t = tl.load(CU + 1)
    keys_end = tl.load(CU + 3)  # p + t
    if PACKED:
        segment = pid // blocks_per_segment
        first_slot = (pid % blocks_per_segment) * TOKENS
        seg_start = tl.load(SEG + 2 * segment)
        seg_rows = tl.load(SEG + 2 * segment + 1)
        slot = first_slot + token
        row_ok = (slot < seg_rows) & head_ok
        row = doc_rows + seg_start + slot
        stored = row_ok
        buffer_end = keys_end  # the whole prefix
    else:
        row = pid * TOKENS + token
        row_ok = (row < t) & head_ok
        stored = (row < doc_rows) & head_ok  # padding rows get zeros
        buffer_end = keys_end - t + tl.minimum(pid * TOKENS + TOKENS, t)  # past the last key a row here sees
    last_key = keys_end - t + row  # document row i sees keys [0, p + i]
    q = tl.load(
        Q + row[:, None] * stride_qr + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    acc = tl.zeros((TOKENS * GROUP_ROWS, DIM), dtype=tl.float32)
    m_i = tl.full((TOKENS * GROUP_ROWS,), -1.0e30, dtype=tl.float32)  # finite: rows that see nothing stay 0, not NaN
    l_i = tl.zeros((TOKENS * GROUP_ROWS,), dtype=tl.float32)
    for start in range(0, buffer_end, BLOCK_N):
        key = start + n
        key_ok = key < buffer_end
        visible = row_ok[:, None] & key_ok[None, :]
        if not PACKED:
            visible = visible & (key[None, :] <= last_key[:, None])
        k_ptrs = KB + key[None, :] * stride_bc + kvh * stride_bh + d[:, None]
        v_ptrs = VB + key[:, None] * stride_bc + kvh * stride_bh + d[None, :]
        acc, m_i, l_i = _online_step(acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, visible, scale_log2, PRECISION)
    if PACKED:  # the question's own rows: ancestors come before a row, so slots past this block are never seen
        own_end = tl.minimum(seg_rows, first_slot + TOKENS)
        for start in range(0, own_end, BLOCK_N):
            own = start + n
            key_ok = own < own_end
            seen = tl.load(
                MASK + segment * width * width + slot[:, None] * width + own[None, :],
                mask=row_ok[:, None] & key_ok[None, :],
                other=0,
            )
            key_row = doc_rows + seg_start + own
            k_ptrs = KR + key_row[None, :] * stride_rr + kvh * stride_rh + d[:, None]
            v_ptrs = VR + key_row[:, None] * stride_rr + kvh * stride_rh + d[None, :]
            acc, m_i, l_i = _online_step(
                acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, seen != 0, scale_log2, PRECISION
            )
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        OUT + row[:, None] * stride_or + head[:, None] * stride_oh + d[None, :],
        out.to(OUT.dtype.element_ty),
        mask=stored[:, None] & d_ok[None, :],
    )


def cascade_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kbuf: torch.Tensor,
    vbuf: torch.Tensor,
    cu: torch.Tensor,
    segments: torch.Tensor,
    own_mask: torch.Tensor,
    doc_rows: int,
    scale: float,
) -> torch.Tensor:
    """Attention of every row of a static forward; `StaticPlan`'s layout (see `attention.StaticPlan`).

    q: [R, H, D] (the first `doc_rows` rows are document rows, the rest packed rows); k/v: [R, Hkv, D] this
    forward's keys and values; kbuf/vbuf: [C, Hkv, D] with the cached prefix at [0, p) and the document rows
    already written at [p, p + t); cu: int32 (0, t, 0, p + t, 0, packed rows); segments: int64 [G, 2] (first
    packed row, rows) of each question (0 rows: padding); own_mask: bool [G, S, S]. Returns out [R, H, D]:
    padding document rows and packed rows outside every question are 0.
    """
    rows, heads, head_dim = q.shape
    kv_heads = kbuf.shape[1]
    groups = heads // kv_heads
    for x in (q, k, v, kbuf, vbuf):
        assert x.stride(-1) == 1, "the head dimension must be contiguous"
    assert k.stride() == v.stride() and kbuf.stride() == vbuf.stride()
    out = torch.zeros_like(q)
    dim = triton.next_power_of_2(head_dim)
    group_rows = triton.next_power_of_2(groups)
    common = dict(num_warps=NUM_WARPS, num_stages=NUM_STAGES, HEAD_DIM=head_dim, DIM=dim, GROUPS=groups)
    common.update(GROUP_ROWS=group_rows, BLOCK_N=KEY_BLOCK)
    common["PRECISION"] = "ieee" if q.dtype == torch.float32 else "tf32"
    fewest = max(MIN_ROWS // group_rows, 1)  # tokens per program so that a program has at least MIN_ROWS rows
    strides = (q.stride(0), q.stride(1), kbuf.stride(0), kbuf.stride(1), k.stride(0), k.stride(1))
    strides += (out.stride(0), out.stride(1))
    scale_log2 = scale * LOG2E
    if doc_rows:
        tokens = max(BLOCK_ROWS // group_rows, fewest)
        grid = (triton.cdiv(doc_rows, tokens), kv_heads)
        _cascade_kernel[grid](
            q, kbuf, vbuf, k, v, out, cu, segments, own_mask, *strides, doc_rows, 0, 1, scale_log2,
            TOKENS=tokens, PACKED=False, **common,
        )  # fmt: skip
    g, width = own_mask.shape[0], own_mask.shape[-1]
    if rows > doc_rows and g:
        tokens = max(min(triton.next_power_of_2(width), BLOCK_ROWS // group_rows), fewest)
        per_segment = triton.cdiv(width, tokens)
        grid = (g * per_segment, kv_heads)
        _cascade_kernel[grid](
            q, kbuf, vbuf, k, v, out, cu, segments, own_mask, *strides, doc_rows, width, per_segment, scale_log2,
            TOKENS=tokens, PACKED=True, **common,
        )  # fmt: skip
    return out
