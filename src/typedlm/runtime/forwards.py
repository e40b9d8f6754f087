"""The forward strategies: how a request's document and questions run through the model. One interface,
`run(ids, items, base, keep_prefix) -> (masses per item, the new prefix or None)`; the engine picks one at load.

- `TwoForwards`: the document's new tokens (`prefill`), then every question packed in a second forward over
  that cache (`score`). For models whose layers cannot all run the cascade (sliding windows, non-SDPA
  attention), with explicit masks there;
- `OneForward`: the document rows first, then the packed rows, in ONE eager forward under cascade attention;
- `StaticForward`: that one forward with bucketed static shapes, replayed as a CUDA graph on CUDA (`graphs`).

`EagerBody` is what the eager strategies share: the body run with transformers' cache, the cascade's plans,
and the masks for layers that do not run the cascade. All of them read only the read rows through the head, and
`launch_many(..., features=True)` also returns each item's hidden state at its decision row (`head.decision_rows`),
from the same forward; without it nothing of the hidden states is kept or copied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from typedlm.ops.attention import CascadePlan, OwnSegments
from typedlm.runtime import hf
from typedlm.runtime.graphs import StaticRunner
from typedlm.runtime.head import LMHead, group_masses
from typedlm.runtime.kv import PrefixKV
from typedlm.runtime.packing import PackedBatch, PackedItem, pack, pack_documents
from typedlm.runtime.static_inputs import Document

Ids = Sequence[int] | np.ndarray


Work = tuple[Ids, Sequence[PackedItem], PrefixKV | None]  # one document: its new tokens, questions, cached prefix
Masses = list[list[float]]  # one document's: the mass of every answer group, per item
Read = tuple[Masses, PrefixKV | None, np.ndarray | None]  # one document's masses, new prefix and features


@dataclass(frozen=True)
class InFlight:
    """Documents' forward launched (`launch_many`): each document's new prefix (or None) at once, its masses
    once the forward is done (`wait`, called once) and, where the launch asked for them, its items' decision rows'
    hidden states [items, D] (`features`, called after `wait`)."""

    prefixes: list[PrefixKV | None]
    wait: Callable[[], list[Masses]]
    features: Callable[[], list[np.ndarray]] | None = None

    def results(self) -> list[tuple[Masses, PrefixKV | None]]:
        return list(zip(self.wait(), self.prefixes, strict=True))


class Forward(Protocol):
    def run(
        self, ids: Ids, items: Sequence[PackedItem], base: PrefixKV | None, keep_prefix: bool
    ) -> tuple[list[list[float]], PrefixKV | None]:
        """The document's new tokens `ids` after `base`, and every question: (masses per item, the new prefix).

        The new prefix holds the keys/values of `base` and `ids`; without `keep_prefix` it is None.
        """
        ...

    def run_many(self, documents: Sequence[Work], keep_prefix: bool) -> list[tuple[Masses, PrefixKV | None]]:
        """`run` for each of several documents (in one forward where the strategy can)."""
        ...

    def launch_many(self, documents: Sequence[Work], keep_prefix: bool, features: bool = False) -> InFlight:
        """`run_many` without waiting where the strategy can (the static forward on a GPU): the host is free
        while the device works; with `features`, the items' decision rows too (`InFlight.features`)."""
        ...


class OneAtATime:
    """`run_many` as one `read` per document: for the eager strategies (they finish before they return)."""

    def read(self, ids: Ids, items: Sequence[PackedItem], base, keep_prefix: bool, features: bool) -> Read:
        raise NotImplementedError

    def run(self, ids, items, base, keep_prefix):
        masses, prefix, _ = self.read(ids, items, base, keep_prefix, False)
        return masses, prefix

    def run_many(self, documents, keep_prefix):
        return [self.run(ids, items, base, keep_prefix) for ids, items, base in documents]

    def launch_many(self, documents, keep_prefix, features=False):
        results = [self.read(ids, items, base, keep_prefix, features) for ids, items, base in documents]
        return InFlight(
            [prefix for _, prefix, _ in results],
            lambda: [masses for masses, _, _ in results],
            (lambda: [rows for _, _, rows in results]) if features else None,
        )


