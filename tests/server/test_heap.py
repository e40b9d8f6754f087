"""`server.heap`: what is alive at start-up is frozen out of the collector's walks; what comes later is collected."""

from __future__ import annotations

import gc
import weakref

from typedlm.server.heap import freeze_start_up_objects


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
