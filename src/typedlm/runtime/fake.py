"""A deterministic fake language model behind the engine's interface (`interface.EngineLike`): token ids in,
answer-group masses out, by a rule that can be checked by hand. For tests whose subject is not the model (the
decider's bookkeeping, calibration, the server, jobs, replicas, feedback): no weights and no forward.

    loaded = fake_model(tokenizer)                # FakeLM (vocabulary: the tokenizer's) read by FakeEngine
    decider = Decider(loaded, calibration="raw")  # everything else as on a real model

The rule. After a context (every token id before the read position: the prefix's, which are the system prompt's
and the document's, then the question's suffix, then the label tokens already read), the next token is v with

    p(v) = e^(c_v) / Z,    Z = (V - n) + Σ_{u seen} e^(c_u),

over a vocabulary of V = `vocab_size` ids, where c_v counts v in the context and n is the number of distinct ids
seen (each of the V - n others has e^0 = 1). A document that repeats the token of "yes" leans yes. As the real
engine reports it (`head.group_masses`): a label form's probability is the product of its tokens' conditionals,
an answer group's mass the sum over its forms, per item.

It is computed in float64 from the counts alone, nothing V long: log p(v) = c_v - log Z, with
log Z = m + log(Σ_k h_k e^(k - m) + (V - n) e^(-m)) over the histogram of the counts (h_k ids seen k times, m the
largest count: a count past 709 would overflow e^c), summed by `math.fsum`, whose result does not depend on the
order of its terms. Each question reads its own context, never another's: its answers are the same, bit for bit,
whatever else the request asks, in any order, and whether its document came from the prefix cache or not.

Around the rule, what the decider reads from an engine: a prefix (`FakePrefix`) is the token ids it holds,
PREFIX_TOKEN_BYTES each; the memory budget is the real `ForwardBudget`'s formula at FORWARD_TOKEN_BYTES per token
(and its count of the questions' masks, no attention's); the features are an eager engine's, one document per
forward (no batching); `max_positions` is the model's setting. A read's "hidden state" at its decision row
(`launch_many(..., features=True)`) is the histogram of its context's ids modulo HIDDEN_SIZE, as shares: a
function of what the question read, as the real one is, so a readout can be learned from it.
"""

from __future__ import annotations

import math
from collections import ChainMap, Counter
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from typedlm.core.options import EngineOptions
from typedlm.runtime.budget import ForwardBudget
from typedlm.runtime.features import Features
from typedlm.runtime.forwards import InFlight, Masses, Work
from typedlm.runtime.models import LoadedModel
from typedlm.runtime.packing import PackedItem
from typedlm.text.labels import TokenSeq

FAKE_NAME = "fake-lm"  # what responses report as the model, unless told
MAX_POSITIONS = 32768  # the fake model's context, unless told
PREFIX_TOKEN_BYTES = 8  # what a prefix holds per token (its id), for the prefix cache's budget
FORWARD_TOKEN_BYTES = 4096  # what a forward is taken to hold per token, for the memory limit...
KV_TOKEN_BYTES = 1024  # ...of which keys and values (the rest: activations)
HIDDEN_SIZE = 64  # the fake model's "hidden state" (see the module)


@dataclass(frozen=True)
class FakeConfig:
    """The fake model's settings, as a model's config: what its fingerprint hashes."""

    vocab_size: int
    max_positions: int
    model_type: str = "typedlm-fake"

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class FakeLM(torch.nn.Module):
    """The fake model: its settings (`config`) and one parameter, so that it is described, fingerprinted and moved
    like a model. The rule itself is `FakeEngine`'s."""

    def __init__(self, vocab_size: int, max_positions: int = MAX_POSITIONS):
        super().__init__()
        assert vocab_size > 0 and max_positions > 0, "a vocabulary and a context of at least one token"
        self.config = FakeConfig(vocab_size, max_positions)
        self.scale = torch.nn.Parameter(torch.tensor([float(vocab_size)]), requires_grad=False)


def fake_model(
    tokenizer, name: str = FAKE_NAME, *, vocab_size: int | None = None, max_positions: int = MAX_POSITIONS
) -> LoadedModel:
    """The fake model with a real tokenizer, ready for `Decider`: its vocabulary is the tokenizer's (`len`),
    unless told."""
    model = FakeLM(vocab_size or len(tokenizer), max_positions)
    return LoadedModel(model, tokenizer, name, engine_class=FakeEngine)


@dataclass(frozen=True)
class FakePrefix:
    """A prefix of the fake model: the token ids it holds (`kv.PrefixKV`'s stand-in, see `interface.Prefix`)."""

    ids: tuple[int, ...]

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return PREFIX_TOKEN_BYTES * len(self.ids)

    def held_bytes(self) -> int:
        return self.nbytes

    def truncated(self, n: int) -> FakePrefix:
        assert 0 <= n <= self.length, f"cannot keep {n} of {self.length} tokens"
        return FakePrefix(self.ids[:n])

    def compact(self) -> FakePrefix:
        return self