def snapshot(kv_cache, length: int) -> PrefixKV:
    """The cache's first `length` tokens as an immutable prefix (views: nothing is copied)."""
    return PrefixKV(hf.cache_layers(kv_cache, length), length)


class EagerBody:
    """The model body run eagerly over transformers' cache (see `hf`), with the cascade's plans where it runs."""

    def __init__(self, body: torch.nn.Module, shape: hf.ModelShape, cascade: bool, additive_mask: bool, head: LMHead):
        self.body, self.shape, self.cascade, self.additive_mask, self.head = body, shape, cascade, additive_mask, head
        self.device = head.device
        self.no_masks = shape.no_masks()

    @torch.inference_mode()
    def prefill(self, ids: Ids, base: PrefixKV | None = None):
        """Run the body over `ids` after `base`; returns the cache and its length. No LM head."""
        kv_cache = hf.new_cache(base.layers if base else ())
        start = base.length if base else 0
        if len(ids):
            # input_ids, position_ids: [1, T]
            input_ids = torch.tensor(np.asarray(ids, dtype=np.int64), device=self.device)[None]  # a copy
            position_ids = torch.arange(start, start + len(ids), device=self.device)[None]
            plan = CascadePlan.causal(start, len(ids)) if self.cascade else None
            hf.run_body(self.body, input_ids, position_ids, kv_cache, plan)
        return kv_cache, start + len(ids)

    def plan(self, batch: PackedBatch, cached_len: int, state_rows: int = 0) -> CascadePlan:
        """The cascade's plan: `cached_len` keys already cached, `state_rows` document rows, then the packed rows."""
        to_device = lambda a: torch.tensor(a, device=self.device)  # noqa: E731 - copies: the batch's are shared
        own = tuple(
            OwnSegments(*map(to_device, (index, valid, visible)), chain)
            for index, valid, visible, chain in batch.segment_groups()
        )
        return CascadePlan(cached_len, state_rows, own)

    def masks(self, batch: PackedBatch):
        """Masks for layers that do not run the cascade (all of them without it; sliding-window layers with it)."""
        dtype = next(self.body.parameters()).dtype

        def fmt(mask: torch.Tensor) -> torch.Tensor:
            mask = mask.to(self.device)
            if not self.additive_mask:
                return mask
            return torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill(~mask, torch.finfo(dtype).min)

        full = None if self.cascade else fmt(batch.attention_mask())
        if not self.shape.layer_types:
            return full
        masks = {"full_attention": full}
        if self.shape.has_sliding_layers:
            masks["sliding_attention"] = fmt(batch.attention_mask(self.shape.sliding_window))
        return masks

    def score_suffixes(self, kv_cache, prefix_len: int, items: Sequence[PackedItem]) -> list[list[float]]:
        """Total probability mass of each answer group of each item, from ONE forward over the packed items.

        The cache must hold exactly `prefix_len` tokens; it is extended by the packed rows and should
        not be reused afterwards.
        """
        return self.read_suffixes(kv_cache, prefix_len, items)[0]

    @torch.inference_mode()
    def read_suffixes(
        self, kv_cache, prefix_len: int, items: Sequence[PackedItem], features: bool = False
    ) -> tuple[list[list[float]], np.ndarray | None]:
        """`score_suffixes`, and with `features` each item's decision row's hidden state [items, D]."""
        assert hf.cache_length(kv_cache) == prefix_len, "the cache must hold exactly the prefix"
        batch = pack(prefix_len, items)
        # input_ids, position_ids: [1, N]
        input_ids = torch.from_numpy(batch.input_ids).to(self.device)[None]
        position_ids = torch.from_numpy(batch.position_ids).to(self.device)[None]
        plan = self.plan(batch, prefix_len) if self.cascade else None
        hidden = hf.run_body(self.body, input_ids, position_ids, kv_cache, plan, self.masks(batch))
        return self.head.masses(batch, hidden[0], features)


