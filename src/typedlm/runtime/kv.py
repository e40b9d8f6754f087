"""A prefix's keys and values: what the prefix cache keeps and a forward starts from. Shared, never mutated."""

from __future__ import annotations

from dataclasses import dataclass

from typedlm.runtime.hf import Layers


@dataclass(frozen=True)
class PrefixKV:
    """A prefix's keys and values, per layer [1, H_kv, T, D], for its first `length` tokens."""

    layers: Layers
    length: int

    def truncated(self, n: int) -> PrefixKV:
        assert 0 <= n <= self.length, f"cannot keep {n} of {self.length} tokens"
        return PrefixKV(tuple((k[:, :, :n], v[:, :, :n]) for k, v in self.layers), n)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)
