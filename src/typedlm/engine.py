"""The engine: token ids in, answer-group probability mass out. Never handles strings.

Phases:
- `prefill(ids, base)`: run the model *body* (no LM head) over prefix tokens on top of a cached base
  prefix (the system prompt, built once at load), leaving the keys/values in a cache;
- `score(cache, items)`: all questions' suffixes and label trees packed in ONE sequence over that
  cache, each row seeing the prefix and its own ancestors, with per-row positions (see `packing`);
  only the read rows go through the LM head, in float32;
- `run(ids, items, base)`: both in ONE forward (the document rows first, then the packed rows) under
  cascade attention (see `attention`); prefill then score where the model needs masks (sliding windows).
  On CUDA that forward runs with static shapes as a replayed CUDA graph (see `graphs`).

Memory grows as O(P + Q·S): the prefix keys/values exist once, never copied per question. Caches are
per request and never rewound, so no question can see another's tokens.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from typedlm.attention import IMPLEMENTATION as CASCADE
from typedlm.attention import CascadePlan
from typedlm.errors import ModelError
from typedlm.graphs import StaticRunner
from typedlm.kernels import FusionReport, fuse, liger_ops
from typedlm.packing import PackedBatch, PackedItem, pack

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")
HEAD_CHUNK_ROWS = 16384  # vocabulary rows of the LM head converted to float32 at a time


@dataclass(frozen=True)
class PrefixKV:
    """A prefix's keys and values, per layer [1, H_kv, T, D]. Shared and never mutated."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    length: int

    def truncated(self, n: int) -> PrefixKV:
        assert 0 <= n <= self.length, f"cannot keep {n} of {self.length} tokens"
        return PrefixKV(tuple((k[:, :, :n], v[:, :, :n]) for k, v in self.layers), n)


