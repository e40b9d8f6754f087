"""The one adapter over transformers' internals: every touch of them outside model loading lives here.

- `ModelShape.of(model)`: the config fields typedlm reads (head counts, head size, layers, layer types, sliding
  window, context length, logit softcap), each read once, with the fallbacks configs need;
- `use_cascade(model)`: registers typedlm's cascade attention (`typedlm.ops.attention.cascade`) as an attention
  implementation and switches an SDPA model to it; a forward without a plan, and sliding-window layers, fall
  through to transformers' SDPA;
- `decoder_and_head(model)`: the model body (no LM head) and the head;
- `new_cache`, `cache_layers`, `cache_length`: transformers' `DynamicCache` built from and read back as plain
  per-layer (keys, values) tensors;
- `run_body(body, ...)`: calls the body with the cache under whichever keyword this transformers takes
  (`past_key_values=`, renamed `cache=` in 5.2x) and the cascade's plan as `typedlm_plan`;
- `attention_function(attention)`: the attention function an attention module's config selects (the cascade or
  SDPA), for a fused attention forward to call as the module's own does;
- `rotary_function(model)` / `set_rotary_function(model, fn)`: the family's module-level
  `apply_rotary_pos_emb`, which `patching` wraps;
- a model's parts under transformers' names, for `patching` and `layer_forwards`: a norm's epsilon
  (`norm_eps`, `is_rms_norm`), a gated MLP's projections (`is_gated_mlp`, `gated_mlp`), an attention's
  (`qkv_projections`, `normed_attention_parts`, `call_attention_function`), a decoder layer's
  (`is_decoder_layer`, `layer_norms`, `layer_attention`, `layer_mlp`, `attention_replaced`) and a decoder's
  layers with its final norm (`decoders`).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from typedlm.ops.attention import CascadePlan, StaticPlan, cascade

CASCADE = "typedlm_cascade"  # the attention implementation's registered name
PLAN_KEYWORD = "typedlm_plan"  # how a forward hands its cascade plan down to every attention call
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")
CACHE_KEYWORDS = ("cache", "past_key_values")  # what an attention's key/value cache argument is called (5.2x, 5.17)
ROTARY_FUNCTION = "apply_rotary_pos_emb"  # the module-level rotary function of a family's modeling file

Layers = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer (keys, values) [1, Hkv, T, D]


@dataclass(frozen=True)
class ModelShape:
    """The config fields typedlm reads, from the text config of a (possibly multimodal) model."""

    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    layer_types: tuple[str, ...] | None
    sliding_window: int | None
    max_positions: int | None
    softcap: float | None
    hidden: int = 0  # the residual stream's width
    intermediate: int = 0  # the MLP's inner width

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        config = model.config.get_text_config()
        heads = config.num_attention_heads
        layer_types = getattr(config, "layer_types", None)
        return cls(
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            layers=config.num_hidden_layers,
            layer_types=tuple(layer_types) if layer_types else None,
            sliding_window=getattr(config, "sliding_window", None),
            max_positions=getattr(config, "max_position_embeddings", None),
            softcap=getattr(config, "final_logit_softcapping", None),
            hidden=config.hidden_size,
            intermediate=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
        )

    @property
    def has_sliding_layers(self) -> bool:
        return "sliding_attention" in (self.layer_types or ())

    def no_masks(self) -> dict[str, None] | None:
        """What a forward passes as `attention_mask` when the cascade needs none (per layer type where typed)."""
        return {kind: None for kind in self.layer_types} if self.layer_types else None


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    typedlm_plan: CascadePlan | StaticPlan | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface around `cascade`: SDPA where there is no plan or a sliding window."""
    if typedlm_plan is None or sliding_window is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return cascade(module.layer_idx, query, key, value, typedlm_plan, scaling), None


@cache
def _register() -> None:
    AttentionInterface.register(CASCADE, _attention)
    AttentionMaskInterface.register(CASCADE, sdpa_mask)


def attention_implementation(model: torch.nn.Module) -> str:
    return model.config._attn_implementation


