"""Whole forwards of a decoder layer or an attention, replaced by fused ones, each checked on a probe first.

`patching` swaps single operations (a norm, an MLP, the rotary function); this module swaps the forwards that
chain several of them, so that the chain runs as fewer kernels:

- a pre-norm decoder layer's residual adds run fused with the norms that read their sums
  (`fuse_residual_norms`; the last add of a layer hands its normed rows to the next layer's input norm). The
  model's last layer, given a plan with `out_rows` (the rows the forward reads), finishes only those rows after
  its attention: no other row's output is read, and every row's keys and values are written by then;
- an attention that norms each head of its queries and keys and then rotates them (Qwen3's `q_norm` and
  `k_norm`) runs the two norms and the rotary embedding as one kernel (`fuse_norm_rope`), reading each head's
  row once where it lies in the joined q/k/v product and writing it once.

`swap_forwards` swaps a fused forward into every module it applies to, checked once per module class: the
attentions' here, `patching`'s norms and MLPs (the residual fusion, which rewires the next norm too, checks per
class the same way). A replaced forward computes what the module's own computes: it runs beside it on random
inputs of the model's shapes first, and is kept only where they agree (`ops.fused.agrees`). A call the fused forward was
not built for (a key/value cache, positional arguments of another order, training, a tensor on another
device, an attention implementation other than SDPA or the cascade) runs the module's own forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from typedlm.ops.fused import FusedOps, agrees
from typedlm.runtime import hf

PROBE_ROWS = 8  # rows of the random inputs a candidate is checked on
WRAPPED = "_typedlm_fused"  # marks a forward or rotary function already swapped (its value: the ops' name)


def probe(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Random inputs of `shape` in `like`'s dtype and on its device (the same on every call)."""
    generator = torch.Generator(device=like.device).manual_seed(0)
    return torch.randn(shape, generator=generator, device=like.device).to(like.dtype)


def probe_rotary(dim: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary cos and sin [1, PROBE_ROWS, dim] of random angles (each half the same, as rotary embeddings are)."""
    angles = probe((1, PROBE_ROWS, dim // 2), like).float()
    cos, sin = (f(torch.cat((angles, angles), dim=-1)).to(like.dtype) for f in (torch.cos, torch.sin))
    return cos, sin


def _class_agrees(
    verdict: dict, module: torch.nn.Module, ops: FusedOps, check: Callable, kept: list[str], note: str
) -> bool:
    """Whether `module`'s class passes `check(module, ops)`, run on its first instance only (`verdict` keeps the
    answers); a class that fails is noted once in `kept`."""
    kind = type(module)
    if kind not in verdict:
        verdict[kind] = check(module, ops)
        if not verdict[kind]:
            kept.append(note)
    return verdict[kind]


def swap_forwards(
    model: torch.nn.Module,
    ops: FusedOps,
    applies: Callable[[torch.nn.Module], bool],
    check: Callable[[torch.nn.Module, FusedOps], bool],
    fused_forward: Callable[[torch.nn.Module, Callable, FusedOps], Callable],
    note: Callable[[type], str] = lambda kind: kind.__name__,
) -> tuple[int, list[str]]:
    """Swap the forward of every module `applies` to whose class `check` passes (on its first instance).

    Returns how many modules run `ops` now (those an earlier `fuse` swapped are neither checked nor wrapped
    again), and `note(class)` for each class kept as it was."""
    verdict: dict[type, bool] = {}
    swapped, kept = 0, []
    for module in model.modules():
        if not applies(module):
            continue
        if getattr(module.forward, WRAPPED, None) == ops.name:
            swapped += 1
            continue
        if _class_agrees(verdict, module, ops, check, kept, note(type(module))):
            forward = fused_forward(module, module.forward, ops)
            setattr(forward, WRAPPED, ops.name)
            module.forward = forward
            swapped += 1
    return swapped, kept


class _ResidualHandoff:
    """A decoder layer's last residual add, fused with the norm that reads the sum next (the next layer's input
    norm, or the final norm): the layer returns the sum and leaves the normed rows here, and that norm's call on
    that very tensor takes them. A norm called on any other tensor computes its own."""

    def __init__(self):
        self.total: torch.Tensor | None = None
        self.normed: torch.Tensor | None = None

    def give(self, total: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        self.total, self.normed = total, normed
        return total

    def take(self, x: torch.Tensor) -> torch.Tensor | None:
        if x is not self.total:
            return None
        normed, self.total, self.normed = self.normed, None, None
        return normed


class _ProbeAttention(torch.nn.Module):
    """Stands in for a layer's attention while the layer's forward is checked: a fixed map of its input."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
        return hidden_states.flip(-1) * 0.5, None


