"""Memory that lasts across requests, bounded in bytes: a least-recently-used cache and the size estimates it needs.

    texts = BoundedCache("suffix_texts", max_bytes=32 << 20)
    text = texts.get(question)
    if text is None:
        text = render(question)
        text = texts.put(question, text, nbytes=text_bytes(text))   # another thread's value wins, if it put first

Every cache a server keeps between requests is one of these, so what it may hold is a number of bytes, not of
entries: an entry keyed by a 30,000-character option name costs what it holds, and a request cannot make the
cache grow past its budget however large its strings are. An entry larger than a quarter of the budget is not
kept at all (it would push out many small ones for one that is rarely asked again). Sizes are estimates of what
the entry keeps alive (its key and value), made by the caller with the helpers below; they count CPython's
object layout (a `str` of n characters takes about 49 + n·w bytes, w its widest character's width; an int outside
the small-int cache 28 bytes; a tuple 40 + 8 per item), which is close for the flat data held here.

Thread-safe: the server's tokenizing threads share caches. `stats()` gives entries, bytes, budget, hits, misses
and evictions (the server's /metrics shows them per cache).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

LARGEST_SHARE = 4  # an entry over max_bytes / LARGEST_SHARE is not kept
INT_BYTES = 28  # a Python int outside the small-int cache (token ids are)
SLOT_BYTES = 8  # a pointer in a tuple or list
CONTAINER_BYTES = 56  # a tuple's or list's header, rounded up


def resident_bytes(pid: int | None = None) -> int:
    """A process's resident set size now (this process's by default; 0 where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid or 'self'}/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def process_memory() -> dict[str, int]:
    """This process's resident bytes now and at its peak (for /metrics: what the caches' bytes are part of)."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux; the kernel updates it lazily
    resident = resident_bytes()
    return {"resident_bytes": resident, "peak_resident_bytes": max(peak_kib * 1024, resident)}


def text_bytes(text: str) -> int:
    """What a `str` takes in memory (exact: CPython's compact string layout)."""
    return sys.getsizeof(text)


def ids_bytes(ids: Iterable[int] | int) -> int:
    """What a tuple or list of token ids takes (each id an int object of its own); `ids` or their count."""
    n = ids if isinstance(ids, int) else len(ids)  # type: ignore[arg-type]
    return CONTAINER_BYTES + n * (SLOT_BYTES + INT_BYTES)


def texts_bytes(texts: Iterable[str]) -> int:
    return sum(text_bytes(text) for text in texts)


class BoundedCache(Generic[K, V]):
    """A thread-safe LRU mapping holding at most `max_bytes` of entries (as their sizes were given to `put`)."""

    def __init__(self, name: str, max_bytes: int):
        assert max_bytes >= 0, "a cache's budget is a number of bytes"
        self.name, self.max_bytes = name, max_bytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value kept for `key` (now the most recently used), or `default`."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return default
            self._hits += 1
            self._entries.move_to_end(key)
            return entry[0]

    def peek(self, key: K) -> V | None:
        """The value kept for `key`, or None, leaving the order and the counters as they are."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry[0]

    def put(self, key: K, value: V, nbytes: int) -> V:
        """Keep `value` for `key` (it and its key taking about `nbytes`), evicting the least recently used entries
        over budget; returns the value kept (an earlier one for the same key wins, so threads agree)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry[0]
            if nbytes * LARGEST_SHARE > self.max_bytes:
                return value  # too large to be worth keeping: used once, then gone
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
                self._evictions += 1
            return value

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def stats(self) -> dict[str, int]:
        """Entries, bytes held, the budget, and the lookups' hits and misses and the evictions since start."""
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "hits": self._hits,
                "misses": self._misses,
                "evictions": self._evictions,
            }
