"""The model worker: forward passes run on one thread, never on the event loop, behind a bounded queue.

A request is first made ready on a host thread (`prepare`: parsing into token ids, labels, limits; several
requests at once on `host_threads` threads), so that tokenizing the next requests overlaps the current forward;
then it waits for the model thread. Requests that arrive while a forward runs are answered together by the next
one (`run_batch`), up to `max_batch` requests and `max_batch_tokens` tokens, as many as the largest power of two
that fits (few batch shapes: each new one is captured as a CUDA graph); the rest go into the forward after. One
forward for many documents is what keeps a GPU busy. A call that cannot be batched (`submit`) runs alone. A batch
whose forward fails is answered again one request at a time, so a request gets an error only where it fails on
its own (a fault of its own, or one it would meet alone; a batch too large for the device's memory succeeds so).

`submit` and `submit_batch` raise a 503 (with Retry-After) when `max_pending` requests are already being prepared,
running or waiting, and a 504 when the answer takes longer than the timeout (the forward itself finishes in the
background and still counts as pending until it does). `close` waits for in-flight work: graceful shutdown.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from typedlm.server.status import APIError

T = TypeVar("T")
P = TypeVar("P")

MAX_BATCH = 64  # requests answered by one forward, at most
MAX_BATCH_TOKENS = 65536  # tokens of one forward, at most (a single larger request still runs, alone)
# threads preparing requests (tokenizing releases the GIL): a few where there are cores to spare, else one
HOST_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))


@dataclass
class _Job:
    """One request for the model thread: a call of its own, or an item of a batchable `run_batch`."""

    future: Future
    submitted: float
    call: Callable[[], Any] | None = None
    run_batch: Callable[[list], list] | None = None
    item: Any = None
    tokens: int = 0


_STOP = object()


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
    ):
        assert max_pending >= 1 and max_batch >= 1, "the queue must admit at least one request"
        self.max_pending = max_pending
        self.retry_after_s = retry_after_s
        self.on_timing = on_timing  # (seconds waiting for the model thread, seconds of its forward) per request
        self.on_batch = on_batch  # (requests, tokens) per forward
        self.max_batch, self.max_batch_tokens = max_batch, max_batch_tokens
        self.pending = 0  # touched only on the event loop thread
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._host = ThreadPoolExecutor(max_workers=host_threads, thread_name_prefix="typedlm-host")
        self._thread = threading.Thread(target=self._loop, name="typedlm-model", daemon=True)
        self._thread.start()

    def _admit(self) -> None:
        if self.pending >= self.max_pending:
            raise APIError(
                503,
                "overloaded",
                f"the model is busy with {self.pending} requests; retry after {self.retry_after_s} s",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.pending += 1

    def _done(self, _future: asyncio.Future) -> None:
        self.pending -= 1

    async def _wait(self, job: _Job, timeout_s: float) -> Any:
        future = asyncio.wrap_future(job.future)
        future.add_done_callback(self._done)
        self._queue.put(job)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError as exc:
            raise APIError(504, "timeout", f"the request took longer than {timeout_s:g} s") from exc

    async def submit(self, fn: Callable[..., T], *args, timeout_s: float) -> T:
        """`fn(*args)` alone on the model thread."""
        self._admit()
        return await self._wait(_Job(Future(), time.perf_counter(), call=lambda: fn(*args)), timeout_s)

    async def submit_batch(
        self,
        prepare: Callable[[], P],
        run_batch: Callable[[list[P]], list[T]],
        tokens: Callable[[P], int],
        *,
        timeout_s: float,
    ) -> T:
        """`prepare()` on the host thread (its errors are the request's own), then the prepared item answered by
        `run_batch` on the model thread, together with the items of other requests waiting then for the same
        `run_batch`; `tokens(item)` is what the item adds to a forward."""
        self._admit()
        started = time.perf_counter()
        try:
            prepared = asyncio.get_running_loop().run_in_executor(self._host, prepare)
            item = await asyncio.wait_for(prepared, timeout_s)
        except BaseException as exc:
            self.pending -= 1
            if isinstance(exc, TimeoutError):
                raise APIError(504, "timeout", f"the request took longer than {timeout_s:g} s") from exc
            raise
        job = _Job(Future(), time.perf_counter(), run_batch=run_batch, item=item, tokens=tokens(item))
        return await self._wait(job, max(timeout_s - (time.perf_counter() - started), 0.001))

    def _loop(self) -> None:
        carried: deque = deque()  # jobs taken from the queue that did not go into the last batch, in order
        while True:
            job = carried.popleft() if carried else self._queue.get()
            if job is _STOP:
                return
            batch = [job]
            if job.run_batch is not None:
                tokens = job.tokens
                while len(batch) < self.max_batch:
                    try:
                        waiting = carried.popleft() if carried else self._queue.get_nowait()
                    except queue.Empty:
                        break
                    fits = tokens + getattr(waiting, "tokens", 0) <= self.max_batch_tokens
                    if waiting is _STOP or waiting.run_batch != job.run_batch or not fits:
                        carried.appendleft(waiting)
                        break
                    batch.append(waiting)
                    tokens += waiting.tokens
                # a power of two: batch shapes repeat (each new one is captured as a CUDA graph), the rest go next
                keep = 1 << (len(batch).bit_length() - 1)
                carried.extendleft(reversed(batch[keep:]))
                del batch[keep:]
            self._run(batch)

    def _run(self, batch: list[_Job]) -> None:
        started = time.perf_counter()
        try:
            if batch[0].call is not None:
                results = [batch[0].call()]
            else:
                results = batch[0].run_batch([job.item for job in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
            else:  # one request's fault (or a batch too big for the device) must not fail the others: each alone
                for job in batch:
                    self._answer_alone(job)
        except BaseException as exc:  # handed to every request of the batch, raised there
            for job in batch:
                job.future.set_exception(exc)
        else:
            for job, result in zip(batch, results, strict=True):
                job.future.set_result(result)
        finished = time.perf_counter()
        if self.on_batch is not None and batch[0].run_batch is not None:
            self.on_batch(len(batch), sum(job.tokens for job in batch))
        if self.on_timing is not None:
            for job in batch:
                self.on_timing(started - job.submitted, finished - started)

    @staticmethod
    def _answer_alone(job: _Job) -> None:
        """A request of a failed batch, answered by a forward of its own: its result or its own error."""
        try:
            (result,) = job.run_batch([job.item])
        except Exception as exc:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)

    def close(self) -> None:
        self._host.shutdown(wait=True)
        self._queue.put(_STOP)
        self._thread.join()
