"""The garbage collector in a serving process: what start-up loaded, set aside once, so collections stop walking it.

    freeze_start_up_objects()   # once the process has loaded what it keeps for its lifetime (model, app)

A process that has imported torch and transformers and loaded a model tracks about 400,000 Python objects, nearly
all kept for its lifetime. CPython's full (generation 2) collection walks every one of them, holding the
interpreter lock: about 160 ms on a 2-core CPU (benchmarks/README.md, `gc_pauses.py`), every few thousand
requests when serving, in which no thread tokenizes, launches a forward or answers. `gc.freeze()` moves the objects
alive now to a permanent generation that collections skip; objects made later are collected as before (a full
collection then took 0.3 ms). What start-up made and drops later in a reference cycle is not reclaimed; a serving
process keeps what it loaded, so little is lost. Only the processes that serve call this (`typedlm serve`'s HTTP
and model processes, a replica): a library must not freeze its caller's objects.
"""

from __future__ import annotations

import gc


def freeze_start_up_objects() -> int:
    """Collect once, then freeze every object alive (see the module). Returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
