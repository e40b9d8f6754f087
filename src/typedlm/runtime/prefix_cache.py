"""A byte-bounded LRU of prefilled keys/values, keyed by token ids, with longest-prefix match.

A repeated state is not prefilled again; a state that extends a cached one (an agent transcript that
grows turn by turn) prefills only its new tokens. The entry found is the cached prefix that shares the
most leading token ids with the request; its keys/values are truncated to that length as views (no
copy). An entry is any `interface.Prefix`: a real model's keys/values (`kv.PrefixKV`), or the fake model's token
ids (`fake.FakePrefix`). Pinned entries (the system prompt) are never evicted and do not count against the budget.

Counts: a *hit* reuses the whole request prefix, a *partial* hit reuses more than the pinned system
prompt, a *miss* reuses no more than that.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from typedlm.runtime.interface import Prefix
from typedlm.text.cut import common_prefix_length


@dataclass
class CacheStats:
    hits: int = 0
    partial_hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    entries: int = 0
    bytes: int = 0
    max_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class PrefixCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        # keyed by the prefix's token ids (compared chunk by chunk as tuples: see `common_prefix_length`)
        self._entries: OrderedDict[tuple[int, ...], tuple[Prefix, int]] = OrderedDict()  # ids -> (kv, bytes)
        self._pinned: dict[tuple[int, ...], Prefix] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        self._stats = CacheStats(max_bytes=max_bytes)

    def pin(self, ids: Sequence[int], kv: Prefix) -> None:
        assert len(ids) == kv.length, "ids and keys/values must cover the same tokens"
        with self._lock:
            self._pinned[tuple(ids)] = kv

    def lookup(self, ids: Sequence[int]) -> Prefix | None:
        """The longest cached prefix of `ids` (as views), or None when nothing matches."""
        with self._lock:
            best, best_len, best_key, pinned_len = None, 0, None, 0
            for cached, kv in self._pinned.items():
                n = common_prefix_length(ids, cached)
                pinned_len = max(pinned_len, n)
                if n > best_len:
                    best, best_len, best_key = kv, n, None
            for key, (kv, _) in self._entries.items():
                n = common_prefix_length(ids, key)
                if n > best_len:
                    best, best_len, best_key = kv, n, key
            if best_key is not None:
                self._entries.move_to_end(best_key)
            if best_len == len(ids) and best_len > 0:
                self._stats.hits += 1
            elif best_len > pinned_len:
                self._stats.partial_hits += 1
            else:
                self._stats.misses += 1
            self._stats.reused_tokens += best_len
        if best is None:
            return None
        return best if best_len == best.length else best.truncated(best_len)

    def insert(self, ids: Sequence[int], kv: Prefix) -> None:
        """Keep `kv` (the keys/values of exactly `ids`; copied out of a larger cache it is a view of), evicting least
        recently used entries over budget."""
        assert len(ids) == kv.length, "ids and keys/values must cover the same tokens"
        size = kv.nbytes
        key = tuple(ids)
        with self._lock:
            if size > self.max_bytes or key in self._entries or key in self._pinned:
                return
            kv = kv.compact()  # only what it holds counts against the budget, so only that may stay alive
            self._entries[key] = (kv, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    def stats(self) -> dict[str, int]:
        with self._lock:
            self._stats.entries = len(self._entries)
            self._stats.bytes = self._bytes
            return self._stats.as_dict()