class Engine:
    """Reads answer probabilities from a Hugging Face causal LM.

    With `cascade` (the default for SDPA models) attention runs as a cascade (see `attention`): the shared
    prefix and each question's own rows apart, merged exactly. Otherwise one masked attention per layer.
    With `static` (default: on CUDA, where the model allows one fused forward) `run` pads its forward to
    bucketed shapes and replays it as a CUDA graph; `static=True` on a CPU runs that path eagerly.
    With `fused_kernels` (default: on CUDA, where liger-kernel is installed) the layers' norms, SwiGLU
    products and rotary embeddings run as fused kernels, each checked against the model's own (see `kernels`).
    With `attention_kernel` (default: on CUDA for 16-bit models where Triton is installed and the kernel
    agrees with plain attention on a probe of the model's shapes, unless `fused_kernels=False`) the static
    forward's attention runs as one Triton launch per layer (see `cascade_kernel`); on a CPU it runs in
    Triton's interpreter (tests).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cascade: bool = True,
        static: bool | None = None,
        fused_kernels: bool | None = None,
        attention_kernel: bool | None = None,
    ):
        self.model = model
        self.cascade = cascade and model.config._attn_implementation in ("sdpa", CASCADE)
        if self.cascade:
            model.set_attn_implementation(CASCADE)
        self.body = model.get_decoder()
        head = model.get_output_embeddings()
        if head is None:
            raise ModelError("the model has no LM head to read answers from")
        self.device = head.weight.device
        self.fusion: FusionReport | None = None
        ops = liger_ops() if fused_kernels is not False and self.device.type == "cuda" else None
        if ops is not None:
            self.fusion = fuse(model, ops)
        self.head_weight = head.weight.detach()  # [V, D], applied in float32 chunk by chunk (no fp32 copy kept)
        self.head_bias = None if head.bias is None else head.bias.detach().to(torch.float32)
        config = model.config.get_text_config()
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.layer_types = getattr(config, "layer_types", None)
        unknown = set(self.layer_types or ()) - set(SUPPORTED_LAYER_TYPES)
        if unknown:
            raise ModelError(f"unsupported attention layer types {sorted(unknown)}")
        self.sliding_window = getattr(config, "sliding_window", None)
        self.additive_mask = model.config._attn_implementation == "eager"
        self.max_positions = getattr(config, "max_position_embeddings", None)
        # Document and questions in one forward needs the cascade on every layer (no sliding windows).
        self.fused = self.cascade and "sliding_attention" not in (self.layer_types or ())
        # transformers renamed past_key_values= to cache= (5.2x); use whichever this version takes.
        params = inspect.signature(self.body.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.no_masks = {kind: None for kind in self.layer_types} if self.layer_types else None
        if static is None:
            static = self.device.type == "cuda"
        if attention_kernel is None and fused_kernels is False:
            attention_kernel = False  # otherwise None: the runner decides (see StaticRunner)
        self.runner = (
            StaticRunner(
                self.body,
                self._log_softmax_head,
                self.no_masks,
                capture=self.device.type == "cuda",
                attention_kernel=attention_kernel,
            )
            if static and self.fused
            else None
        )

    def _cache_from(self, base: PrefixKV | None) -> DynamicCache:
        cache = DynamicCache()  # no config: every layer keeps all its keys, sliding layers included
        for layer, (k, v) in enumerate(base.layers if base else ()):
            cache.update(k, v, layer)
        return cache

    @staticmethod
    def snapshot(cache: DynamicCache, length: int) -> PrefixKV:
        """The cache's first `length` tokens as an immutable prefix (views: nothing is copied)."""
        assert all(layer.keys.shape[-2] >= length for layer in cache.layers), "the cache is shorter than that"
        return PrefixKV(
            tuple((layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in cache.layers), length
        )

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int] | np.ndarray, base: PrefixKV | None = None) -> tuple[DynamicCache, int]:
        """Run the body over `ids` after `base`; returns the cache and its length. No LM head."""
        cache = self._cache_from(base)
        start = base.length if base else 0
        if len(ids):
            # input_ids, position_ids: [1, T]
            input_ids = torch.tensor(np.asarray(ids, dtype=np.int64), device=self.device)[None]  # a copy
            position_ids = torch.arange(start, start + len(ids), device=self.device)[None]
            extra = {"typedlm_plan": CascadePlan.causal(start, len(ids))} if self.cascade else {}
            self.body(
                input_ids=input_ids, position_ids=position_ids, use_cache=True, **{self.cache_kwarg: cache}, **extra
            )
        return cache, start + len(ids)

    def _plan(self, batch: PackedBatch, cached_len: int, state_rows: int = 0) -> CascadePlan:
        """The cascade's plan: `cached_len` keys already cached, `state_rows` document rows, then the packed rows."""
        index, valid = batch.segment_index()
        own_mask = torch.tensor(batch.segment_visibility(), device=self.device)  # copies: the batch's are shared
        to_device = lambda a: torch.tensor(a, device=self.device)  # noqa: E731
        return CascadePlan(cached_len, state_rows, to_device(index), to_device(valid), own_mask)

    def _masks(self, batch: PackedBatch):
        """Masks for layers that do not run the cascade (all of them without it; sliding-window layers with it)."""
        dtype = next(self.body.parameters()).dtype

        def fmt(mask: torch.Tensor) -> torch.Tensor:
            mask = mask.to(self.device)
            if not self.additive_mask:
                return mask
            return torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill(~mask, torch.finfo(dtype).min)

        full = None if self.cascade else fmt(batch.attention_mask())
        if not self.layer_types:
            return full
        masks = {"full_attention": full}
        if "sliding_attention" in self.layer_types:
            masks["sliding_attention"] = fmt(batch.attention_mask(self.sliding_window))
        return masks

    @torch.inference_mode()
    def score(self, cache: DynamicCache, prefix_len: int, items: Sequence[PackedItem]) -> list[list[float]]:
        """Total probability mass of each answer group of each item, from ONE forward over the packed items.

        The cache must hold exactly `prefix_len` tokens; it is extended by the packed rows and should
        not be reused afterwards.
        """
        assert cache.get_seq_length() == prefix_len, "the cache must hold exactly the prefix"
        batch = pack(prefix_len, items)
        # input_ids, position_ids: [1, N]
        input_ids = torch.from_numpy(batch.input_ids).to(self.device)[None]
        position_ids = torch.from_numpy(batch.position_ids).to(self.device)[None]
        extra = {"typedlm_plan": self._plan(batch, prefix_len)} if self.cascade else {}
        out = self.body(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self._masks(batch),
            use_cache=True,
            **{self.cache_kwarg: cache},
            **extra,
        )
        return self._read(batch, out.last_hidden_state[0])

    @torch.inference_mode()
    def run(
        self,
        ids: Sequence[int] | np.ndarray,
        items: Sequence[PackedItem],
        base: PrefixKV | None = None,
        keep_prefix: bool = True,
    ) -> tuple[list[list[float]], PrefixKV | None]:
        """The document's new tokens `ids` after `base`, and every question: (masses per item, the new prefix).

        One forward where the model allows it (cascade attention, no sliding-window layers): the document
        rows first, then the packed rows, which see the whole document. Otherwise `prefill`, then `score`.
        The returned prefix holds the keys/values of `base` and `ids`; without `keep_prefix` it is None.
        """
        if self.runner is not None:
            start = base.length if base else 0
            batch = pack(start + len(ids), items)
            steps, layers, length = self.runner.run(ids, batch, base, keep=keep_prefix)
            prefix = None
            if keep_prefix:
                prefix = PrefixKV(layers, length) if len(ids) or base is None else base
                self.runner.remember(prefix)
            return self._masses(batch, steps), prefix
        if not self.fused:
            cache, prefix_len = self.prefill(ids, base)
            masses = self.score(cache, prefix_len, items)
            return masses, self.snapshot(cache, prefix_len) if keep_prefix else None
        cache = self._cache_from(base)
        start = base.length if base else 0
        prefix_len = start + len(ids)
        batch = pack(prefix_len, items)
        plan = self._plan(batch, start, len(ids))
        # input_ids, position_ids: [1, T + N]
        input_ids = torch.from_numpy(np.concatenate([np.asarray(ids, dtype=np.int64), batch.input_ids]))[None]
        input_ids = input_ids.to(self.device)
        positions = [*range(start, prefix_len), *batch.position_ids.tolist()]
        position_ids = torch.tensor([positions], device=self.device)
        out = self.body(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self.no_masks,
            use_cache=True,
            typedlm_plan=plan,
            **{self.cache_kwarg: cache},
        )
        masses = self._read(batch, out.last_hidden_state[0, len(ids) :])
        return masses, self.snapshot(cache, prefix_len) if keep_prefix else None

    def _read(self, batch: PackedBatch, hidden: torch.Tensor) -> list[list[float]]:
        """Group masses per item from the packed rows' hidden states [N, D]: only read rows meet the head."""
        hidden = hidden[torch.tensor(batch.read_rows, device=self.device)]  # [R, D]
        logprobs = self._log_softmax_head(hidden)  # [R, V]
        rows, tokens = (torch.tensor(a, device=self.device) for a in (batch.step_read, batch.step_token))
        return self._masses(batch, logprobs[rows, tokens].cpu())

    @staticmethod
    def _masses(batch: PackedBatch, steps: torch.Tensor) -> list[list[float]]:
        """Group masses per item from each label step's log-probability [K] (on the CPU)."""
        weights = steps.numpy().astype(np.float64)
        form_logp = np.bincount(batch.step_form, weights, minlength=len(batch.form_group))  # [F]
        group_mass = np.bincount(batch.form_group, np.exp(form_logp), minlength=sum(batch.groups_per_item))  # [G]
        masses, ends = group_mass.tolist(), itertools.accumulate(batch.groups_per_item)
        return [masses[end - n : end] for n, end in zip(batch.groups_per_item, ends)]

    def _log_softmax_head(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [R, D] -> logits: [R, V], float32
        logits = None
        if self.head_weight.dtype == torch.float32:
            logits = hidden.to(torch.float32) @ self.head_weight.T
        elif hidden.is_cuda and hidden.dtype == self.head_weight.dtype:  # accumulated and written in float32
            with contextlib.suppress(RuntimeError, TypeError):  # an older torch without out_dtype: chunks below
                logits = torch.mm(hidden, self.head_weight.T, out_dtype=torch.float32)
        if logits is None:  # in float32 chunk by chunk: a float32 copy of the head outweighs the model (Qwen3: 622 MB)
            hidden = hidden.to(torch.float32)
            logits = torch.empty(hidden.shape[0], self.head_weight.shape[0], dtype=torch.float32, device=hidden.device)
            for start in range(0, self.head_weight.shape[0], HEAD_CHUNK_ROWS):
                chunk = self.head_weight[start : start + HEAD_CHUNK_ROWS].to(torch.float32)  # [C, D]
                torch.mm(hidden, chunk.T, out=logits[:, start : start + chunk.shape[0]])
        if self.head_bias is not None:
            logits = logits + self.head_bias
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return torch.log_softmax(logits, dim=-1)
