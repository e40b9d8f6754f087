"""The static cascade's attention in one Triton kernel launch per layer: no partial outputs, no merge, no copies.

`attention` computes a forward's attention as separate calls (document rows over the cache; packed rows over
the prefix; packed rows over their own question), then merges the partial outputs by log-sum-exp. On a GPU
each call, gather, scatter and merge is a kernel launch and a trip through memory, and at this model size those
cost more than the arithmetic. Here one program takes a block of rows of one key/value head (the query heads
that share it folded into the block's rows, so grouped keys are read once) and runs an online softmax over
every key that block may see. A forward holds one document or several, each with its own range of the buffer
(its cached prefix of p keys, then its t new rows' keys) and its questions. A block never mixes documents, and
which rows each program takes is data (`kernel_blocks.block_table`, built on the host, longest blocks first),
so one captured graph serves every forward of its padded sizes:

- document rows: row i of a document sees its buffer range's [0, p + i] (the cached prefix, then the
  document causally); the document's own keys are read where this forward computed them, and written to the
  buffer after its prefix;
- packed rows, in blocks of consecutive rows of one document (a block may end one question and begin the
  next): its whole range [0, p + t), then the rows of their own question that `own_mask` lets them see
  (their ancestors and themselves).

Key blocks that every row of a program sees run without masks; only the causal edge, the buffer's end and the
question's own rows are masked. This is exactly softmax attention over the union of those keys. Without a GPU
the kernel runs in Triton's interpreter (`TRITON_INTERPRET=1`), which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from typedlm.ops import kernel_blocks

LOG2E = 1.4426950408889634
NUM_WARPS = 4  # these four: the fastest measured on an H200 for Qwen3-0.6B shapes (docs/performance.md, "One request")
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
def _key_pointers(
    KB, VB, KR, VR, start, n, p, kvh, d, stride_bc, stride_bh, stride_kr, stride_kh, stride_vr, stride_vh,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Pointers to keys [start, start + N) of a document's sequence (k [D, N], v [N, D]): its cached prefix's
    keys [0, p) lie in the buffer (KB/VB from the prefix's start), the rest in this forward's rows (KR/VR from the
    document's first row). Only a block that straddles p picks per key."""
    key = start + n
    if start + BLOCK_N <= p:
        k_ptrs = KB + key[None, :] * stride_bc + kvh * stride_bh + d[:, None]
        v_ptrs = VB + key[:, None] * stride_bc + kvh * stride_bh + d[None, :]
    elif start >= p:
        k_ptrs = KR + (key - p)[None, :] * stride_kr + kvh * stride_kh + d[:, None]
        v_ptrs = VR + (key - p)[:, None] * stride_vr + kvh * stride_vh + d[None, :]
    else:
        cached = key < p
        k_ptrs = tl.where(
            cached[None, :],
            KB + key[None, :] * stride_bc + kvh * stride_bh + d[:, None],
            KR + (key - p)[None, :] * stride_kr + kvh * stride_kh + d[:, None],
        )
        v_ptrs = tl.where(
            cached[:, None],
            VB + key[:, None] * stride_bc + kvh * stride_bh + d[None, :],
            VR + (key - p)[:, None] * stride_vr + kvh * stride_vh + d[None, :],
        )
    return k_ptrs, v_ptrs


