"""Caches bounded in bytes: least recently used entries go first, an entry too large is never kept, sizes add up."""

from __future__ import annotations

import sys
import threading

from typedlm.core.bounded import BoundedCache, ids_bytes, process_memory, resident_bytes, text_bytes


def test_entries_are_dropped_least_recently_used_first_when_their_bytes_pass_the_budget():
    cache = BoundedCache("t", max_bytes=100)
    for key in "abcd":
        cache.put(key, key.upper(), 25)
    assert cache.get("a") == "A"  # a is now the most recently used: b goes first
    cache.put("e", "E", 25)
    assert cache.get("b") is None and [cache.peek(k) for k in "acde"] == ["A", "C", "D", "E"]
    cache.put("f", "F", 25)  # one more: c, the least recently used now, goes
    assert cache.peek("c") is None and cache.nbytes == 100 and len(cache) == 4
    stats = cache.stats()
    assert stats["evictions"] == 2 and stats["bytes"] == 100 and stats["max_bytes"] == 100
    assert stats["hits"] == 1 and stats["misses"] == 1  # peek counts nothing


def test_an_entry_over_a_quarter_of_the_budget_is_used_once_and_not_kept():
    cache = BoundedCache("t", max_bytes=100)
    cache.put("small", 1, 25)
    assert cache.put("large", 2, 26) == 2  # the value is handed back all the same
    assert cache.peek("large") is None and cache.peek("small") == 1 and cache.nbytes == 25


def test_the_first_value_put_for_a_key_wins_so_threads_agree():
    cache = BoundedCache("t", max_bytes=100)
    first = cache.put("k", [1], 10)
    assert cache.put("k", [1], 10) is first and cache.nbytes == 10
    assert cache.get("missing", default="x") == "x"


def test_threads_putting_at_once_keep_the_byte_count_exact():
    cache = BoundedCache("t", max_bytes=1_000)

    def fill(offset: int) -> None:
        for i in range(2_000):
            cache.put((offset, i % 97), i, 7 + i % 5)
            cache.get((offset, (i * 7) % 97))

    threads = [threading.Thread(target=fill, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kept = [cache.peek(key) for key in [(t, i) for t in range(8) for i in range(97)]]
    assert cache.nbytes <= 1_000 and len(cache) == sum(value is not None for value in kept)
    assert cache.nbytes == sum(7 + value % 5 for value in kept if value is not None)


def test_sizes_follow_the_objects_they_stand_for():
    assert text_bytes("a" * 1000) == sys.getsizeof("a" * 1000) and text_bytes("名" * 10) > text_bytes("a" * 10)
    ids = tuple(range(1000, 1100))  # ids past the small-int cache: an int object each
    held = sys.getsizeof(ids) + sum(sys.getsizeof(i) for i in ids)
    assert held <= ids_bytes(ids) <= 1.2 * held and ids_bytes(100) == ids_bytes(ids)


def test_the_process_memory_is_read_from_the_system():
    memory = process_memory()
    assert 0 < memory["resident_bytes"] <= memory["peak_resident_bytes"] * 1.01
    assert resident_bytes(2**31 - 1) == 0  # no such process