def _residual_forward(
    layer: torch.nn.Module,
    original: Callable,
    ops: FusedOps,
    handoff: _ResidualHandoff,
    next_norm,
    last: bool = False,
) -> Callable:
    """A pre-norm decoder layer (x + attention(norm(x)), then + mlp(norm(·))) with both residual adds fused
    with the norms that read them: the attention's with the post-attention norm, the MLP's with `next_norm`.

    The model's `last` layer, under a plan with `out_rows`, returns those rows alone [1, len(out_rows), D]."""
    post = hf.layer_norms(layer)[1]
    post_eps = hf.norm_eps(post)
    next_eps = hf.norm_eps(next_norm) if next_norm is not None else None

    def forward(hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or not ops.runs_on(hidden_states):  # positional arguments: the layer's own order, its own forward
            return original(hidden_states, *args, **kwargs)
        input_norm = hf.layer_norms(layer)[0]
        attention, *_ = hf.layer_attention(layer)(hidden_states=input_norm(hidden_states), **kwargs)
        out_rows = getattr(kwargs.get(hf.PLAN_KEYWORD), "out_rows", None) if last else None
        if out_rows is not None:  # the rows read after this layer: the others' MLP would be thrown away
            attention, hidden_states = attention[:, out_rows], hidden_states[:, out_rows]
        residual, normed = ops.add_rms_norm(attention, hidden_states, post.weight, post_eps)
        out = hf.layer_mlp(layer)(normed)
        if next_norm is None:
            return residual + out
        return handoff.give(*ops.add_rms_norm(out, residual, next_norm.weight, next_eps))

    return forward


def _handoff_norm_forward(norm: torch.nn.Module, handoff: _ResidualHandoff) -> Callable:
    own = norm.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        normed = handoff.take(x)
        return normed if normed is not None else own(x)

    return forward


def _residual_layer_agrees(layer: torch.nn.Module, ops: FusedOps) -> bool:
    """The fused forward equals the layer's own with a stand-in attention, and hands the next norm its rows."""
    norm, post = hf.layer_norms(layer)  # the input norm: any fused norm serves as the next one
    with hf.attention_replaced(layer, _ProbeAttention()):
        x = probe((1, PROBE_ROWS, post.weight.shape[0]), post.weight)
        want = layer.forward(x)
        if not isinstance(want, torch.Tensor):  # a layer returning a tuple (older transformers) keeps its own
            return False
        handoff = _ResidualHandoff()
        alone = _residual_forward(layer, layer.forward, ops, handoff, None)(x)
        handed = _residual_forward(layer, layer.forward, ops, handoff, norm)(x)
        taken = handoff.take(handed)
        return agrees(alone, want) and agrees(handed, want) and taken is not None and agrees(taken, norm(want))


def fuse_residual_norms(model: torch.nn.Module, ops: FusedOps) -> tuple[int, list[str]]:
    """Fuse every pre-norm decoder layer's residual adds with the norms that read their sums (checked per layer
    class with a stand-in attention). Needs the layers' norms fused already (their kernels agreed).

    Returns how many layers run fused now, and the layer classes kept as they were (their fused forward
    disagreed)."""
    fused, kept = 0, []
    if ops.add_rms_norm is None:
        return fused, kept
    for layers, final in hf.decoders(model):
        handoff, verdict = _ResidualHandoff(), {}
        for i, layer in enumerate(layers):
            if getattr(layer.forward, WRAPPED, None) == ops.name:
                fused += 1  # fused by an earlier `fuse`
                continue
            next_norm = hf.layer_norms(layers[i + 1])[0] if i + 1 < len(layers) else final
            norms = [*hf.layer_norms(layer), next_norm]
            if not hf.is_decoder_layer(layer) or not all(
                getattr(n, "forward", None) is not None and getattr(n.forward, WRAPPED, None) == ops.name for n in norms
            ):
                continue
            note = f"{type(layer).__name__} residual adds"
            if not _class_agrees(verdict, layer, ops, _residual_layer_agrees, kept, note):
                continue
            last = i + 1 == len(layers)
            layer.forward = _residual_forward(layer, layer.forward, ops, handoff, next_norm, last)
            setattr(layer.forward, WRAPPED, ops.name)
            next_norm.forward = _handoff_norm_forward(next_norm, handoff)
            setattr(next_norm.forward, WRAPPED, ops.name)
            fused += 1
    return fused, kept


def _norm_rope_attention(
    attention: torch.nn.Module,
    parts: hf.NormedAttentionParts,
    ops: FusedOps,
    interface: Callable,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask,
    kwargs: dict,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention's own steps (`parts` are its own), with its q and k norms and the rotary embedding as
    `ops.norm_rope`."""
    input_shape = hidden_states.shape[:-1]  # [B, L]
    hidden_shape = (*input_shape, -1, parts.head_dim)
    q = parts.q(hidden_states).view(hidden_shape)  # [B, L, H, D]; k and v from the same joined product
    k = parts.k(hidden_states).view(hidden_shape)  # [B, L, Hkv, D]
    v = parts.v(hidden_states).view(hidden_shape).transpose(1, 2)  # [B, Hkv, L, D]
    cos, sin = position_embeddings  # [B, L, D]
    eps = hf.norm_eps(parts.query_norm)
    q, k = ops.norm_rope(q, k, parts.query_norm.weight, parts.key_norm.weight, eps, cos, sin)  # [B, H|Hkv, L, D]
    out, weights = hf.call_attention_function(interface, attention, q, k, v, attention_mask, kwargs)
    return parts.o(out.reshape(*input_shape, -1).contiguous()), weights


def _norm_rope_forward(attention: torch.nn.Module, original: Callable, ops: FusedOps) -> Callable:
    parts = hf.normed_attention_parts(attention)

    def forward(hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
        interface = hf.attention_function(attention)
        cached = any(kwargs.get(name) is not None for name in hf.CACHE_KEYWORDS)
        if (
            args
            or cached
            or interface is None
            or position_embeddings is None
            or attention.training
            or not ops.runs_on(hidden_states)
        ):
            return original(hidden_states, position_embeddings, attention_mask, *args, **kwargs)
        rest = {name: value for name, value in kwargs.items() if name not in hf.CACHE_KEYWORDS}
        return _norm_rope_attention(
            attention, parts, ops, interface, hidden_states, position_embeddings, attention_mask, rest
        )

    return forward


def _norm_rope_applies(attention: torch.nn.Module, ops: FusedOps) -> bool:
    """An attention with per-head q and k norms whose fused kernels agreed, one epsilon, a full rotary."""
    parts = hf.normed_attention_parts(attention)
    if parts is None:
        return False
    norms = (parts.query_norm, parts.key_norm)
    dim = parts.head_dim
    return (
        all(getattr(n.forward, WRAPPED, None) == ops.name for n in norms)  # the model's norms are plain RMSNorms
        and all(getattr(n, "weight", None) is not None and n.weight.shape == (dim,) for n in norms)
        and hf.norm_eps(parts.query_norm) == hf.norm_eps(parts.key_norm)
    )


def _norm_rope_agrees(attention: torch.nn.Module, ops: FusedOps) -> bool:
    """The fused forward equals the module's own on a probe (no mask: both attend causally through SDPA)."""
    interface = hf.attention_function(attention)
    if interface is None:
        return False
    parts = hf.normed_attention_parts(attention)
    like = parts.q.weight
    x = probe((1, PROBE_ROWS, parts.q.in_features), like)
    cos, sin = probe_rotary(parts.head_dim, like)
    want = attention.forward(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None)[0]
    got = _norm_rope_attention(attention, parts, ops, interface, x, (cos, sin), None, {})[0]
    return agrees(got, want)


def fuse_norm_rope(model: torch.nn.Module, ops: FusedOps) -> tuple[int, list[str]]:
    """Run every attention's q and k norms and its rotary embedding as `ops.norm_rope` (checked per attention
    class on a probe). Needs the q/k norms fused already (their kernel agreed).

    Returns how many attentions run fused now, and the classes kept as they were (their fused forward
    disagreed)."""
    if ops.norm_rope is None:
        return 0, []
    return swap_forwards(
        model, ops, lambda module: _norm_rope_applies(module, ops), _norm_rope_agrees, _norm_rope_forward,
        note=lambda kind: f"{kind.__name__} q/k norms and rotary apart",
    )  # fmt: skip