def attention_function(attention: torch.nn.Module) -> Callable | None:
    """The attention function an attention module's config selects, called as transformers' attention modules
    call it, for the cascade and SDPA; None for any other implementation."""
    return {CASCADE: _attention, "sdpa": sdpa_attention_forward}.get(attention.config._attn_implementation)


def use_cascade(model: torch.nn.Module) -> bool:
    """Switch an SDPA model (or one already switched) to the cascade; False for any other implementation."""
    if attention_implementation(model) not in ("sdpa", CASCADE):
        return False
    _register()
    model.set_attn_implementation(CASCADE)
    return True


def takes_additive_masks(model: torch.nn.Module) -> bool:
    """Eager attention adds its mask to the scores; the others take boolean masks."""
    return attention_implementation(model) == "eager"


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    return model.get_decoder(), model.get_output_embeddings()


def check_layer_types(shape: ModelShape) -> list[str]:
    """The model's attention layer types that typedlm does not know (none: it can serve the model)."""
    return sorted(set(shape.layer_types or ()) - set(SUPPORTED_LAYER_TYPES))


def new_cache(base: Layers = ()) -> DynamicCache:
    """A cache holding `base`; no config, so every layer keeps all its keys (sliding layers included)."""
    kv_cache = DynamicCache()
    for layer, (k, v) in enumerate(base):
        kv_cache.update(k, v, layer)
    return kv_cache


