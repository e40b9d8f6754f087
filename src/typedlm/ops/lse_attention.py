"""Softmax attention that also returns its log-sum-exp, so that parts over disjoint key sets merge exactly: the
building blocks of the cascade (`typedlm.ops.attention`). Plain torch, no model.

Contract:
- `attend_with_lse` runs the fastest kernel that takes the shape (CPU flash; on CUDA flash, or memory-efficient
  where there is a mask) and falls back to `plain_attention`, the float32 reference; grouped keys and values
  (Hkv < H) serve H / Hkv query heads each, in order. The log-sum-exp comes back in float32.
- `attend_ranges` attends each range of queries over its range of a key buffer, the ranges' lengths on the device
  (one range per document of a forward).
- `merge(out_a, lse_a, out_b, lse_b)` is attention over the union of the two key sets.
- `additive(mask, dtype)` is a boolean mask as the additive one the fused kernels take.
"""

from __future__ import annotations

import torch


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets, from each set's output and log-sum-exp."""
    # out: [..., L, D], lse: [..., L] float32. Set a's share of the softmax mass is
    # e^lse_a / (e^lse_a + e^lse_b) = sigmoid(lse_a - lse_b): two kernels and a lerp, in the outputs' dtype
    share_a = torch.sigmoid(lse_a - lse_b).to(out_a.dtype)[..., None]
    return torch.lerp(out_b, out_a, share_a)


def _expand_kv(kv: torch.Tensor, heads: int) -> torch.Tensor:
    # kv: [B, Hkv, K, D] -> [B, H, K, D]
    groups = heads // kv.shape[1]
    if groups == 1:
        return kv
    b, hkv, k, d = kv.shape
    return kv[:, :, None].expand(b, hkv, groups, k, d).reshape(b, heads, k, d)


def attend_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention and its log-sum-exp. q: [B, H, L, D], k/v: [B, H|Hkv, K, D], mask: [B, 1|H, L, K] bool.

    Grouped keys and values (Hkv < H) serve H / Hkv query heads each, in order. `bias`, if given, is
    `additive(mask, q.dtype)` made once by the caller (a forward's layers share it).
    Returns out [B, H, L, D] and lse [B, H, L] (float32).
    """
    if mask is not None and bias is None:
        bias = additive(mask, q.dtype)
    if q.device.type == "cpu":
        # the CPU flash kernel takes an additive mask of the query's dtype; blockwise, so a long question's
        # own part (one segment of thousands of rows) never materialises its [L, K] scores
        try:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, causal, attn_mask=bias, scale=scale
            )
            return out, lse.float()
        except (RuntimeError, TypeError):  # an older kernel without masks or groups: the plain computation below
            pass
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    if q.device.type == "cuda":
        try:
            if mask is None and q.dtype in (torch.float16, torch.bfloat16):
                out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[
                    :2
                ]
            else:  # the memory-efficient kernel takes an additive mask, broadcast over heads
                if bias is not None:
                    bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
                out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, bias, True, 0.0, causal, scale=scale
                )[:2]
            return out, lse[..., : q.shape[-2]].float()
        except RuntimeError:  # a shape or dtype these kernels do not take: the plain computation below
            pass
    return plain_attention(q, k, v, scale, causal, mask)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility mask as the additive one the fused kernels take: 0 where visible, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def plain_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`attend_with_lse` computed in float32 without a fused kernel (the reference, and the fallback)."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # [B, H, L, K]
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, L]
    out = torch.exp(scores - lse[..., None]) @ v.float()
    return out.to(q.dtype), lse


def attend_ranges(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    scale: float,
    causal: bool = False,
    longest: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each range of queries over its range of keys: queries [cu_q[i], cu_q[i + 1]) see keys
    [cu_k[i], cu_k[i + 1]) (one range per document of a forward); lengths live on the device.

    q: [L, H, D], k/v: [C, Hkv, D] (grouped heads kept grouped); causal aligns each range's last query with its
    last key (query i of a range sees its keys j <= i + keys - queries). Returns out [L, H, D] and lse [L, H]
    (float32); rows from `cu_q[-1]` on, and rows of a range without keys, are undefined. `longest`: the most
    queries and keys of one range (the kernel's grid is sized by them; default: every row, every key).
    """
    rows, heads = q.shape[0], q.shape[1]
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        max_q, max_k = longest or (rows, k.shape[0])
        out, lse = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale
        )[:2]
        return out, (lse.transpose(0, 1) if lse.shape[0] == heads else lse[0].transpose(0, 1)).float()
    keys = torch.arange(k.shape[0], device=q.device)  # [C]
    row = torch.arange(rows, device=q.device)  # [L]
    ranges = torch.searchsorted(cu_q[1:].contiguous(), row, right=True).clamp(max=len(cu_q) - 2)  # [L]
    k_lo, k_hi = cu_k[ranges][:, None], cu_k[ranges + 1][:, None]  # [L, 1]
    visible = (keys[None] >= k_lo) & (keys[None] < k_hi)  # [L, C]
    if causal:
        visible = visible & (keys[None] <= row[:, None] + k_hi - cu_q[ranges + 1][:, None])
    groups = heads // k.shape[1]
    used = visible.any(dim=0)  # [C]: keys outside every range may hold anything, even NaN
    v = torch.where(used[:, None, None], v.float(), 0.0)
    k, v = k.float().repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # [C, H, D]
    scores = torch.einsum("lhd,khd->hlk", q.float(), k) * scale  # [H, L, C]
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [H, L]
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # a row without keys: zeros, not NaN
    out = torch.einsum("hlk,khd->lhd", weights, v)
    return out.to(q.dtype), lse.transpose(0, 1)
