"""Scheduling prepared requests onto the engine: documents grouped, the prefix cache, one forward launched.

    scheduler = Scheduler(engine, prefix_cache_bytes)
    scheduler.pin(system_ids)                # a prefix every request starts with, prefilled once and kept
    wait = scheduler.launch(prepared)        # ONE forward for every request; returns once it is queued
    results = wait()                         # each request's masses per read, its tokens served from the cache
                                             # and, launched with features=True, its reads' decision rows [reads, D]

4. each document's new tokens over the longest cached prefix of it (the system prompt, earlier documents); requests
   on the same document share it: their reads join one document's (no question sees another);
5. every read's suffix and label tree packed after its document, in ONE forward (`EngineLike.launch_many`: on a GPU
   the host is free as soon as it is queued), each document's new prefix kept in the prefix cache for the next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from typedlm.decide.prepare import Prepared
from typedlm.runtime.interface import EngineLike
from typedlm.runtime.packing import PackedItem
from typedlm.runtime.prefix_cache import PrefixCache

# per request: masses [reads][answers], tokens from the cache, and its reads' decision rows [reads, D] (or None)
Forwarded = list[tuple[list[list[float]], int, np.ndarray | None]]


class Scheduler:
    """The engine and the prefix cache of one decider (see the module)."""

    def __init__(self, engine: EngineLike, prefix_cache_bytes: int):
        self.engine = engine
        self.prefix_cache = PrefixCache(prefix_cache_bytes)

    def pin(self, ids: list[int]) -> None:
        """Prefill `ids` once and keep their keys and values for good (with 0 bytes only pinned prefixes are
        reused)."""
        cache, length = self.engine.prefill(ids)
        self.prefix_cache.pin(ids, self.engine.snapshot(cache, length))

    def launch(self, prepared: Sequence[Prepared], features: bool = False) -> Callable[[], Forwarded]:
        """Steps 4-5 for several prepared requests in ONE forward, returned as soon as it is queued, its documents'
        new prefixes already in the prefix cache: the function returned waits for the forward and gives each
        request's masses per read, its tokens served from the prefix cache and, with `features`, its reads' hidden
        states at their decision rows (else None)."""
        groups: dict[bytes, list[int]] = {}  # a document's prefix ids → the requests on it
        for i, request in enumerate(prepared):
            groups.setdefault(request.prompt.prefix_array.tobytes(), []).append(i)
        documents, bases = [], []
        for members in groups.values():
            prompt = prepared[members[0]].prompt
            base = self.prefix_cache.lookup(prompt.prefix_ids)
            shared = base.length if base else 0
            documents.append((prompt.prefix_array[shared:], [it for i in members for it in prepared[i].items], base))
            bases.append(shared)
        keep = self.prefix_cache.max_bytes > 0  # a prefix that will not be cached need not be copied
        in_flight = self.engine.launch_many(documents, keep_prefix=keep, features=features)
        for members, shared, prefix in zip(groups.values(), bases, in_flight.prefixes):
            if prefix is not None and prefix.length > shared:
                self.prefix_cache.insert(prepared[members[0]].prompt.prefix_ids, prefix)

        def wait() -> Forwarded:
            results: Forwarded = [([], 0, None)] * len(prepared)
            per_document = in_flight.wait()
            rows = in_flight.features() if in_flight.features is not None else [None] * len(per_document)
            for members, shared, masses, hidden in zip(groups.values(), bases, per_document, rows):
                start = 0
                for i in members:
                    n = len(prepared[i].items)
                    results[i] = (
                        masses[start : start + n],
                        shared,
                        None if hidden is None else hidden[start : start + n],
                    )
                    start += n
            return results

        return wait

    def run_pinned(self, prefix_ids: list[int], items: list[PackedItem]) -> list[list[float]]:
        """The masses of `items` over a prefix whose start is pinned (the content-free document), from one forward
        now, keeping nothing."""
        base = self.prefix_cache.lookup(prefix_ids)
        masses, _ = self.engine.run(prefix_ids[base.length :], items, base, keep_prefix=False)
        return masses
