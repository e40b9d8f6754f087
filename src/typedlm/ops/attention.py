"""Cascade attention: every packed row attends to the shared prefix and to its own question, computed apart.

The packed pass gives each row two kinds of keys: the shared prefix (P keys, visible to every row) and the
rows of its own question (a chain plus a small label tree). One masked attention over P + N keys spends
most of its work on the N×N block, where a row sees only its own question's ~S keys, and needs a mask,
which costs the fast kernels. The cascade splits it:

    prefix part:  all N queries × the P prefix keys, no mask     → out_p, lse_p   (a fast kernel)
    own part:     per question, its S queries × its S keys, small mask (or causal) → out_o, lse_o
    merge:        lse = logaddexp(lse_p, lse_o);  out = out_p·e^(lse_p−lse) + out_o·e^(lse_o−lse)

which is exactly softmax attention over the union of the two key sets. A row's numbers no longer depend on
where other questions sit in the packed sequence. A forward may also begin with document rows (prefill):
they see the cached prefix and each other causally, and the packed rows after them see them all, so the
document and every question can run in ONE forward.

A `StaticPlan` runs the same cascade with fixed shapes, so that a whole forward can be captured once as a
CUDA graph and replayed (see `graphs`): rows are padded to buckets, the lengths that vary live in device
tensors, and the keys/values go to a preallocated buffer instead of a growing cache. With `StaticPlan.kernel`
the whole cascade of a layer runs as `cascade_kernel`'s one Triton launch instead (CUDA, 16-bit models).

`cascade(layer, query, key, value, plan, scaling)` is the entry point; `typedlm.runtime.hf` registers it with
transformers as an attention implementation (a forward without a plan, and sliding-window layers, fall through
to transformers' SDPA there). Each part is attended by `lse_attention`, which returns its log-sum-exp for the
merge. This module is plain torch: it knows no model and no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from typedlm.ops.lse_attention import attend_ranges, attend_with_lse, merge, plain_attention

# A group of segments whose leading chain (see `OwnSegments.chain`) is at least this long attends it as plain causal
# attention, and only the rows after it through the mask: a masked kernel computes every one of the [S, S] scores, a
# causal one about half, and a question with hundreds of options has a suffix of thousands of rows (255 options:
# 4,300 rows; its forward on a CPU 31.7 -> 21.1 s). Shorter chains keep the one masked call.
CHAIN_SPLIT_ROWS = 256


@dataclass(frozen=True)
class OwnSegments:
    """Segments of similar length, attended together: `index` [G, S] lists each one's packed rows (counted from the
    first packed row; padded with 0 where `valid` [G, S] is False), `mask` [G, S, S] which of its rows each sees;
    `chain`: its first rows, in every segment, each see every row before them and nothing after (the mask's
    [chain, chain] corner is lower triangular)."""

    index: torch.Tensor
    valid: torch.Tensor
    mask: torch.Tensor
    chain: int = 0


@dataclass(frozen=True)
class CascadePlan:
    """How the keys of one forward split. Rows of the forward, in order:

    - `state_rows` document rows: they see the cached prefix and, causally, each other (prefill);
    - packed rows, in segments (one per question): they see the cached prefix, every document row, and
      their own segment. The segments come in groups of similar length (`own`, see `OwnSegments`), each
      padded to its longest only: one long question among many short ones pads none of them to its length.
    """

    prefix_len: int
    state_rows: int = 0
    own: tuple[OwnSegments, ...] = ()

    @classmethod
    def causal(cls, prefix_len: int, rows: int) -> CascadePlan:
        """A plain prefill: `rows` document rows after `prefix_len` cached ones."""
        return cls(prefix_len, state_rows=rows)


@dataclass(frozen=True)
class StaticPlan:
    """The cascade with static shapes. Rows of the forward: `doc_rows` document rows (the first `cu_doc[1]` real,
    the rest padding), then packed rows (padding at the end). Every tensor is on the model's device.

    - `kv` [L, 2, C, Hkv, D]: per layer, keys and values of the cached prefix at [0, p); the document rows'
      are written at `write_slots` [doc_rows] = p, p + 1, ... during the forward;
    - `cu_doc` [2] int32 = (0, t) real document rows; `cu_keys` [2] int32 = (0, p + t) keys every row may see;
      `cu_packed` [2] int32 = (0, packed rows);
    - with several documents in one forward, each has its own range of those three ([B + 1] each): document
      b's rows [cu_doc[b], cu_doc[b + 1]) and its questions' rows [cu_packed[b], cu_packed[b + 1]) see its keys
      [cu_keys[b], cu_keys[b + 1]) of the buffer, which hold its cached prefix, then its new rows;
    - `own_rows` [G, S]: the packed row of each segment slot; `own_mask` [G, 1, groups·S, S]: slot i may see
      slot j (padding slots see themselves only), repeated for the `groups` query heads that share a key/value
      head; `own_bias` the same as `additive` in the model's dtype; `row_slot` [N]: each packed row's flat
      slot g·S + s.
    - `cu` int32 (0, t, 0, p + t, 0, packed rows, real packed rows, 0): `cu_doc`, `cu_keys`, `cu_packed` are
      its slices;
    - with `kernel`, the attention runs as `cascade_kernel` (one Triton launch per layer): `blocks` is then its
      table of rows per program (`kernel_blocks`), `own_mask` is [G, S, S], and `own_rows`, `own_bias`,
      `write_slots`, `longest` are unused.
    """

    kv: torch.Tensor
    doc_rows: int
    write_slots: torch.Tensor
    cu_doc: torch.Tensor
    cu_keys: torch.Tensor
    cu_packed: torch.Tensor
    own_rows: torch.Tensor
    own_mask: torch.Tensor
    own_bias: torch.Tensor | None
    row_slot: torch.Tensor
    cu: torch.Tensor
    kernel: bool = False
    blocks: torch.Tensor | None = None
    longest: tuple[int, int, int] | None = None  # most document rows, packed rows and keys of one document (a
    # forward not captured as a graph knows them; None: bounded by the whole forward's)
    out_rows: torch.Tensor | None = None  # the rows whose hidden states the forward reads: where given, the body
    # may return these alone, in this order (its last layer then finishes no other row)


def kernel_available() -> bool:
    """Whether `cascade_kernel` (Triton) can be imported here."""
    try:
        from typedlm.ops import cascade_kernel  # noqa: F401
    except ImportError:
        return False
    return True


# A small static forward for `kernel_agrees`: p cached keys, t of doc_rows document rows, then questions of
# (first packed row, rows) with a causal chain each, in packed_rows rows (the last ones padding).
_PROBE = dict(p=5, t=21, doc_rows=24, questions=((0, 6), (6, 8), (14, 3)), packed_rows=20, width=8)


@torch.inference_mode()
def kernel_agrees(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `cascade_kernel` runs here for these shapes and computes what `plain_attention` computes.

    Runs it on a small random forward (a cached prefix, padded document rows, three questions and padding) and
    compares every real row with plain float32 attention under the explicit mask. False where Triton cannot
    compile or launch it for this device (too little shared memory, an unsupported dtype) or it disagrees.
    """
    from typedlm.ops import cascade_kernel, kernel_blocks

    p, t, doc_rows, width, packed_rows = (_PROBE[k] for k in ("p", "t", "doc_rows", "width", "packed_rows"))
    questions = _PROBE["questions"]
    rows = doc_rows + packed_rows
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(dtype=dtype, device=device)

    q, k, v = rand(rows, heads, head_dim), rand(rows, kv_heads, head_dim), rand(rows, kv_heads, head_dim)
    kbuf, vbuf = rand(p + doc_rows, kv_heads, head_dim), rand(p + doc_rows, kv_heads, head_dim)
    own_mask = torch.eye(width, dtype=torch.bool).repeat(len(questions), 1, 1)  # [G, S, S]
    row_slot, visible = [], torch.zeros(rows, p + rows, dtype=torch.bool)  # over keys: prefix, this forward's rows
    for i in range(t):
        visible[i, : p + i + 1] = True
    for g, (start, n) in enumerate(questions):
        own_mask[g, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
        row_slot += [g * width + s for s in range(n)]
        for s in range(n):
            visible[doc_rows + start + s, : p + t] = True
            visible[doc_rows + start + s, p + doc_rows + start : p + doc_rows + start + s + 1] = True
    tokens = kernel_blocks.block_tokens(heads // kv_heads)
    table = kernel_blocks.block_table(
        [t], [p], [0], [len(row_slot)], doc_rows, packed_rows, tokens,
        kernel_blocks.capacity(doc_rows, packed_rows, 1, tokens),
    )  # fmt: skip
    scale = head_dim**-0.5
    keys, values = torch.cat([kbuf[:p], k]), torch.cat([vbuf[:p], v])  # before the kernel writes the buffer
    try:
        blocks, row_slot_t, own_mask_t = (torch.as_tensor(x).to(device) for x in (table, row_slot, own_mask))
        got = cascade_kernel.cascade_attention(q, k, v, kbuf, vbuf, blocks, row_slot_t, own_mask_t, doc_rows, scale)
    except Exception:  # any failure to compile or launch: not on this device
        return False
    groups = heads // kv_heads
    keys, values = (x.float().repeat_interleave(groups, dim=1).transpose(0, 1)[None] for x in (keys, values))
    real = visible.any(dim=1)  # rows that see something: the padding rows are 0 instead
    want, _ = plain_attention(q.float().transpose(0, 1)[None], keys, values, scale, mask=visible.to(device)[None, None])
    want = want[0].transpose(0, 1)[real.to(device)]
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    return bool((got[real.to(device)].float() - want).abs().max().item() <= tolerance)


def _own_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, own: OwnSegments, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A group of segments over their own rows (q [G, H, S, D], k/v [G, Hkv, S, D]): the leading chain causally
    without a mask where it is long (`CHAIN_SPLIT_ROWS`), the rows after it through the mask."""
    chain = own.chain
    if chain < CHAIN_SPLIT_ROWS:
        return attend_with_lse(q, k, v, scale, mask=own.mask[:, None])
    out, lse = attend_with_lse(q[:, :, :chain], k[:, :, :chain], v[:, :, :chain], scale, causal=True)
    if chain == q.shape[2]:
        return out, lse
    out_t, lse_t = attend_with_lse(q[:, :, chain:], k, v, scale, mask=own.mask[:, None, chain:])
    return torch.cat([out, out_t], dim=2), torch.cat([lse, lse_t], dim=2)


def _store(buffer: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """buffer[slots] = rows: on CUDA with Triton as one copy kernel (see `triton_ops.store_rows`)."""
    if buffer.is_cuda and kernel_available():
        from typedlm.ops.triton_ops import store_rows

        store_rows(buffer, slots, rows)
    else:
        buffer.index_copy_(0, slots, rows)


def _static_cascade(layer: int, query, key, value, plan: StaticPlan, scale: float) -> torch.Tensor:
    """query: [1, H, R, D]; key/value: [1, Hkv, R, D], this forward's rows only. Returns [1, R, H, D]."""
    kbuf, vbuf = plan.kv[layer, 0], plan.kv[layer, 1]  # [C, Hkv, D]
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [R, H|Hkv, D]
    tb, heads, dim = plan.doc_rows, q.shape[1], q.shape[2]
    if plan.kernel:  # every row in one launch, which also stores the document rows' keys and values
        from typedlm.ops import cascade_kernel

        out = cascade_kernel.cascade_attention(
            q, k, v, kbuf, vbuf, plan.blocks, plan.row_slot, plan.own_mask, tb, scale
        )
        return out[None]
    parts = []
    if tb:  # document rows: stored, then over the cached prefix and themselves, causally
        _store(kbuf, plan.write_slots, k[:tb])
        _store(vbuf, plan.write_slots, v[:tb])
        longest = (plan.longest[0], plan.longest[2]) if plan.longest else None
        out, _ = attend_ranges(
            q[:tb].contiguous(), kbuf, vbuf, plan.cu_doc, plan.cu_keys, scale, causal=True, longest=longest
        )
        parts.append(out)  # padding rows hold anything: no real row reads them, their keys lie past cu_keys
    if q.shape[0] > tb:  # packed rows: everything before them, and their own segment
        qp = q[tb:].contiguous()  # [N, H, D]
        longest = (plan.longest[1], plan.longest[2]) if plan.longest else None
        out_s, lse_s = attend_ranges(qp, kbuf, vbuf, plan.cu_packed, plan.cu_keys, scale, longest=longest)
        # own part, grouped heads kept grouped: the `groups` query heads of one key/value head become
        # `groups` blocks of rows over that head's keys (no copy of the keys per query head)
        g, s = plan.own_rows.shape
        kv_heads = k.shape[1]
        groups = heads // kv_heads
        own_q = qp[plan.own_rows].view(g, s, kv_heads, groups, dim)  # [G, S, Hkv, groups, D]
        own_q = own_q.permute(0, 2, 3, 1, 4).reshape(g, kv_heads, groups * s, dim)  # [G, Hkv, groups·S, D]
        own_k, own_v = (x[tb:][plan.own_rows].permute(0, 2, 1, 3) for x in (k, v))  # [G, Hkv, S, D]
        out_o, lse_o = attend_with_lse(own_q, own_k, own_v, scale, mask=plan.own_mask, bias=plan.own_bias)
        out_o = out_o.view(g, kv_heads, groups, s, dim).permute(0, 3, 1, 2, 4).reshape(g * s, heads, dim)
        lse_o = lse_o.view(g, kv_heads, groups, s).permute(0, 3, 1, 2).reshape(g * s, heads)
        out_o, lse_o = out_o[plan.row_slot], lse_o[plan.row_slot]  # [N, H, D], [N, H]
        parts.append(merge(out_s, lse_s, out_o.to(out_s.dtype), lse_o))
    return (parts[0] if len(parts) == 1 else torch.cat(parts))[None]


def cascade(
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: CascadePlan | StaticPlan,
    scaling: float | None = None,
) -> torch.Tensor:
    """Layer `layer`'s attention under `plan`. Dynamic plan: query [1, H, N, D], key/value [1, Hkv, P + N, D] (the
    cache already holds the new rows). Static plan: key/value hold this forward's rows only. Returns [1, N, H, D]."""
    if isinstance(plan, StaticPlan):
        return _static_cascade(layer, query, key, value, plan, scaling or query.shape[-1] ** -0.5)
    heads, rows, dim = query.shape[1], query.shape[2], query.shape[3]
    scale = scaling if scaling is not None else dim**-0.5
    p, t = plan.prefix_len, plan.state_rows
    assert key.shape[0] == 1 and key.shape[2] == p + rows, "the cache must hold the prefix and these rows"
    parts = []  # keys and values stay grouped: the kernels take them so (or expand them themselves)
    if t:  # document rows: themselves causally, then the cached prefix
        out, lse = attend_with_lse(query[:, :, :t], key[:, :, p : p + t], value[:, :, p : p + t], scale, causal=True)
        if p:
            out_p, lse_p = attend_with_lse(query[:, :, :t], key[:, :, :p], value[:, :, :p], scale)
            out = merge(out, lse, out_p, lse_p)
        parts.append(out[0])  # [H, T, D]
    if rows > t:  # packed rows: their own segment, then everything before the packed rows
        n, base = rows - t, p + t
        out = torch.empty(heads, n, dim, dtype=query.dtype, device=query.device)
        lse = torch.empty(heads, n, dtype=torch.float32, device=query.device)
        for own in plan.own:  # every packed row is in one segment of one group
            own_q = query[0, :, t:][:, own.index].transpose(0, 1)  # [G, H, S, D]
            own_k = key[0, :, base:][:, own.index].transpose(0, 1)  # [G, Hkv, S, D]
            own_v = value[0, :, base:][:, own.index].transpose(0, 1)
            out_o, lse_o = _own_attention(own_q, own_k, own_v, own, scale)
            flat = own.index[own.valid]  # [n]: segment slots back to packed rows
            out[:, flat] = out_o.transpose(0, 1)[:, own.valid].to(query.dtype)
            lse[:, flat] = lse_o.transpose(0, 1)[:, own.valid]
        if base:
            out_s, lse_s = attend_with_lse(query[:, :, t:], key[:, :, :base], value[:, :, :base], scale)
            out = merge(out, lse, out_s[0], lse_s[0])
        parts.append(out)  # [H, N, D]
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return out.transpose(0, 1)[None].contiguous()  # [1, rows, H, D]
