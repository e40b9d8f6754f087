"""`hosting.heap`: what is alive at start-up is frozen out of the collector's walks; what comes later is collected.
Freed memory goes back to the system once the work has stopped, and not while it goes on."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import psutil
import pytest

from typedlm.hosting.heap import TrimWhenIdle, _glibc, freeze_start_up_objects, trim_freed_memory


class Node:
    """An object that can sit in a reference cycle (only the collector reclaims those)."""

    def __init__(self):
        self.me = self


def test_start_up_objects_are_frozen_and_later_cycles_are_still_collected():
    kept = Node()
    try:
        frozen = freeze_start_up_objects()
        # this interpreter's imports, at least; frozen objects that other threads of the test process drop meanwhile
        # (its servers') leave the permanent generation, so the count can only have fallen since
        assert frozen >= gc.get_freeze_count() > 10_000
        tracked = gc.get_objects()
        assert not any(o is kept for o in tracked)  # frozen: no collection walks it
        later = Node()
        assert any(o is later for o in gc.get_objects())
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None  # a cycle made after the freeze is reclaimed as before
    finally:
        gc.unfreeze()  # the test process goes on as it was
    assert gc.get_freeze_count() == 0 and any(o is kept for o in gc.get_objects())


@pytest.mark.skipif(_glibc() is None, reason="trimming is glibc's")
def test_a_trim_gives_back_the_free_pages_in_the_middle_of_the_heap():
    resident = lambda: psutil.Process().memory_info().rss  # noqa: E731
    bytearray(8 << 20)  # freed at once: glibc now serves blocks below 8 MiB from the heap, as after a large forward
    blocks = [bytearray(1 << 20) for _ in range(256)]
    before = resident()
    del blocks[::2]  # 128 MiB freed between blocks still alive: the heap cannot shrink from its top
    freed = resident()
    assert trim_freed_memory()
    assert before - freed < 32 << 20 and freed - resident() > 96 << 20
    del blocks


def test_the_trim_waits_for_a_quiet_spell_and_an_idle_worker():
    busy = threading.Event()
    trim = TrimWhenIdle(busy.is_set, idle_s=0.2)
    try:
        assert trim.trims == 0 and trim.trimmed  # nothing worked yet, nothing to trim
        started = time.monotonic()
        while time.monotonic() - started < 0.6:  # a stream of work, a piece every 50 ms: never trimmed under
            trim.worked()
            time.sleep(0.05)
        assert trim.trims == 0 and not trim.trimmed
        time.sleep(0.5)  # quiet: trimmed once
        assert trim.trims == 1 and trim.trimmed
        busy.set()  # work in flight (a long forward): not trimmed under it, however quiet
        trim.worked()
        time.sleep(0.5)
        assert trim.trims == 1 and not trim.trimmed
        busy.clear()
        trim.worked()  # its end
        time.sleep(0.5)
        assert trim.trims == 2 and trim.trimmed
    finally:
        trim.close()
