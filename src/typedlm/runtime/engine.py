"""The engine: token ids in, answer-group probability mass out. Never handles strings.

    engine = Engine(model, EngineOptions())
    cache, length = engine.prefill(system_ids)                    # the model body only, no LM head
    masses, prefix = engine.run(document_ids, items, base)        # every question of a request

At load the engine reads the model's shape through `hf` (the adapter over transformers' internals), resolves
its feature switches once (`features.prepare`: cascade attention, fused kernels, CUDA graphs, the attention
kernel) and picks one forward strategy (`forwards`): two forwards (sliding windows), one eager forward, or one
static forward replayed as a CUDA graph. Only read rows go through the LM head, in float32 (`head`).

`launch_many` queues a forward without waiting for it (on a GPU; eager strategies finish first), so the host
can prepare the next forward meanwhile. The engine's forwards may be called from more than one thread (a
server launches on one and finishes answers on another): each forward's launch holds the engine's lock, with
the model's device made current (CUDA streams, events and Triton kernels follow the current device, so a model
on cuda:1 would otherwise launch on cuda:0's stream).

Memory grows as O(P + Q·S): the prefix keys/values exist once, never copied per question. Caches are
per request and never rewound, so no question can see another's tokens.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from typedlm.core.errors import ModelError
from typedlm.core.options import EngineOptions
from typedlm.runtime import hf
from typedlm.runtime.budget import ForwardBudget
from typedlm.runtime.features import Features, prepare
from typedlm.runtime.forwards import (
    EagerBody,
    Forward,
    InFlight,
    Masses,
    OneForward,
    StaticForward,
    TwoForwards,
    Work,
    snapshot,
)
from typedlm.runtime.graphs import StaticRunner
from typedlm.runtime.head import LMHead
from typedlm.runtime.kv import PrefixKV
from typedlm.runtime.packing import PackedItem


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """`device` made the current CUDA device for the block (nothing on other devices)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class Engine:
    """Reads answer-group masses from a Hugging Face causal LM; `options` say which features to use (see
    `typedlm.core.options`), `features` what holds after they were resolved for this model and device."""

    def __init__(self, model: torch.nn.Module, options: EngineOptions | None = None):
        self.model = model
        self.shape = hf.ModelShape.of(model)
        unknown = hf.check_layer_types(self.shape)
        if unknown:
            raise ModelError(f"unsupported attention layer types {unknown}")
        body, head = hf.decoder_and_head(model)
        self.head = LMHead(head, self.shape.softcap)
        self.device = self.head.device
        with on_device(self.device):  # the probes and captures below run kernels and make streams
            self._build(model, body, options or EngineOptions())

    def _build(self, model: torch.nn.Module, body: torch.nn.Module, options: EngineOptions) -> None:
        self.features: Features = prepare(model, options, self.shape)
        self.budget = ForwardBudget.of(model, self.shape, self.features.cascade)  # a forward's memory, estimated
        eager = EagerBody(body, self.shape, self.features.cascade, hf.takes_additive_masks(model), self.head)
        self.eager = eager
        self.lock = threading.RLock()  # one forward's launch at a time: the runner's buffers are shared
        self.forward: Forward
        if self.features.static:
            runner = StaticRunner(
                body,
                self.head.logprobs,
                self.shape.no_masks(),
                self.shape,
                capture=self.features.capture,
                attention_kernel=self.features.attention_kernel,
            )
            self.forward = StaticForward(runner)
        elif self.features.one_forward:
            self.forward = OneForward(eager)
        else:
            self.forward = TwoForwards(eager)

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters for monitoring: the CUDA graphs' (`cuda_graphs`: captures, held) where forwards are replayed."""
        runner = getattr(self.forward, "runner", None)
        return {"cuda_graphs": runner.stats()} if runner is not None and runner.capture else {}

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """One forward's launch: the engine's lock held, its device current."""
        with self.lock, on_device(self.device):
            yield

    @property
    def max_positions(self) -> int | None:
        return self.shape.max_positions

    def prefill(self, ids: Sequence[int] | np.ndarray, base: PrefixKV | None = None):
        """Run the body over `ids` after `base`; returns the cache and its length. No LM head."""
        with self._turn():
            return self.eager.prefill(ids, base)

    def score_suffixes(self, kv_cache, prefix_len: int, items: Sequence[PackedItem]) -> list[list[float]]:
        """Every item's group masses from ONE forward over a cache of exactly `prefix_len` tokens (see `forwards`)."""
        with self._turn():
            return self.eager.score_suffixes(kv_cache, prefix_len, items)

    @staticmethod
    def snapshot(kv_cache, length: int) -> PrefixKV:
        """The cache's first `length` tokens as an immutable prefix (views: nothing is copied)."""
        return snapshot(kv_cache, length)

    def run(
        self,
        ids: Sequence[int] | np.ndarray,
        items: Sequence[PackedItem],
        base: PrefixKV | None = None,
        keep_prefix: bool = True,
    ) -> tuple[list[list[float]], PrefixKV | None]:
        """The document's new tokens `ids` after `base`, and every question: (masses per item, the new prefix).

        The returned prefix holds the keys/values of `base` and `ids`; without `keep_prefix` it is None.
        """
        with self._turn():
            return self.forward.run(ids, items, base, keep_prefix)

    def run_many(self, documents: Sequence[Work], keep_prefix: bool = True) -> list[tuple[Masses, PrefixKV | None]]:
        """`run` for several documents, each (new tokens, items, base): in ONE forward with static shapes (no
        document or question sees another's tokens), else one forward each. Results in the documents' order."""
        return self.launch_many(documents, keep_prefix).results()

    def launch_many(self, documents: Sequence[Work], keep_prefix: bool = True, features: bool = False) -> InFlight:
        """`run_many`, returned as soon as its forward is queued (see `forwards.InFlight`): each document's new
        prefix at once, the masses from `wait()`; with `features`, each item's hidden state at its decision row
        (exactly what the LM head read there) from `features()`. Only a static forward on a GPU returns before it
        is done."""
        with self._turn():
            return self.forward.launch_many(documents, keep_prefix, features)