@triton.jit
def _attend_keys(
    acc, m_i, l_i, q, KB, VB, KR, VR, p, stride_bc, stride_bh, stride_kr, stride_kh, stride_vr, stride_vh, kvh,
    all_see, any_see, last_key, row_ok, d, d_ok, n, scale_log2, FULL_DIM: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Keys [0, any_see) of a document's sequence (see `_key_pointers`) into the running softmax: row i sees key
    j <= last_key[i]; keys [0, all_see) every row sees, and their whole blocks run without masks. The blocks are
    counted from the sequence's start whatever its cached share p, so a row's sums run in the same order whether
    the document was cached or is computed in this forward, alone or beside others."""
    whole_blocks = all_see // BLOCK_N * BLOCK_N
    for start in range(0, whole_blocks, BLOCK_N):
        k_ptrs, v_ptrs = _key_pointers(
            KB, VB, KR, VR, start, n, p, kvh, d, stride_bc, stride_bh, stride_kr, stride_kh, stride_vr, stride_vh,
            BLOCK_N,
        )  # fmt: skip
        acc, m_i, l_i = _online_step(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, n, d_ok, row_ok[:, None], scale_log2, False, FULL_DIM, PRECISION
        )
    for start in range(whole_blocks, any_see, BLOCK_N):
        key = start + n
        key_ok = key < any_see
        visible = row_ok[:, None] & key_ok[None, :] & (key[None, :] <= last_key[:, None])
        k_ptrs, v_ptrs = _key_pointers(
            KB, VB, KR, VR, start, n, p, kvh, d, stride_bc, stride_bh, stride_kr, stride_kh, stride_vr, stride_vh,
            BLOCK_N,
        )  # fmt: skip
        acc, m_i, l_i = _online_step(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, visible, scale_log2, True, FULL_DIM, PRECISION
        )
    return acc, m_i, l_i


# Triton compiles a kernel once per specialisation of its integer arguments (divisible by 16 or not, equal to 1):
# the document rows and the segment width vary with every request's lengths, so they are not specialised on, and one
# compile serves every request (it happens as the model loads, with the pinned prefixes). Specialised, a new machine's
# first requests each compiled another variant: 1.9-2.7 s on an H100, against 70 ms for a new shape's capture.
@triton.jit(do_not_specialize=["doc_rows", "width"])
def _cascade_kernel(
    Q,  # [R, H, D] this forward's queries
    KB,  # [C, Hkv, D] key buffer: each document's range holds its cached prefix; its new rows' keys go after it
    VB,
    KR,  # [R, Hkv, D] this forward's keys: the documents' rows, then the packed rows'
    VR,
    OUT,  # [R, H, D]
    BLOCKS,  # int64 [programs, 8]: each program's rows (see kernel_blocks)
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
    entry = BLOCKS + tl.program_id(0) * 8
    kvh = tl.program_id(1)
    first = tl.load(entry).to(tl.int32)  # the block's first row of the forward
    real = tl.load(entry + 1).to(tl.int32)
    stored_rows = tl.load(entry + 2).to(tl.int32)
    doc_first = tl.load(entry + 3).to(tl.int32)  # its document's new rows in this forward: [doc_first, + t)
    t = tl.load(entry + 4).to(tl.int32)
    key_start = tl.load(entry + 5).to(tl.int32)  # its range of the buffer: the cached prefix [key_start, + p)
    p = tl.load(entry + 6).to(tl.int32)
    packed_block = tl.load(entry + 7) != 0
    m = tl.arange(0, TOKENS * GROUP_ROWS)
    token = m // GROUP_ROWS
    head_ok = m % GROUP_ROWS < GROUPS
    head = kvh * GROUPS + m % GROUP_ROWS
    d = tl.arange(0, DIM)
    d_ok = d < HEAD_DIM
    n = tl.arange(0, BLOCK_N)
    row = first + token
    row_ok = (token < real) & head_ok
    stored = (token < stored_rows) & head_ok  # padding rows get zeros
    live = real > 0  # the block has a real row
    zero = real * 0
    if packed_block:  # packed rows: the prefix, the whole document, then the rows of their own question
        packed = row - doc_rows
        place = tl.load(ROW_SLOT + packed, mask=token < real, other=0).to(tl.int32)
        segment = place // width
        last_key = p + t - 1 + zero * row
        all_see = tl.where(live, p + t, zero)  # the whole sequence: the cached prefix and the document
        any_see = all_see
        # ancestors come first: the block's own keys start at its first row's question, end at its last row
        first_packed = first - doc_rows
        own_start = first_packed - tl.load(ROW_SLOT + first_packed, mask=live, other=0).to(tl.int32) % width
        own_end = tl.where(live, first_packed + real, own_start)
    else:  # document rows: row i of its document sees the cached prefix and the document's [0, i]
        local = first - doc_first
        last_key = p + local + token
        all_see = tl.where(live, p + local + 1, zero)  # keys [0, all_see) of the sequence: every row sees them
        any_see = tl.where(live, p + local + real, zero)
        own_start, own_end, segment, place = zero, zero, token, token
        # this block's keys and values go to its document's range of the buffer, after the cached prefix
        written = tl.arange(0, TOKENS)
        at = (written < real)[:, None] & d_ok[None, :]
        key_source = (first + written)[:, None] * stride_kr + kvh * stride_kh + d[None, :]
        value_source = (first + written)[:, None] * stride_vr + kvh * stride_vh + d[None, :]
        target = (key_start + p + local + written)[:, None] * stride_bc + kvh * stride_bh + d[None, :]
        tl.store(KB + target, tl.load(KR + key_source, mask=at), mask=at)
        tl.store(VB + target, tl.load(VR + value_source, mask=at), mask=at)
    q = tl.load(
        Q + row[:, None] * stride_qr + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    acc = tl.zeros((TOKENS * GROUP_ROWS, DIM), dtype=tl.float32)
    m_i = tl.full((TOKENS * GROUP_ROWS,), -1.0e30, dtype=tl.float32)  # finite: rows that see nothing stay 0
    l_i = tl.zeros((TOKENS * GROUP_ROWS,), dtype=tl.float32)
    acc, m_i, l_i = _attend_keys(  # the cached prefix from the buffer, then the document from this forward's rows
        acc, m_i, l_i, q, KB + key_start * stride_bc, VB + key_start * stride_bc, KR + doc_first * stride_kr,
        VR + doc_first * stride_vr, p, stride_bc, stride_bh, stride_kr, stride_kh, stride_vr, stride_vh, kvh, all_see,
        any_see, last_key, row_ok, d, d_ok, n, scale_log2, HEAD_DIM == DIM, PRECISION, BLOCK_N,
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
    blocks: torch.Tensor,
    row_slot: torch.Tensor,
    own_mask: torch.Tensor,
    doc_rows: int,
    scale: float,
) -> torch.Tensor:
    """Attention of every row of a static forward, in one launch; `StaticPlan`'s layout (see `attention`).

    q: [R, H, D] (the first `doc_rows` rows are document rows, the rest packed rows); k/v: [R, Hkv, D] this
    forward's keys and values; kbuf/vbuf: [C, Hkv, D], each document's range holding its cached prefix: its
    new rows' keys and values are written after it; blocks: int64 [programs, 8], `kernel_blocks.block_table`
    for `kernel_blocks.block_tokens(H / Hkv)` tokens per block; row_slot: int64 [N] each real packed row's
    question g and place s as g·S + s (questions are runs of consecutive rows); own_mask: bool [G, S, S] place
    i of question g sees place j. Returns out [R, H, D]: padding rows are 0.
    """
    heads, head_dim = q.shape[1:]
    kv_heads = kbuf.shape[1]
    groups = heads // kv_heads
    for x in (q, k, v, kbuf, vbuf):
        assert x.stride(-1) == 1, "the head dimension must be contiguous"
    assert kbuf.stride() == vbuf.stride()
    assert blocks.dim() == 2 and blocks.shape[1] == kernel_blocks.FIELDS and blocks.is_contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # every row is written (padding rows: 0)
    _cascade_kernel[(blocks.shape[0], kv_heads)](
        q, kbuf, vbuf, k, v, out, blocks, row_slot, own_mask,
        *q.stride()[:2], *kbuf.stride()[:2], *k.stride()[:2], *v.stride()[:2], *out.stride()[:2],
        doc_rows, own_mask.shape[-1], scale * LOG2E,
        HEAD_DIM=head_dim, DIM=triton.next_power_of_2(head_dim), GROUPS=groups,
        GROUP_ROWS=kernel_blocks.group_rows(groups), TOKENS=kernel_blocks.block_tokens(groups),
        BLOCK_N=KEY_BLOCK, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return out