def cache_layers(kv_cache: DynamicCache, length: int) -> Layers:
    """The cache's first `length` tokens per layer, as views (nothing copied)."""
    assert all(layer.keys.shape[-2] >= length for layer in kv_cache.layers), "the cache is shorter than that"
    return tuple((layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in kv_cache.layers)


def cache_length(kv_cache: DynamicCache) -> int:
    return kv_cache.get_seq_length()


def rewind(kv_cache: DynamicCache, tokens: int) -> int:
    """Drop the cache's last `tokens` tokens (a negative crop works on transformers 5.17 and 5.2x); returns the
    length left, which the caller should check: a cache that cannot be trimmed keeps its tokens."""
    kv_cache.crop(-tokens)
    return kv_cache.get_seq_length()


@cache
def _cache_keyword(forward: Callable) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def run_body(
    body: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    kv_cache: DynamicCache | None = None,
    plan: CascadePlan | StaticPlan | None = None,
    attention_mask=None,
) -> torch.Tensor:
    """The body's last hidden states [1, T, D] for `input_ids` [1, T]: with a cache it is extended, without one
    nothing is kept; `plan` reaches every attention call."""
    kwargs = {PLAN_KEYWORD: plan} if plan is not None else {}
    if kv_cache is not None:
        kwargs[_cache_keyword(type(body).forward)] = kv_cache
    out = body(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        use_cache=kv_cache is not None,
        **kwargs,
    )
    return out.last_hidden_state


def _modeling_module(model: torch.nn.Module):
    """The Python module of the model's attention class: where its family's `apply_rotary_pos_emb` lives."""
    attention = next((m for m in model.modules() if hasattr(m, "q_proj") and hasattr(m, "k_proj")), None)
    return sys.modules.get(type(attention).__module__) if attention is not None else None


def rotary_function(model: torch.nn.Module) -> Callable | None:
    """The family's `apply_rotary_pos_emb(q, k, cos, sin, ...)` (None where the family has none)."""
    return getattr(_modeling_module(model), ROTARY_FUNCTION, None)


def set_rotary_function(model: torch.nn.Module, function: Callable) -> None:
    """Replace the family's `apply_rotary_pos_emb`: every model of the family in this process calls `function`."""
    setattr(_modeling_module(model), ROTARY_FUNCTION, function)


# --------------------------------------------------------------------------- a model's parts, by transformers' names
#
# transformers' decoders of the Llama family (Qwen, Llama, Gemma, ...) name their parts alike: a decoder's
# `layers` and final `norm`; a layer's `self_attn`, `mlp`, `input_layernorm` and `post_attention_layernorm`; an
# attention's `q_proj`, `k_proj`, `v_proj` and `o_proj` (Qwen3's also `q_norm` and `k_norm`, per head); a gated
# MLP's `gate_proj`, `up_proj` and `down_proj`; a norm's `variance_epsilon` (or `eps`). Each is read when asked
# for, so a part swapped in is what the caller gets.

QKV_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
GATED_MLP_PARTS = ("gate_proj", "up_proj", "down_proj")
DECODER_LAYER_PARTS = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
NORMED_ATTENTION_PARTS = (*QKV_PROJECTIONS, "o_proj", "q_norm", "k_norm")


def norm_eps(norm: torch.nn.Module) -> float | None:
    """A norm module's epsilon, under either name transformers' norms keep it."""
    return getattr(norm, "variance_epsilon", getattr(norm, "eps", None))


def is_rms_norm(module: torch.nn.Module) -> bool:
    """An RMSNorm of transformers' (its class named so) with an epsilon and one weight per channel."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and norm_eps(module) is not None
        and weight is not None
        and weight.dim() == 1
    )


def is_gated_mlp(module: torch.nn.Module) -> bool:
    return all(hasattr(module, name) for name in GATED_MLP_PARTS)


def gated_mlp(mlp: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """A gated MLP's (gate, up, down) projections: down(act(gate(x)) * up(x))."""
    return mlp.gate_proj, mlp.up_proj, mlp.down_proj


def qkv_projections(attention: torch.nn.Module) -> tuple[torch.nn.Module | None, ...]:
    """An attention's q, k and v projections, in that order (None for one it lacks)."""
    return tuple(getattr(attention, name, None) for name in QKV_PROJECTIONS)


class NormedAttentionParts(NamedTuple):
    """An attention that norms each head of its queries and keys before the rotary (Qwen3's), by its parts."""

    q: torch.nn.Module
    k: torch.nn.Module
    v: torch.nn.Module
    o: torch.nn.Module
    query_norm: torch.nn.Module  # per head
    key_norm: torch.nn.Module
    head_dim: int | None


def normed_attention_parts(attention: torch.nn.Module) -> NormedAttentionParts | None:
    """The attention's projections, q/k norms and head size; None where it lacks one of them, or its `scaling`."""
    if not all(hasattr(attention, name) for name in NORMED_ATTENTION_PARTS) or not hasattr(attention, "scaling"):
        return None
    return NormedAttentionParts(
        attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, attention.q_norm, attention.k_norm,
        getattr(attention, "head_dim", None),
    )  # fmt: skip


def call_attention_function(
    function: Callable,
    attention: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    kwargs: dict,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`function` (see `attention_function`) called as the attention module's own forward calls it: no dropout,
    the module's scaling and sliding window."""
    return function(
        attention, query, key, value, attention_mask, dropout=0.0, scaling=attention.scaling,
        sliding_window=getattr(attention, "sliding_window", None), **kwargs,
    )  # fmt: skip


def is_decoder_layer(layer: torch.nn.Module) -> bool:
    """A pre-norm decoder layer: x + attention(input norm(x)), then + mlp(post-attention norm(·))."""
    return all(hasattr(layer, name) for name in DECODER_LAYER_PARTS)


def layer_norms(layer: torch.nn.Module) -> tuple[torch.nn.Module | None, torch.nn.Module | None]:
    """A decoder layer's (input norm, post-attention norm), None for one it lacks."""
    return getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)


def layer_attention(layer: torch.nn.Module) -> torch.nn.Module:
    return layer.self_attn


def layer_mlp(layer: torch.nn.Module) -> torch.nn.Module:
    return layer.mlp


@contextmanager
def attention_replaced(layer: torch.nn.Module, stand_in: torch.nn.Module) -> Iterator[None]:
    """The decoder layer with `stand_in` as its attention, its own put back after."""
    attention = layer.self_attn
    layer.self_attn = stand_in
    try:
        yield
    finally:
        layer.self_attn = attention


def decoders(model: torch.nn.Module) -> Iterator[tuple[torch.nn.ModuleList, torch.nn.Module]]:
    """The model's decoders as (their layers, their final norm): each module with a list of `layers` and a `norm`."""
    for module in model.modules():
        layers, final = getattr(module, "layers", None), getattr(module, "norm", None)
        if isinstance(layers, torch.nn.ModuleList) and final is not None:
            yield layers, final
