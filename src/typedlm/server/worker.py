"""The model worker: forward passes run on one thread, never on the event loop, behind a bounded queue.

`submit` raises a 503 (with Retry-After) when `max_pending` requests are already running or waiting,
and a 504 when the answer takes longer than the timeout (the pass itself finishes in the background and
still counts as pending until it does). `close` waits for in-flight work: graceful shutdown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from typedlm.server.errors import APIError

T = TypeVar("T")


class ModelWorker:
    def __init__(
        self, max_pending: int, retry_after_s: int = 1, on_timing: Callable[[float, float], None] | None = None
    ):
        assert max_pending >= 1, "the queue must admit at least one request"
        self.max_pending = max_pending
        self.retry_after_s = retry_after_s
        self.on_timing = on_timing  # (seconds waiting for the thread, seconds on it) per request
        self.pending = 0  # touched only on the event loop thread
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="typedlm-model")

    def _done(self, _future: asyncio.Future) -> None:
        self.pending -= 1

    async def submit(self, fn: Callable[..., T], *args, timeout_s: float) -> T:
        if self.pending >= self.max_pending:
            raise APIError(
                503,
                "overloaded",
                f"the model is busy with {self.pending} requests; retry after {self.retry_after_s} s",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.pending += 1
        submitted = time.perf_counter()

        def timed() -> T:
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                if self.on_timing is not None:
                    self.on_timing(started - submitted, time.perf_counter() - started)

        future = asyncio.get_running_loop().run_in_executor(self._executor, timed)
        future.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError as exc:
            raise APIError(504, "timeout", f"the request took longer than {timeout_s:g} s") from exc

    def close(self) -> None:
        self._executor.shutdown(wait=True)
