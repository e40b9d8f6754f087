"""The model worker: forward passes run off the event loop, on two threads of their own, behind a bounded queue.

A request is first made ready on a host thread (`prepare`: parsing into token ids, labels, limits; several
requests at once on `host_threads` threads), so that tokenizing the next requests overlaps the current forward;
then it waits for the model thread. Requests that arrive while a forward runs are answered together by the next
one (`launch_batch`), up to `max_batch` requests and `max_batch_tokens` tokens, as many as the largest power of
two that fits (few batch shapes: each new one is captured as a CUDA graph); the rest go into the forward after.
One forward for many documents is what keeps a GPU busy.

A pipeline keeps the host off the GPU's critical path: the model thread only launches a batch's forward (on a
GPU it returns once the work is queued) and hands it to the finishing thread, which waits for it and builds its
answers. Up to `pipeline_depth` forwards are in flight, so the next batch is gathered, packed and queued on the
device while the current one runs and the last one's answers are built (`pipeline_depth=1`: one at a time).

With `gather_gap_s` > 0, while another forward is in flight (the device has work), a batch being gathered
waits a little for more requests: until `gather_gap_s` passes without one arriving, and for at most
`GATHER_SHARE` of the last forward's time. The clients of a batch just answered send their next requests within
a few milliseconds of each other; without the wait the next batch is launched with the first of them and the
rest wait for the one after. With nothing in flight a batch is launched at once (a lone client waits for
nothing). Off by default (`GATHER_GAP_S` = 0): on an H200 with two forwards in flight it left the mean batch
where it was (10 requests at 32 clients) and the rates within the runs' noise (docs/performance.md, "Measured and
not kept").

A call that cannot be batched (`submit`) runs alone, once the forwards in flight are done. A batch whose forward
fails is answered again one request at a time, so a request gets an error only where it fails on its own (a
fault of its own, or one it would meet alone; a batch too large for the device's memory succeeds so).

`submit` and `submit_batch` raise a 503 (with Retry-After) when `max_pending` requests are already being prepared,
running or waiting, and a 504 when the answer takes longer than the timeout (the forward itself finishes in the
background and still counts as pending until it does). `close` waits for in-flight work: graceful shutdown.
Once no forward has finished for `heap.IDLE_TRIM_S` and nothing is in flight or queued, the memory the forwards freed
goes back to the system (`heap.TrimWhenIdle`): requests in a stream reuse it, an idle server does not keep it.
`stats` gives the model thread's waits since start: for a slot (the device, or the answers, set the pace) and for a
request with a slot free (the clients, or the preparing threads, do): the server's metrics and `/health` carry them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from typedlm.core.settings import MAX_BATCH
from typedlm.hosting.batching import MAX_BATCH_TOKENS, fits
from typedlm.hosting.heap import TrimWhenIdle
from typedlm.hosting.status import overloaded, timed_out

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = TypeVar("P")

PIPELINE_DEPTH = 2  # forwards in flight: one running, the next queued behind it while the host finishes answers
GATHER_GAP_S = 0.0  # > 0: with a forward in flight, a batch waits for more requests until this passes without one
GATHER_SHARE = 0.25  # ... and for at most this share of the last forward's time (launch to answers)
# threads preparing requests (tokenizing releases the GIL): a few where there are cores to spare, else one
HOST_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))


@dataclass
class _Job:
    """One request for the model thread: a call of its own, or an item of a batchable `launch_batch`."""

    future: Future
    submitted: float
    call: Callable[[], Any] | None = None
    launch_batch: Callable[[list], Callable[[], list]] | None = None
    item: Any = None
    tokens: int = 0


_STOP = object()
_Outcome = tuple[Future, bool, Any]  # a request's future, whether it succeeded, its result or its exception


class ModelWorker:
    def __init__(
        self,
        max_pending: int,
        retry_after_s: int = 1,
        on_timing: Callable[[float, float], None] | None = None,
        max_batch: int = MAX_BATCH,
        max_batch_tokens: int = MAX_BATCH_TOKENS,
        on_batch: Callable[[int, int], None] | None = None,
        host_threads: int = HOST_THREADS,
        pipeline_depth: int = PIPELINE_DEPTH,
        gather_gap_s: float = GATHER_GAP_S,
    ):
        assert max_pending >= 1 and max_batch >= 1, "the queue must admit at least one request"
        assert pipeline_depth >= 1, "at least one forward must be in flight"
        assert gather_gap_s >= 0, "a gap of 0 turns the gathering wait off"
        self.max_pending = max_pending
        self.retry_after_s = retry_after_s
        self.on_timing = on_timing  # (seconds waiting for the model thread, seconds of its forward) per request
        self.on_batch = on_batch  # (requests, tokens) per forward
        self.max_batch, self.max_batch_tokens = max_batch, max_batch_tokens
        self.pending = 0  # touched only on the event loop thread
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._host = ThreadPoolExecutor(max_workers=host_threads, thread_name_prefix="typedlm-host")
        self.pipeline_depth, self.gather_gap_s = pipeline_depth, gather_gap_s
        # batches handed to the finishing thread and finished by it: each counter written by one thread only
        self._launched = self._finished = 0
        self._forward_s = 0.0  # the last batch's time from its launch to its answers (finishing thread)
        # the model thread's waits since start, seconds: for a "slot", every forward allowed being in flight (the
        # device sets the pace, or the answers do); for "requests", a slot free and nothing to launch (the clients
        # do, or the threads preparing requests; an idle server too). The wait going on counts as far as it went.
        self._waited = {"slot": 0.0, "requests": 0.0}
        self._waiting: tuple[str, float] | None = None
        self._waits_lock = threading.Lock()  # read from other threads (`stats`): a counter never goes back
        self._in_flight = threading.Semaphore(pipeline_depth)  # a slot per forward launched and not yet finished
        self._finishing: queue.SimpleQueue = queue.SimpleQueue()  # what the finishing thread does, in order
        self.trim = TrimWhenIdle(lambda: self._launched > self._finished or not self._queue.empty())
        self._finisher = threading.Thread(target=self._finish_loop, name="typedlm-finish", daemon=True)
        self._thread = threading.Thread(target=self._loop, name="typedlm-model", daemon=True)
        self._finisher.start()
        self._thread.start()

    def _admit(self) -> None:
        if self.pending >= self.max_pending:
            raise overloaded(self.pending, self.retry_after_s)
        self.pending += 1

    def _done(self, _future: asyncio.Future) -> None:
        self.pending -= 1

    async def wait_for(self, start: Callable[[], Future], timeout_s: float) -> Any:
        """Admit a request (503 past `max_pending`), `start()` it (`call` or `put`) and wait for its result (504 past
        `timeout_s`; the request then runs on in the background and still counts as pending until it is done)."""
        self._admit()
        try:
            future = asyncio.wrap_future(start())
        except BaseException:
            self.pending -= 1
            raise
        future.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError as exc:
            raise timed_out(timeout_s) from exc

    async def submit(self, fn: Callable[..., T], *args, timeout_s: float) -> T:
        """`fn(*args)` alone on the model thread."""
        return await self.wait_for(lambda: self.call(fn, *args), timeout_s)

    async def submit_batch(
        self,
        prepare: Callable[[], P],
        launch_batch: Callable[[list[P]], Callable[[], list[T]]],
        tokens: Callable[[P], int],
        *,
        timeout_s: float,
    ) -> T:
        """`put` a request on the event loop: admitted, and waited for with a timeout (`wait_for`)."""
        return await self.wait_for(lambda: self.put(prepare, launch_batch, tokens), timeout_s)

    def call(self, fn: Callable[..., T], *args) -> Future:
        """`fn(*args)` queued to run alone on the model thread, from any thread; no admission, no timeout."""
        job = _Job(Future(), time.perf_counter(), call=lambda: fn(*args))
        self._queue.put(job)
        return job.future

    def put(
        self,
        prepare: Callable[[], P],
        launch_batch: Callable[[list[P]], Callable[[], list[T]]],
        tokens: Callable[[P], int],
    ) -> Future:
        """From any thread, with no event loop, admission or timeout (the caller's): `prepare()` on a host thread
        (its errors are the request's own), then the prepared item answered by `launch_batch` on the model thread,
        together with the items of other requests waiting then for the same `launch_batch`; `tokens(item)` is what
        the item adds to a forward. `launch_batch(items)` queues the items' work and returns the function that
        waits for it and gives their results in order (one that works synchronously returns `lambda: results`;
        `Decider.launch_prepared` returns once its forward is queued on the device). The future returned has the
        request's result or error."""
        result: Future = Future()

        def queue_prepared(prepared: Future) -> None:  # on the host thread that prepared it
            try:
                item = prepared.result()
                job = _Job(result, time.perf_counter(), launch_batch=launch_batch, item=item, tokens=tokens(item))
            except BaseException as exc:
                result.set_exception(exc)
            else:
                self._queue.put(job)

        self._host.submit(prepare).add_done_callback(queue_prepared)
        return result

    def _loop(self) -> None:
        """The model thread: gather a batch, launch it, hand it to the finishing thread; at most
        `pipeline_depth` forwards in flight (a slot is taken before gathering, so a batch takes every request
        that arrived while the forwards before it ran)."""
        carried: deque = deque()  # jobs taken from the queue that did not go into the last batch, in order
        while True:
            self._wait("slot", self._in_flight.acquire)
            job = carried.popleft() if carried else self._wait("requests", self._queue.get)
            if job is _STOP:
                self._in_flight.release()
                self._drain()
                self._finishing.put(None)
                self._finisher.join()
                return
            if job.launch_batch is None:  # a call of its own: alone, once the forwards in flight are done
                self._in_flight.release()
                self._drain()
                self._run_call(job)
                continue
            batch, tokens = [job], job.tokens
            until = time.perf_counter() + GATHER_SHARE * self._forward_s
            while len(batch) < self.max_batch:
                waiting = self._next_waiting(carried, until)
                if waiting is None:
                    break
                if (
                    waiting is _STOP
                    or waiting.launch_batch != job.launch_batch
                    or not fits(len(batch), tokens, waiting.tokens, self.max_batch, self.max_batch_tokens)
                ):
                    carried.appendleft(waiting)
                    break
                batch.append(waiting)
                tokens += waiting.tokens
            # a power of two: batch shapes repeat (each new one is captured as a CUDA graph), the rest go next
            keep = 1 << (len(batch).bit_length() - 1)
            carried.extendleft(reversed(batch[keep:]))
            del batch[keep:]
            self._launch(batch)

    def _wait(self, kind: str, block: Callable[[], T]) -> T:
        """`block()` on the model thread, its time counted as a wait of `kind` (see `__init__`)."""
        since = time.perf_counter()
        with self._waits_lock:
            self._waiting = (kind, since)
        try:
            return block()
        finally:
            with self._waits_lock:
                self._waited[kind] += time.perf_counter() - since
                self._waiting = None

    def stats(self) -> dict[str, float]:
        """The model thread's waits since start, seconds (see `__init__`): which side sets the pace."""
        with self._waits_lock:
            waited = dict(self._waited)
            if self._waiting is not None:
                kind, since = self._waiting
                waited[kind] += time.perf_counter() - since
        return {f"waited_for_{kind}_seconds": seconds for kind, seconds in waited.items()}

    def _next_waiting(self, carried: deque, until: float):
        """The next job for the batch being gathered: one carried over, one queued, or (while another forward is in
        flight, before `until`) one that arrives within `gather_gap_s`; None when none does."""
        if carried:
            return carried.popleft()
        wait = min(self.gather_gap_s, until - time.perf_counter())
        try:
            if wait > 0 and self._launched > self._finished:
                return self._queue.get(timeout=wait)
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def _drain(self) -> None:
        """Wait until no forward is in flight."""
        for _ in range(self.pipeline_depth):
            self._in_flight.acquire()
        for _ in range(self.pipeline_depth):
            self._in_flight.release()

    def _launch(self, batch: list[_Job]) -> None:
        """Launch one batch's forward (its slot taken) and hand what is left to the finishing thread."""
        started = time.perf_counter()
        try:
            finish = batch[0].launch_batch([job.item for job in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                self._in_flight.release()
                return
            finish = None  # each alone, on the finishing thread
        except BaseException as exc:  # handed to every request of the batch, raised there
            for job in batch:
                job.future.set_exception(exc)
            self._in_flight.release()
            return
        self._launched += 1
        self._finishing.put((batch, finish, started))

    def _finish_loop(self) -> None:
        """The finishing thread: each launched batch's answers, in launch order, then its slot freed."""
        while (task := self._finishing.get()) is not None:
            batch, finish, started = task
            try:
                self._finish(batch, finish, started)
            except Exception:  # a fault past the answers (a metrics callback): the thread must go on
                logger.exception("finishing a batch failed")
            finally:
                self._forward_s = time.perf_counter() - started
                self._finished += 1
                self._in_flight.release()
                self.trim.worked()
            # what the batch's forward left (its whole key/value cache, as views) goes now, not when the next
            # batch arrives: an idle server keeps nothing of its last request beyond the caches
            del task, batch, finish

    def _finish(self, batch: list[_Job], finish: Callable[[], list] | None, started: float) -> None:
        """Wait for a batch's forward and answer its requests (`finish` None: its launch failed, each alone).

        The metrics are recorded before any request is answered, so a scrape that follows a response counts it."""
        outcomes = self._outcomes(batch, finish)
        try:
            if self.on_batch is not None:
                self.on_batch(len(batch), sum(job.tokens for job in batch))
            self._timed(batch, started)
        finally:
            _settle(outcomes)

    def _outcomes(self, batch: list[_Job], finish: Callable[[], list] | None) -> list[_Outcome]:
        """What a batch's requests are to be answered with, once its forward is done."""
        if finish is None:
            return self._each_alone(batch)
        try:
            results = finish()
        except Exception as exc:
            if len(batch) == 1:
                return [(batch[0].future, False, exc)]
            return self._each_alone(batch)
        except BaseException as exc:  # handed to every request of the batch, raised there
            return [(job.future, False, exc) for job in batch]
        return [(job.future, True, result) for job, result in zip(batch, results, strict=True)]

    def _run_call(self, job: _Job) -> None:
        started = time.perf_counter()
        try:
            outcome: _Outcome = (job.future, True, job.call())
        except BaseException as exc:
            outcome = (job.future, False, exc)
        try:
            self._timed([job], started)
        finally:
            _settle([outcome])
            self.trim.worked()

    def _timed(self, batch: list[_Job], started: float) -> None:
        if self.on_timing is not None:
            finished = time.perf_counter()
            for job in batch:
                self.on_timing(started - job.submitted, finished - started)

    @staticmethod
    def _each_alone(batch: list[_Job]) -> list[_Outcome]:
        """The requests of a failed batch, each run by a forward of its own: its result or its own error (one
        request's fault, or a batch too big for the device, must not fail the others)."""
        outcomes: list[_Outcome] = []
        for job in batch:
            try:
                (result,) = job.launch_batch([job.item])()
            except Exception as exc:
                outcomes.append((job.future, False, exc))
            else:
                outcomes.append((job.future, True, result))
        return outcomes

    def close(self) -> None:
        self._host.shutdown(wait=True)
        self._queue.put(_STOP)
        self._thread.join()
        self.trim.close()


def _settle(outcomes: list[_Outcome]) -> None:
    for future, ok, value in outcomes:
        resolve(future, ok, value)


def resolve(future: Future | asyncio.Future, ok: bool, value: Any) -> None:
    """Settle `future` with `value`, its result (`ok`) or its exception; one settled already is left as it is."""
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
