"""A prefix's keys and values: what the prefix cache keeps and a forward starts from. Shared, never mutated."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from typedlm.runtime.hf import Layers


@dataclass(frozen=True)
class PrefixKV:
    """A prefix's keys and values, per layer [1, H_kv, T, D], for its first `length` tokens; `stacked`, where the
    layers are views of one tensor [L, 2, T, H_kv, D] (a static forward's), is that tensor."""

    layers: Layers
    length: int
    stacked: torch.Tensor | None = field(default=None, compare=False, repr=False)

    def truncated(self, n: int) -> PrefixKV:
        assert 0 <= n <= self.length, f"cannot keep {n} of {self.length} tokens"
        stacked = self.stacked[:, :, :n] if self.stacked is not None else None
        return PrefixKV(tuple((k[:, :, :n], v[:, :, :n]) for k, v in self.layers), n, stacked)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def held_bytes(self) -> int:
        """The memory its tensors keep alive: a view into a larger cache keeps the whole cache."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for pair in self.layers for t in pair}
        return sum(storages.values())

    def compact(self) -> PrefixKV:
        """The same keys and values holding no more memory than they need. A forward's cache holds its questions'
        rows after the document's, so the document's keys/values are views into a tensor several times their size;
        those are copied out (the values are equal to the last bit)."""
        if self.held_bytes() <= self.nbytes:
            return self
        return PrefixKV(tuple((k.clone(), v.clone()) for k, v in self.layers), self.length)
