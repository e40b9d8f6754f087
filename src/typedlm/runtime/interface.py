"""What the decider needs from an engine, as protocols: `EngineLike` (token ids in, answer-group masses out) and
`Prefix` (what a forward starts from and the prefix cache keeps).

Two classes have this shape: `engine.Engine`, which reads a real model, and `fake.FakeEngine`, a rule on token
counts for tests whose subject is not the model. A `models.LoadedModel` names the one that reads it
(`engine_class`; None: `Engine`), so the decider builds whichever its model needs and knows no other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from typedlm.core.options import EngineOptions
    from typedlm.runtime.budget import ForwardBudget
    from typedlm.runtime.features import Features
    from typedlm.runtime.forwards import InFlight, Masses, Work
    from typedlm.runtime.packing import PackedItem


class Prefix(Protocol):
    """A prefix's state for its first `length` tokens: `kv.PrefixKV` (keys and values) or `fake.FakePrefix`
    (token ids). Shared, never mutated."""

    @property
    def length(self) -> int: ...

    @property
    def nbytes(self) -> int:
        """What it holds, in bytes: what the prefix cache counts."""
        ...

    def held_bytes(self) -> int:
        """The memory it keeps alive (a view into a larger cache keeps the whole cache)."""
        ...

    def truncated(self, n: int) -> Prefix:
        """Its first `n` tokens."""
        ...

    def compact(self) -> Prefix:
        """The same prefix holding no more memory than it needs."""
        ...


class EngineLike(Protocol):
    """What `decide.decider.Decider` calls on its engine (see `engine.Engine` for each one's contract)."""

    model: torch.nn.Module  # what the decider describes (its first parameter's device and dtype)
    device: torch.device
    features: Features  # static: several documents in one forward (the decider batches requests)
    budget: ForwardBudget  # a forward's memory, estimated from its shape

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model reads (None: unknown)."""
        ...

    def prefill(self, ids: Sequence[int] | np.ndarray, base: Prefix | None = None) -> tuple[Any, int]:
        """`ids` read after `base`: (the cache, its length), for `snapshot`."""
        ...

    def snapshot(self, cache: Any, length: int) -> Prefix:
        """A cache's first `length` tokens as an immutable prefix."""
        ...

    def run(
        self,
        ids: Sequence[int] | np.ndarray,
        items: Sequence[PackedItem],
        base: Prefix | None = None,
        keep_prefix: bool = True,
    ) -> tuple[Masses, Prefix | None]:
        """The document's new tokens `ids` after `base`, and every question: (masses per item, the new prefix)."""
        ...

    def launch_many(self, documents: Sequence[Work], keep_prefix: bool = True, features: bool = False) -> InFlight:
        """`run` for several documents, returned as soon as its forward is queued; with `features`, each item's
        hidden state at its decision row too (`InFlight.features`)."""
        ...

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters for monitoring."""
        ...


EngineClass = Callable[["torch.nn.Module", "EngineOptions | None"], EngineLike]  # (model, options) -> its engine
