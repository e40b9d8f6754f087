"""Memory in a serving process: freed blocks given back to the system, and what start-up loaded set aside once,
so that the garbage collector's walks skip it.

    return_freed_memory()       # first thing: large blocks freed by a request go back to the system
    freeze_start_up_objects()   # once the process has loaded what it keeps for its lifetime (model, app)

glibc's allocator serves a block of 128 KiB or more with a mapping of its own, unmapped when freed, but raises that
threshold to the largest block freed so far (up to 32 MiB): after one large request, a forward's tensors of a few
MiB each come from the heap, and what the heap holds stays with the process when they are freed. A server's
requests vary in size, so its memory can ratchet up to its largest forward's and stay there. With the threshold
fixed, what the model process keeps after the largest admitted requests is what its caches hold (`hostile.py`: 432
MB kept against 422 MB in the caches, after peaks of 1.3 GB).
Fixing the threshold (`mallopt(M_MMAP_THRESHOLD)`) keeps such blocks mapped apart, so a request's memory goes
back when it is done. Where the C library is not glibc, nothing changes.


A process that has imported torch and transformers and loaded a model tracks about 400,000 Python objects, nearly
all kept for its lifetime. CPython's full (generation 2) collection walks every one of them, holding the
interpreter lock: about 160 ms on a 2-core CPU (docs/performance.md, "CPU", `gc_pauses.py`), every few thousand
requests when serving, in which no thread tokenizes, launches a forward or answers. `gc.freeze()` moves the objects
alive now to a permanent generation that collections skip; objects made later are collected as before (a full
collection then took 0.3 ms). What start-up made and drops later in a reference cycle is not reclaimed; a serving
process keeps what it loaded, so little is lost. Only the processes that serve call this (`typedlm serve`'s HTTP
and model processes, a replica): a library must not freeze its caller's objects.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 128 << 10  # glibc's initial threshold, kept from then on


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold (see the module), so large freed blocks go back to the system; False where this
    process's C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def freeze_start_up_objects() -> int:
    """Collect once, then freeze every object alive (see the module). Returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
