"""The model in a process of its own, so that the HTTP server's work and the model's run on two interpreter locks.

    model = ModelProcess(functools.partial(load, options), settings)   # returns once the model is loaded
    app = create_app(model, settings)
    ...                                                                # serve the app
    model.close()                                                      # the forwards in flight finished first

In one process the event loop (HTTP, JSON, validation, the response: about 1.7 ms of CPU per request) and the
model's threads (tokenizing, packing, launching forwards, building answers) take turns on one interpreter lock; under
load the GPU then waits for the lock (docs/performance.md, "Many clients"). Here the server's process only parses,
validates and answers HTTP; the model process (`run_model_process`) runs an `InProcessModel`, its worker, batching
and pipeline as they are in one process.

Messages, pickled over one pipe:

    to the model     ("ask", id, state, questions, calibration, order_reads, handover),
                     ("feedback", id, feedback post), ("suggest", id, family, n), ("report", id), ("close",)
    from the model   once after loading: ("ready", name, description, max_batch, stats) or ("failed", error);
                     ("answer", id, response or feedback body or suggestions or report) or ("error", id, error,
                     stats) per request; ("timing", wait_s, run_s) per request and ("batch", requests, tokens,
                     stats) per forward, for the metrics; ("stats", stats) before the answer to a feedback post or a
                     suggestion (one by answer id runs no forward); ("closed",) last

`load` (no arguments → a decider) is pickled into the new process: a module-level function or a `functools.partial`
of one. The process is spawned, not forked (the server's threads and sockets stay behind). Admission (503 past
`max_queue`) and the timeout (504) are this side's, as with the model in process; a request that timed out counts
as pending until the model is done with it. If the model process dies, the requests waiting and every later one get
a 503 ("model_unavailable"), `failure` says why, and `on_exit` is called (`typedlm serve` then shuts down, so that a
supervisor restarts it). A dead server leaves the model process its pipe's end: it finishes and exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import itertools
import logging
import multiprocessing
import pickle
import signal
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from typedlm.core.answers import Response
from typedlm.core.bounded import resident_bytes
from typedlm.core.description import ModelDescription
from typedlm.core.errors import ModelError
from typedlm.core.labeling import FeedbackPost
from typedlm.core.questions import Handover, Question, Text
from typedlm.core.settings import ServerSettings
from typedlm.hosting.heap import MODEL_MMAP_THRESHOLD_BYTES, freeze_start_up_objects, return_freed_memory
from typedlm.hosting.served import DeciderLike, InProcessModel, Stats
from typedlm.hosting.status import APIError, error_status, overloaded, timed_out
from typedlm.hosting.threads import on_passing_thread
from typedlm.hosting.worker import resolve

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 120.0  # the model process's time to finish its forwards and exit on `close`, else it is killed


class ModelProcess:
    """The `ServedModel` whose decider is loaded by `load()` in a process of its own (see the module)."""

    def __init__(
        self,
        load: Callable[[], DeciderLike],
        settings: ServerSettings,
        on_exit: Callable[[], None] | None = None,
    ):
        context = multiprocessing.get_context("spawn")
        self._conn, theirs = context.Pipe()
        self._process = context.Process(
            target=run_model_process, args=(load, settings, theirs), name="typedlm-model", daemon=False
        )
        self._process.start()
        theirs.close()
        try:
            ready = self._conn.recv()
        except EOFError:
            self._process.join()
            raise ModelError(f"the model process exited while loading (exit code {self._process.exitcode})") from None
        except BaseException:  # Ctrl-C while loading
            self._process.kill()
            self._process.join()
            raise
        if ready[0] == "failed":
            self._process.join()
            raise ready[1]
        _, self.name, self._description, self.max_batch, self._stats = ready
        self.max_pending, self.retry_after_s = settings.max_queue, settings.retry_after_s
        self.timeout_s = settings.request_timeout_s
        self.on_timing: Callable[[float, float], None] | None = None
        self.on_batch: Callable[[int, int], None] | None = None
        self.on_exit = on_exit
        self.failure: str | None = None  # why the model process is gone, once it is
        self.pending = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()  # `pending`, `_waiting` and `failure`
        self._sending = threading.Lock()  # the pipe's sending end (never held by the reader thread: it always reads)
        self._closing = False
        atexit.register(self.close)  # a process left running would keep the interpreter from exiting
        self._reader = threading.Thread(target=self._read, name="typedlm-model-replies", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def describe(self) -> ModelDescription:
        return self._description

    def stats(self) -> Stats:
        """The model's counters as of its last forward or refusal, its process's resident memory read now."""
        stats = self._stats
        if "process" in stats and self._process.pid is not None:
            stats = {**stats, "process": {**stats["process"], "resident_bytes": resident_bytes(self._process.pid)}}
        return stats

    async def answer(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: str | None,
        order_reads: int | None,
        handover: Handover | None = None,
    ) -> Response:
        return await self._ask("ask", state, questions, calibration, order_reads, handover)

    async def feedback(self, posted: FeedbackPost) -> dict[str, Any]:
        return await self._ask("feedback", posted)

    async def suggest_labels(self, family: str | None, n: int) -> dict[str, Any]:
        return await self._ask("suggest", family, n)

    async def feedback_report(self) -> dict[str, Any]:
        return await self._ask("report")

    async def _ask(self, kind: str, *arguments: Any) -> Any:
        """Send one request (`kind` and its arguments) and wait for its reply, as admitted and timed here."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        future.add_done_callback(_retrieved)
        with self._lock:
            if self.failure is not None:
                raise APIError(503, "model_unavailable", self.failure)
            if self._closing:
                raise APIError(503, "model_unavailable", "the server is shutting down")
            if self.pending >= self.max_pending:
                raise overloaded(self.pending, self.retry_after_s)
            request_id = next(self._ids)
            self._waiting[request_id] = future
            self.pending += 1
        # the model process gone: its reader thread answers every request waiting
        with self._sending, contextlib.suppress(OSError, ValueError):
            self._conn.send((kind, request_id, *arguments))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError as exc:
            raise timed_out(self.timeout_s) from exc

    def _read(self) -> None:
        """The reader thread: every message from the model process, until it closes or dies."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                if not self._closing:
                    self._exited()
                return
            kind = message[0]
            if kind in ("answer", "error"):
                if kind == "error":
                    self._stats = message[3]
                self._settle(message[1], kind == "answer", message[2])
            elif kind == "timing":
                if self.on_timing is not None:
                    self.on_timing(message[1], message[2])
            elif kind == "batch":
                self._stats = message[3]
                if self.on_batch is not None:
                    self.on_batch(message[1], message[2])
            elif kind == "stats":
                self._stats = message[1]
            elif kind == "closed":
                return

    def _settle(self, request_id: int, ok: bool, outcome: Any) -> None:
        with self._lock:
            future = self._waiting.pop(request_id)
            self.pending -= 1
        _resolve_soon(future, ok, outcome)

    def _exited(self) -> None:
        self._process.join(timeout=5)
        failure = f"the model process exited (exit code {self._process.exitcode}); the server must be restarted"
        logger.error("typedlm: %s", failure)
        with self._lock:
            self.failure = failure
            waiting, self._waiting, self.pending = list(self._waiting.values()), {}, 0
        for future in waiting:
            _resolve_soon(future, False, APIError(503, "model_unavailable", failure))
        if self.on_exit is not None:
            self.on_exit()

    def close(self) -> None:
        """Let the model process answer what it was asked, close its worker and exit (killed after
        CLOSE_TIMEOUT_S)."""
        if self._closing:
            return
        atexit.unregister(self.close)
        with self._lock:
            self._closing = True
            failed = self.failure is not None
        if not failed:
            with self._sending, contextlib.suppress(OSError, ValueError):
                self._conn.send(("close",))
        self._reader.join(timeout=CLOSE_TIMEOUT_S)
        self._process.join(timeout=CLOSE_TIMEOUT_S)
        if self._process.is_alive():
            logger.error("typedlm: the model process did not exit in %g s; killed", CLOSE_TIMEOUT_S)
            self._process.kill()
            self._process.join()
        self._conn.close()


def _resolve_soon(future: asyncio.Future, ok: bool, outcome: Any) -> None:
    """Settle `future` on its event loop (from the reader thread); a loop closed meanwhile has nobody waiting."""
    with contextlib.suppress(RuntimeError):
        future.get_loop().call_soon_threadsafe(resolve, future, ok, outcome)


def _retrieved(future: asyncio.Future) -> None:
    """Mark an error as seen: one whose request already timed out would be logged as never retrieved."""
    if not future.cancelled():
        future.exception()


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling (typedlm's errors and APIError do, with their fields), else a RuntimeError that
    names it (the server answers either as it would the original: a 500 for anything not the request's fault)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def run_model_process(load: Callable[[], DeciderLike], settings: ServerSettings, conn) -> None:
    """The model process's main: load the decider, say so, answer requests until told to close (or until the
    server's end of the pipe is gone), then finish what was asked and exit. No event loop: this thread reads the
    pipe and queues each request on the worker (`InProcessModel.start`); the thread that settles a request (the
    worker's finishing thread, or a host thread when preparing fails) sends its reply."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the server closes us
    return_freed_memory(MODEL_MMAP_THRESHOLD_BYTES)  # a large forward's blocks go back as freed; the rest when idle
    try:
        model = InProcessModel(on_passing_thread(load), settings)
    except BaseException as exc:
        conn.send(("failed", portable(exc)))
        return
    freeze_start_up_objects()  # the model and its imports, out of the collector's walks (`heap`)
    lock = threading.Lock()  # replies and metrics come from several threads

    def send(message: tuple) -> None:
        with lock, contextlib.suppress(OSError, ValueError):  # the server gone: finish what was asked, then exit
            conn.send(message)

    def reply(request_id: int, done: Future, counted: bool = False) -> None:
        error = done.exception()
        if error is None:
            if counted:  # the answers held and labeled by id, before the reply: a scrape after it counts it
                send(("stats", model.stats()))
            send(("answer", request_id, done.result()))
            return
        if error_status(error)[0] >= 500:
            logger.error("typedlm: answering a request failed", exc_info=error)  # a 500: its traceback here
        send(("error", request_id, portable(error), model.stats()))  # a refusal may have filled caches too

    model.on_timing = lambda wait_s, run_s: send(("timing", wait_s, run_s))
    model.on_batch = lambda requests, tokens: send(("batch", requests, tokens, model.stats()))
    starts = {
        "ask": model.start_answer,
        "feedback": model.start_feedback,
        "suggest": model.start_suggestions,
        "report": model.start_report,
    }
    send(("ready", model.name, model.describe(), model.max_batch, model.stats()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        kind, *request = message
        if kind not in starts:
            break
        request_id, *arguments = request
        try:
            started = starts[kind](*arguments)
        except BaseException as exc:  # the worker refused it (closing): the request's error
            send(("error", request_id, portable(exc), model.stats()))
            continue
        started.add_done_callback(functools.partial(reply, request_id, counted=kind in ("feedback", "suggest")))
    model.close()  # every request asked is answered before it returns
    send(("closed",))
    conn.close()
