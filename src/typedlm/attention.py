"""Cascade attention: every packed row attends to the shared prefix and to its own question, computed apart.

The packed pass gives each row two kinds of keys: the shared prefix (P keys, visible to every row) and the
rows of its own question (a chain plus a small label tree). One masked attention over P + N keys spends
most of its work on the N×N block, where a row sees only its own question's ~S keys, and needs a mask,
which costs the fast kernels. The cascade splits it:

    prefix part:  all N queries × the P prefix keys, no mask     → out_p, lse_p   (a fast kernel)
    own part:     per question, its S queries × its S keys, small mask (or causal) → out_o, lse_o
    merge:        lse = logaddexp(lse_p, lse_o);  out = out_p·e^(lse_p−lse) + out_o·e^(lse_o−lse)

which is exactly softmax attention over the union of the two key sets. A row's numbers no longer depend on
where other questions sit in the packed sequence. Prefill uses the same split: the cached prefix, then the
new tokens causally.

It is registered as the attention implementation "typedlm_cascade"; a forward without a `typedlm_plan`
keyword, and sliding-window layers, fall through to transformers' SDPA with the masks they were given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

IMPLEMENTATION = "typedlm_cascade"


@dataclass(frozen=True)
class CascadePlan:
    """How the keys of one forward split: a shared prefix, then segments of new rows.

    `index` [G, S] lists each segment's packed rows (padded with 0 where `valid` [G, S] is False);
    `own_mask` [G, S, S] says which of its own rows a row sees; None means causal (prefill).
    """

    prefix_len: int
    index: torch.Tensor
    valid: torch.Tensor
    own_mask: torch.Tensor | None

    @classmethod
    def causal(cls, prefix_len: int, rows: int, device: torch.device | str) -> CascadePlan:
        index = torch.arange(rows, device=device)[None]  # [1, T]
        return cls(prefix_len, index, torch.ones_like(index, dtype=torch.bool), None)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention and its log-sum-exp. q: [B, H, L, D], k/v: [B, H, K, D], mask: [B, 1|H, L, K] bool.

    Returns out [B, H, L, D] and lse [B, H, L] (float32).
    """
    if mask is None and q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse.float()
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # [B, H, L, K]
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, L]
    out = torch.exp(scores - lse[..., None]) @ v.float()
    return out.to(q.dtype), lse


def cascade_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    typedlm_plan: CascadePlan | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query: [1, H, N, D]; key/value: [1, Hkv, P + N, D] (the cache already holds the new rows)."""
    if typedlm_plan is None or sliding_window is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    plan = typedlm_plan
    heads, rows, dim = query.shape[1], query.shape[2], query.shape[3]
    scale = scaling if scaling is not None else dim**-0.5
    p = plan.prefix_len
    assert key.shape[0] == 1 and key.shape[2] == p + rows, "the cache must hold the prefix and these rows"
    key, value = _expand_kv(key, heads), _expand_kv(value, heads)
    # own part: each segment's queries over its own keys, segments as a batch
    own_q = query[0][:, plan.index].transpose(0, 1)  # [G, H, S, D]
    own_k = key[0, :, p:][:, plan.index].transpose(0, 1)  # [G, H, S, D]
    own_v = value[0, :, p:][:, plan.index].transpose(0, 1)
    own_mask = None if plan.own_mask is None else plan.own_mask[:, None]  # [G, 1, S, S]
    out_o, lse_o = attend_with_lse(own_q, own_k, own_v, scale, causal=own_mask is None, mask=own_mask)
    # back to packed rows: out [H, N, D], lse [H, N]
    flat = plan.index[plan.valid]  # [N]
    out = torch.empty(heads, rows, dim, dtype=torch.float32, device=query.device)
    lse = torch.empty(heads, rows, dtype=torch.float32, device=query.device)
    out[:, flat] = out_o.transpose(0, 1)[:, plan.valid].float()
    lse[:, flat] = lse_o.transpose(0, 1)[:, plan.valid]
    if p:
        # prefix part: every row over the shared prefix, no mask
        out_p, lse_p = attend_with_lse(query, key[:, :, :p], value[:, :, :p], scale)
        total = torch.logaddexp(lse, lse_p[0])
        out = out * torch.exp(lse - total)[..., None] + out_p[0].float() * torch.exp(lse_p[0] - total)[..., None]
    return out.to(query.dtype).transpose(0, 1)[None].contiguous(), None  # [1, N, H, D]


AttentionInterface.register(IMPLEMENTATION, cascade_attention)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