class Counts:
    """A context's token counts (id -> count) and their histogram (count -> how many ids have it), from which
    `logprob` reads the rule. `extended` makes a longer context's without copying the counts (a layer over them)."""

    def __init__(self, vocab_size: int, counts: MutableMapping[int, int], histogram: dict[int, int], seen: int):
        self.vocab_size, self.counts, self.histogram, self.seen = vocab_size, counts, histogram, seen
        self._log_z: float | None = None

    @classmethod
    def of(cls, vocab_size: int, ids: Sequence[int]) -> Counts:
        counts = Counter(ids)
        assert all(0 <= v < vocab_size for v in counts), f"token ids must be in [0, {vocab_size})"
        return cls(vocab_size, counts, dict(Counter(counts.values())), len(counts))

    def extended(self, ids: Sequence[int]) -> Counts:
        """The counts after `ids` are read too."""
        counts, histogram, seen = ChainMap({}, self.counts), dict(self.histogram), self.seen
        for v in ids:
            assert 0 <= v < self.vocab_size, f"token id {v} is not in [0, {self.vocab_size})"
            c = counts.get(v, 0)
            if c:
                histogram[c] -= 1
                if not histogram[c]:
                    del histogram[c]
            else:
                seen += 1
            counts[v] = c + 1
            histogram[c + 1] = histogram.get(c + 1, 0) + 1
        return Counts(self.vocab_size, counts, histogram, seen)

    @property
    def log_z(self) -> float:
        """log Z = log((V - n) + Σ_{u seen} e^(c_u)), shifted by the largest count."""
        if self._log_z is None:
            m = max(self.histogram, default=0)
            terms = [h * math.exp(k - m) for k, h in self.histogram.items()]
            self._log_z = m + math.log(math.fsum([*terms, (self.vocab_size - self.seen) * math.exp(-m)]))
        return self._log_z

    def logprob(self, v: int) -> float:
        """log p(v) after this context."""
        assert 0 <= v < self.vocab_size, f"token id {v} is not in [0, {self.vocab_size})"
        return self.counts.get(v, 0) - self.log_z


def form_logprob(context: Counts, form: TokenSeq) -> float:
    """log P(form | context): its tokens' conditionals, each after the ones before it, summed."""
    total = 0.0
    for token in form:
        total += context.logprob(token)
        context = context.extended((token,))
    return total


def item_masses(context: Counts, item: PackedItem) -> list[float]:
    """The mass of each answer group of one question read after `context`: its suffix, then each label form."""
    after = context.extended(item.suffix_ids)
    return [math.fsum(math.exp(form_logprob(after, form)) for form in forms) for forms in item.labels.groups]


def _ints(ids: Sequence[int] | np.ndarray) -> tuple[int, ...]:
    return tuple(np.asarray(ids, dtype=np.int64).tolist())


class FakeEngine:
    """The fake model's engine: `engine.Engine`'s interface (`interface.EngineLike`), answering by the rule of
    the module docstring. `options` are accepted and ignored: there is nothing to switch."""

    def __init__(self, model: FakeLM, options: EngineOptions | None = None):
        assert isinstance(model, FakeLM), "the fake engine reads only the fake model"
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.device = torch.device("cpu")
        self.features = Features(
            self.device,
            cascade=True,
            one_forward=True,
            static=False,
            capture=False,
            attention_kernel=False,
            fusion=None,
        )
        self.budget = ForwardBudget(
            kv_token=KV_TOKEN_BYTES, row=FORWARD_TOKEN_BYTES - KV_TOKEN_BYTES, own_row=0, mask_entry=0, full_masks=0
        )

    @property
    def max_positions(self) -> int | None:
        return self.model.config.max_positions

    def stats(self) -> dict[str, dict[str, int]]:
        return {}

    def masses(self, context: Sequence[int], items: Sequence[PackedItem]) -> Masses:
        """Every item's group masses after the prefix `context` (each item reads its own context)."""
        shared = Counts.of(self.vocab_size, context)
        return [item_masses(shared, item) for item in items]

    def prefill(self, ids: Sequence[int] | np.ndarray, base: FakePrefix | None = None) -> tuple[FakePrefix, int]:
        """`ids` after `base`: (the prefix of both, its length)."""
        prefix = FakePrefix((*(base.ids if base else ()), *_ints(ids)))
        return prefix, prefix.length

    @staticmethod
    def snapshot(cache: FakePrefix, length: int) -> FakePrefix:
        return cache.truncated(length)

    def score_suffixes(self, cache: FakePrefix, prefix_len: int, items: Sequence[PackedItem]) -> Masses:
        assert cache.length == prefix_len, "the cache must hold exactly the prefix"
        return self.masses(cache.ids, items)

    def run(
        self,
        ids: Sequence[int] | np.ndarray,
        items: Sequence[PackedItem],
        base: FakePrefix | None = None,
        keep_prefix: bool = True,
    ) -> tuple[Masses, FakePrefix | None]:
        prefix, _ = self.prefill(ids, base)
        return self.masses(prefix.ids, items), prefix if keep_prefix else None

    def run_many(self, documents: Sequence[Work], keep_prefix: bool = True) -> list[tuple[Masses, FakePrefix | None]]:
        return self.launch_many(documents, keep_prefix).results()

    def launch_many(self, documents: Sequence[Work], keep_prefix: bool = True, features: bool = False) -> InFlight:
        """One document at a time, done before it returns (as the real engine's eager forwards)."""
        results = [self.run(ids, items, base, keep_prefix) for ids, items, base in documents]

        def rows() -> list[np.ndarray]:
            contexts = [self.prefill(ids, base)[0].ids for ids, _, base in documents]
            return [
                np.stack([hidden(context, item) for item in items]) if items else np.zeros((0, HIDDEN_SIZE), np.float32)
                for context, (_, items, _) in zip(contexts, documents)
            ]

        return InFlight(
            [prefix for _, prefix in results], lambda: [masses for masses, _ in results], rows if features else None
        )


def hidden(context: Sequence[int], item: PackedItem) -> np.ndarray:
    """A read's fake hidden state at its decision row [HIDDEN_SIZE]: its context's ids (the prefix's, its suffix's)
    modulo HIDDEN_SIZE, as shares (float32)."""
    ids = np.asarray([*context, *item.suffix_ids], dtype=np.int64) % HIDDEN_SIZE
    return (np.bincount(ids, minlength=HIDDEN_SIZE) / max(len(ids), 1)).astype(np.float32)