class TwoForwards(OneAtATime):
    """`prefill`, then `score`: two forwards, for models whose layers cannot all run the cascade."""

    def __init__(self, eager: EagerBody):
        self.eager = eager

    @torch.inference_mode()
    def read(self, ids, items, base, keep_prefix, features):
        kv_cache, prefix_len = self.eager.prefill(ids, base)
        masses, rows = self.eager.read_suffixes(kv_cache, prefix_len, items, features)
        return masses, snapshot(kv_cache, prefix_len) if keep_prefix else None, rows


class OneForward(OneAtATime):
    """The document rows, then the packed rows (which see the whole document), in ONE eager forward."""

    def __init__(self, eager: EagerBody):
        self.eager = eager

    @torch.inference_mode()
    def read(self, ids, items, base, keep_prefix, features):
        eager = self.eager
        kv_cache = hf.new_cache(base.layers if base else ())
        start = base.length if base else 0
        prefix_len = start + len(ids)
        batch = pack(prefix_len, items)
        plan = eager.plan(batch, start, len(ids))
        # input_ids, position_ids: [1, T + N]
        input_ids = torch.from_numpy(np.concatenate([np.asarray(ids, dtype=np.int64), batch.input_ids]))[None]
        input_ids = input_ids.to(eager.device)
        positions = [*range(start, prefix_len), *batch.position_ids.tolist()]
        position_ids = torch.tensor([positions], device=eager.device)
        hidden = hf.run_body(eager.body, input_ids, position_ids, kv_cache, plan, eager.no_masks)
        masses, rows = eager.head.masses(batch, hidden[0, len(ids) :], features)
        return masses, snapshot(kv_cache, prefix_len) if keep_prefix else None, rows


class StaticForward:
    """The one forward with static shapes, replayed as a CUDA graph where `runner.capture` (see `graphs`)."""

    def __init__(self, runner: StaticRunner):
        self.runner = runner

    @torch.inference_mode()
    def run(self, ids, items, base, keep_prefix):
        return self.run_many([(ids, items, base)], keep_prefix)[0]

    @torch.inference_mode()
    def run_many(self, documents, keep_prefix):
        """Every document and its questions in ONE static forward (`graphs.StaticRunner.run_documents`)."""
        return self.launch_many(documents, keep_prefix).results()

    @torch.inference_mode()
    def launch_many(self, documents, keep_prefix, features=False):
        """`run_many`'s forward queued on the device (`graphs.StaticRunner.launch_documents`)."""
        prefix_lens = [(base.length if base else 0) + len(ids) for ids, _, base in documents]
        batch = pack_documents(prefix_lens, [items for _, items, _ in documents])
        rows = [sum(item.rows for item in items) for _, items, _ in documents]
        work = [Document(ids, base.length if base else 0, n, base) for (ids, _, base), n in zip(documents, rows)]
        launched = self.runner.launch_documents(work, batch, keep=keep_prefix, features=features)
        prefixes = []
        for d, ((ids, _, base), (layers, length, stacked)) in enumerate(zip(documents, launched.prefixes)):
            prefix = None
            if keep_prefix:
                prefix = PrefixKV(layers, length, stacked) if len(ids) or base is None else base
                if d == 0:  # the first document's keys/values stay in the buffer, from 0 on
                    self.runner.remember(prefix)
            prefixes.append(prefix)

        def wait() -> list[Masses]:
            masses, start, per_document = group_masses(batch, launched.steps()), 0, []
            for _, items, _ in documents:
                per_document.append(masses[start : start + len(items)])
                start += len(items)
            return per_document

        def rows() -> list[np.ndarray]:
            every = launched.features()  # [items, D], the documents' items one after another
            ends = np.cumsum([len(items) for _, items, _ in documents])
            return np.split(every, ends[:-1])

        return InFlight(prefixes, wait, rows if features else None)
