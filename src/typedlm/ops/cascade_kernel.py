"""The static cascade's attention in one Triton kernel launch per layer: no partial outputs, no merge, no copies.

`attention` computes a forward's attention as separate calls (document rows over the cache; packed rows over
the prefix; packed rows over their own question), then merges the partial outputs by log-sum-exp. On a GPU
each call, gather, scatter and merge is a kernel launch and a trip through memory, and at this model size those
cost more than the arithmetic. Here one program takes a block of rows of one key/value head (the query heads
that share it folded into the block's rows, so grouped keys are read once) and runs an online softmax over
every key that block may see:

- document rows: keys [0, p + i] of the key/value buffer (the cached prefix, then the document causally);
  blocks of the longest rows start first;
- packed rows, in blocks of consecutive rows (a block may end one question and begin the next): keys
  [0, p + t) of the buffer (the whole prefix), then the rows of their own question that `own_mask` lets them
  see (their ancestors and themselves).

Key blocks that every row of a program sees run without masks; only the causal edge, the buffer's end and the
question's own rows are masked. This is exactly softmax attention over the union of those keys. Without a GPU
the kernel runs in Triton's interpreter (`TRITON_INTERPRET=1`), which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
BLOCK_ROWS = 64  # query rows (tokens × grouped heads) per program, at most (a question's block may be smaller)
MIN_ROWS = 16  # the matrix units' smallest tile
NUM_WARPS = 4  # these four: the fastest measured on an H200 for Qwen3-0.6B shapes (benchmarks/README.md)
NUM_STAGES = 2
KEY_BLOCK = 64  # keys per step of the online softmax


@triton.jit
def _online_step(
    acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, visible, scale_log2,
    MASKED: tl.constexpr, FULL_DIM: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One block of keys into the running softmax. k_ptrs [D, N], v_ptrs [N, D]; with MASKED, only the keys
    `key_ok` [N] are read and row i sees key j where `visible` [M, N]; without, every key is read and seen."""
    if MASKED:
        k = tl.load(k_ptrs, mask=d_ok[:, None] & key_ok[None, :], other=0.0)  # [D, N]
        v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)  # [N, D]
    elif FULL_DIM:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    scores = tl.dot(q, k, input_precision=PRECISION) * scale_log2  # [M, N], in log2 units
    if MASKED:
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _attend_keys(
    acc, m_i, l_i, q, K, V, stride_kc, stride_kh, stride_vc, stride_vh, kvh, all_see, any_see, last_key, row_ok, d,
    d_ok, n, scale_log2, FULL_DIM: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Keys [0, any_see) of K/V (rows of strides `stride_kc`, `stride_vc`) into the running softmax: row i sees key
    j <= last_key[i]; keys [0, all_see) every row sees, and their whole blocks run without masks."""
    whole_blocks = all_see // BLOCK_N * BLOCK_N
    for start in range(0, whole_blocks, BLOCK_N):
        key = start + n
        k_ptrs = K + key[None, :] * stride_kc + kvh * stride_kh + d[:, None]
        v_ptrs = V + key[:, None] * stride_vc + kvh * stride_vh + d[None, :]
        acc, m_i, l_i = _online_step(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, n, d_ok, row_ok[:, None], scale_log2, False, FULL_DIM, PRECISION
        )
    for start in range(whole_blocks, any_see, BLOCK_N):
        key = start + n
        key_ok = key < any_see
        visible = row_ok[:, None] & key_ok[None, :] & (key[None, :] <= last_key[:, None])
        k_ptrs = K + key[None, :] * stride_kc + kvh * stride_kh + d[:, None]
        v_ptrs = V + key[:, None] * stride_vc + kvh * stride_vh + d[None, :]
        acc, m_i, l_i = _online_step(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, visible, scale_log2, True, FULL_DIM, PRECISION
        )
    return acc, m_i, l_i


@triton.jit
def _cascade_kernel(
    Q,  # [R, H, D] this forward's queries
    KB,  # [C, Hkv, D] key buffer: the cached prefix at [0, p); the document rows' keys are written after it
    VB,
    KR,  # [R, Hkv, D] this forward's keys: the document's, then the packed rows'
    VR,
    OUT,  # [R, H, D]
    CU,  # int32 [8]: (0, t, 0, p + t, 0, packed rows, real packed rows, 0)
    ROW_SLOT,  # int64 [N]: each packed row's question g and place s in it, as g·S + s
    MASK,  # bool [G, S, S]: own_mask
    stride_qr,
    stride_qh,
    stride_bc,
    stride_bh,
    stride_kr,  # KR's rows and heads
    stride_kh,
    stride_vr,  # VR's (the values may lie in a joined q/k/v product: other strides than the keys')
    stride_vh,
    stride_or,
    stride_oh,
    doc_rows,
    doc_blocks,  # programs 0 .. doc_blocks - 1 take document rows, the rest packed rows
    width,  # S
    scale_log2,
    HEAD_DIM: tl.constexpr,
    DIM: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    GROUPS: tl.constexpr,  # query heads per key/value head
    GROUP_ROWS: tl.constexpr,  # GROUPS rounded up to a power of two: a program has TOKENS × GROUP_ROWS rows
    TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
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
    p = tl.load(CU + 3) - t
    zero = pid * 0
    if pid < doc_blocks:  # document rows, the longest first: row i sees the prefix and the document's [0, i]
        first = (doc_blocks - 1 - pid) * TOKENS
        row = first + token
        row_ok = (row < t) & head_ok
        stored = (row < doc_rows) & head_ok
        last_key = row
        live = first < t  # the block has a real row
        all_see = tl.where(live, first + 1, zero)  # document keys [0, all_see): every row sees them
        any_see = tl.where(live, tl.minimum(first + TOKENS, t), zero)
        own_start, own_end, segment, place = zero, zero, token, token
        # this block's keys and values go to the buffer after the prefix (padding rows too: they lie past p + t)
        written = first + tl.arange(0, TOKENS)
        at = (written < doc_rows)[:, None] & d_ok[None, :]
        key_source = written[:, None] * stride_kr + kvh * stride_kh + d[None, :]
        value_source = written[:, None] * stride_vr + kvh * stride_vh + d[None, :]
        target = (p + written)[:, None] * stride_bc + kvh * stride_bh + d[None, :]
        tl.store(KB + target, tl.load(KR + key_source, mask=at), mask=at)
        tl.store(VB + target, tl.load(VR + value_source, mask=at), mask=at)
    else:  # packed rows: the prefix, the whole document, then the rows of their own question that `MASK` shows
        real = tl.load(CU + 6)
        first = (pid - doc_blocks) * TOKENS
        packed = first + token
        row_ok = (packed < real) & head_ok
        stored = (packed < tl.load(CU + 5)) & head_ok  # padding rows get zeros
        row = doc_rows + packed
        place = tl.load(ROW_SLOT + packed, mask=packed < real, other=0).to(tl.int32)
        segment = place // width
        last_key = t - 1 + zero * row
        live = first < real
        all_see = tl.where(live, t, zero)
        any_see = all_see
        # ancestors come first: the block's own keys start at its first row's question, end at its last row
        own_start = first - tl.load(ROW_SLOT + first, mask=first < real, other=0).to(tl.int32) % width
        own_end = tl.minimum(first + TOKENS, real)
    q = tl.load(
        Q + row[:, None] * stride_qr + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    acc = tl.zeros((TOKENS * GROUP_ROWS, DIM), dtype=tl.float32)
    m_i = tl.full((TOKENS * GROUP_ROWS,), -1.0e30, dtype=tl.float32)  # finite: rows that see nothing stay 0
    l_i = tl.zeros((TOKENS * GROUP_ROWS,), dtype=tl.float32)
    prefix = tl.where(live, p, zero)  # the cached prefix: every row sees all of it
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, KB, VB, stride_bc, stride_bh, stride_bc, stride_bh, kvh, prefix, prefix, p - 1 + zero * row,
        row_ok, d, d_ok, n, scale_log2, HEAD_DIM == DIM, PRECISION, BLOCK_N,
    )  # fmt: skip
    acc, m_i, l_i = _attend_keys(  # the document's keys, read where this forward computed them
        acc, m_i, l_i, q, KR, VR, stride_kr, stride_kh, stride_vr, stride_vh, kvh, all_see, any_see, last_key, row_ok,
        d, d_ok, n, scale_log2, HEAD_DIM == DIM, PRECISION, BLOCK_N,
    )  # fmt: skip
    for start in range(own_start, own_end, BLOCK_N):  # packed rows: their own question's rows
        own = start + n
        key_ok = own < own_end
        own_place = tl.load(ROW_SLOT + own, mask=key_ok, other=0).to(tl.int32)
        same = row_ok[:, None] & key_ok[None, :] & (segment[:, None] == own_place[None, :] // width)
        seen = tl.load(MASK + place.to(tl.int64)[:, None] * width + own_place[None, :] % width, mask=same, other=0)
        k_ptrs = KR + (doc_rows + own)[None, :] * stride_kr + kvh * stride_kh + d[:, None]
        v_ptrs = VR + (doc_rows + own)[:, None] * stride_vr + kvh * stride_vh + d[None, :]
        acc, m_i, l_i = _online_step(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, same & (seen != 0), scale_log2, True, HEAD_DIM == DIM,
            PRECISION,
        )  # fmt: skip
    inverse = tl.where(row_ok & (l_i > 0), 1.0 / tl.where(l_i > 0, l_i, 1.0), 0.0)  # padding rows: 0
    out = acc * inverse[:, None]
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
    row_slot: torch.Tensor,
    own_mask: torch.Tensor,
    doc_rows: int,
    scale: float,
) -> torch.Tensor:
    """Attention of every row of a static forward, in one launch; `StaticPlan`'s layout (see `attention`).

    q: [R, H, D] (the first `doc_rows` rows are document rows, the rest packed rows); k/v: [R, Hkv, D] this
    forward's keys and values; kbuf/vbuf: [C, Hkv, D] with the cached prefix at [0, p): the document rows' keys
    and values (the first `doc_rows` of k/v) are written at [p, p + doc_rows); cu: int32 (0, t, 0, p + t, 0,
    packed rows, real packed rows, 0), t real document rows; row_slot: int64 [N] each real packed row's question
    g and place s as g·S + s (questions are runs of consecutive rows); own_mask: bool [G, S, S] place i of
    question g sees place j. Returns out [R, H, D]: padding rows are 0.
    """
    rows, heads, head_dim = q.shape
    kv_heads = kbuf.shape[1]
    groups = heads // kv_heads
    for x in (q, k, v, kbuf, vbuf):
        assert x.stride(-1) == 1, "the head dimension must be contiguous"
    assert kbuf.stride() == vbuf.stride()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # every row is written (padding rows: 0)
    group_rows = triton.next_power_of_2(groups)
    tokens = max(BLOCK_ROWS // group_rows, MIN_ROWS // group_rows, 1)  # a program's rows: tokens × group_rows
    doc_blocks = triton.cdiv(doc_rows, tokens)
    grid = (doc_blocks + triton.cdiv(rows - doc_rows, tokens), kv_heads)
    _cascade_kernel[grid](
        q, kbuf, vbuf, k, v, out, cu, row_slot, own_mask,
        *q.stride()[:2], *kbuf.stride()[:2], *k.stride()[:2], *v.stride()[:2], *out.stride()[:2],
        doc_rows, doc_blocks, own_mask.shape[-1], scale * LOG2E,
        HEAD_DIM=head_dim, DIM=triton.next_power_of_2(head_dim), GROUPS=groups, GROUP_ROWS=group_rows, TOKENS=tokens,
        BLOCK_N=KEY_BLOCK, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return out
