"""Memory in a serving process: freed blocks given back to the system, and what start-up loaded set aside once,
so that the garbage collector's walks skip it.

    return_freed_memory(MODEL_MMAP_THRESHOLD_BYTES)   # a model's process: a large forward's blocks go back as freed
    TrimWhenIdle(busy)                                # its model worker: the rest goes back once the work stops
    return_freed_memory()                             # a process without the model (HTTP): large bodies go back
    freeze_start_up_objects()                         # once the process has loaded what it keeps (model, app)

glibc's allocator serves a block of 128 KiB or more with a mapping of its own, unmapped when freed, but raises that
threshold to the largest block freed so far (up to 32 MiB): after one large request, a forward's tensors of a few
MiB each come from the heap, and what the heap holds stays with the process when they are freed. A server's
requests vary in size, so its memory can ratchet up to its largest forward's and stay there.

Three ways, measured (docs/performance.md, "Memory"):
- The threshold fixed at 128 KiB: every large block mapped apart and unmapped when freed. Memory goes back at
  once, but a CPU forward faults in and zeroes fresh pages for each activation it makes: the embedded model took
  3.3 s instead of 2.4 s for a new 1,266-token document. Kept for a process that never runs the model.
- The threshold left to glibc, the free pages given back (`malloc_trim`) once the model worker has had nothing to
  do for `IDLE_TRIM_S` (`TrimWhenIdle`): as fast, but a large forward's blocks then come from the heap too, which
  fragments, and the largest admitted requests peaked at 2.2-2.3 GB against 1.3 GB.
- The threshold fixed at 16 MiB (`MODEL_MMAP_THRESHOLD_BYTES`) and the idle trim, what a model's process does: a
  usual forward's blocks (a few MiB) are reused from the heap at full speed; a large forward's are mapped apart
  and go back as freed; an idle server keeps what its caches hold. A trim takes 1-13 ms, off every request's path.
  Where the C library is not glibc, nothing changes.

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
import functools
import gc
import threading
from collections.abc import Callable

M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1  # glibc's mallopt parameters
MMAP_THRESHOLD_BYTES = 128 << 10  # glibc's initial threshold: a process that never runs the model keeps it
MODEL_MMAP_THRESHOLD_BYTES = 16 << 20  # a model's process: a usual forward's blocks from the heap, a large one's apart
IDLE_TRIM_S = 1.0  # the model worker idle this long after its last forward: its freed memory goes back


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc's, else AttributeError)
    except (OSError, AttributeError):
        return None
    return libc


def return_freed_memory(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold` (see the module): blocks that large or larger are mapped apart and
    go back to the system as they are freed; above glibc's initial threshold, the heap's top is kept up to twice it
    (glibc's own ratio) rather than given back and faulted in again. False where the C library is not glibc."""
    libc = _glibc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, threshold):
        return False
    return threshold <= MMAP_THRESHOLD_BYTES or bool(libc.mallopt(M_TRIM_THRESHOLD, 2 * threshold))


def trim_freed_memory() -> bool:
    """Give the free pages of every heap back to the system (`malloc_trim`); False where there is no glibc or
    nothing went back."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


class TrimWhenIdle:
    """A thread that trims (`trim_freed_memory`) once work has stopped: `worked()` after each piece of work; the
    trim follows when `idle_s` passes without another and `busy()` (work in flight or queued) is false. A stream of
    requests is never trimmed under; an idle process keeps what its caches hold."""

    def __init__(self, busy: Callable[[], bool], idle_s: float = IDLE_TRIM_S):
        self.busy, self.idle_s = busy, idle_s
        self.trims = 0  # trims done
        self._works = self._trimmed_after = 0  # `worked` calls so far; how many of them the last trim followed
        self._worked = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="typedlm-trim", daemon=True)
        self._thread.start()

    def worked(self) -> None:
        self._works += 1
        self._worked.set()

    @property
    def trimmed(self) -> bool:
        """Whether a trim has followed the last piece of work."""
        return self._trimmed_after == self._works

    def _loop(self) -> None:
        while True:
            self._worked.wait()
            while not self._closed and self._worked.is_set():  # wait for a quiet `idle_s`
                self._worked.clear()
                self._worked.wait(self.idle_s)
            if self._closed:
                return
            works = self._works
            if not self.busy():  # busy: what is in flight calls `worked` when it is done
                trim_freed_memory()
                self.trims, self._trimmed_after = self.trims + 1, works

    def close(self) -> None:
        self._closed = True
        self._worked.set()
        self._thread.join()


def freeze_start_up_objects() -> int:
    """Collect once, then freeze every object alive (see the module). Returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
