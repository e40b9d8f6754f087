"""What the app answers with: a `ServedModel`, the model behind the routes, in this process or in one of its own.

    InProcessModel(decider, settings)     # the decider here, behind the model worker (`worker.ModelWorker`)
    ModelProcess(load, settings)          # the same in a process of its own (`model_process`; `typedlm serve`)

Either way the app sees the same surface: the model's name and description, the requests it may batch, the
requests pending, its counters, `answer` (a request's state and questions → its `Response`, or the error it
raised; its answers held for labels by id, each with its id, where the decider keeps feedback), `feedback` (a
feedback post → its body: by answer id, its labels stored from the answers held, with no forward; else the request
answered as any other, then its labels stored and learned off the model thread), `suggest_labels` (what to label
next), `feedback_report` and `close`. The app sets `on_timing` and `on_batch` to its metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from typedlm.core.answers import Response
from typedlm.core.description import ModelDescription
from typedlm.core.errors import AnswerNotHeld
from typedlm.core.labeling import FeedbackPost, LabelsById
from typedlm.core.questions import FeedbackRequest, Handover, Question, Text
from typedlm.core.settings import ServerSettings
from typedlm.hosting.worker import ModelWorker

Stats = dict[str, dict[str, float]]  # counters and sizes by group


class DeciderLike(Protocol):
    """What the server needs of a decider, all of it (`typedlm.Decider` has it; so does the tests' stand-in). A
    request is prepared on a host thread (`prepare_request`: every check that can refuse it), then answered on the
    model thread together with others (`launch_prepared`, at most `max_batch` at a time; 1 where the decider runs
    one document per forward)."""

    name: str
    max_batch: int

    def describe(self) -> ModelDescription: ...

    def prepare_request(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: str | None = None,
        order_reads: int | None = None,
        keep_reading: bool = False,
        priors: bool = False,
        handover: Handover | None = None,
        remember: bool = False,
    ) -> Any: ...  # a prepared request; its `tokens` are what it adds to a forward

    def launch_prepared(self, requests: Sequence[Any]) -> Callable[[], list[Response]]: ...

    def record_feedback(self, posted: FeedbackRequest, response: Response) -> dict[str, Any]: ...

    def label_by_id(self, posted: LabelsById) -> dict[str, Any]: ...

    def suggest_labels(self, family: str | None, n: int) -> dict[str, Any]: ...

    def feedback_report(self) -> dict[str, Any]: ...

    def stats(self) -> Stats: ...

    def close(self) -> None: ...


@runtime_checkable
class ServedModel(Protocol):
    name: str
    max_batch: int  # requests one forward may answer (within --max-batch, what the decider can)
    max_pending: int  # requests running or waiting; more get 503
    on_timing: Callable[[float, float], None] | None  # (seconds waiting for the model thread, seconds of its forward)
    on_batch: Callable[[int, int], None] | None  # (requests, tokens) per forward
    failure: str | None  # why the model cannot answer any more (its process is gone), else None

    @property
    def pending(self) -> int: ...

    def describe(self) -> ModelDescription: ...

    def stats(self) -> Stats: ...

    async def answer(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: str | None,
        order_reads: int | None,
        handover: Handover | None = None,
    ) -> Response: ...

    async def feedback(self, posted: FeedbackPost) -> dict[str, Any]: ...

    async def suggest_labels(self, family: str | None, n: int) -> dict[str, Any]: ...

    async def feedback_report(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class InProcessModel:
    """A decider in this process behind a model worker: requests prepared on host threads, answered on the model
    thread, several in one forward where the decider can (`worker`)."""

    def __init__(self, decider: DeciderLike, settings: ServerSettings):
        self.decider, self.name = decider, decider.name
        self.timeout_s = settings.request_timeout_s
        max_batch = min(settings.max_batch, decider.max_batch)
        self.worker = ModelWorker(settings.max_queue, settings.retry_after_s, max_batch=max_batch)
        self.max_batch, self.max_pending = self.worker.max_batch, self.worker.max_pending
        self.failure = None  # a model in this process lives as long as the server
        # feedback posts are stored and learned here, never on the model thread (answering never waits for a refit)
        self.feedback_thread = ThreadPoolExecutor(1, "typedlm-feedback")

    @property
    def pending(self) -> int:
        return self.worker.pending

    @property
    def on_timing(self) -> Callable[[float, float], None] | None:
        return self.worker.on_timing

    @on_timing.setter
    def on_timing(self, callback: Callable[[float, float], None] | None) -> None:
        self.worker.on_timing = callback

    @property
    def on_batch(self) -> Callable[[int, int], None] | None:
        return self.worker.on_batch

    @on_batch.setter
    def on_batch(self, callback: Callable[[int, int], None] | None) -> None:
        self.worker.on_batch = callback

    def describe(self) -> ModelDescription:
        return self.decider.describe()

    def stats(self) -> Stats:
        return {**self.decider.stats(), "model_thread": self.worker.stats()}

    async def answer(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: str | None,
        order_reads: int | None,
        handover: Handover | None = None,
    ) -> Response:
        return await self.worker.wait_for(
            lambda: self.start_answer(state, questions, calibration, order_reads, handover), self.timeout_s
        )

    def start_answer(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: str | None,
        order_reads: int | None,
        handover: Handover | None = None,
    ) -> Future:
        """A request as the server asks it (`start`): its answers held for labels by id, where the decider keeps
        feedback."""
        return self.start(state, questions, calibration, order_reads, handover, remember=True)

    def start(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: str | None,
        order_reads: int | None,
        handover: Handover | None = None,
        keep_reading: bool = False,
        remember: bool = False,
    ) -> Future:
        """The request queued from any thread, with no admission or timeout (the caller's): a future of its
        `Response`. Prepared on a host thread, then answered on the model thread, batched where the decider can;
        `remember`: its answers held for labels by id (`Decider.prepare_request`)."""
        return self.worker.put(
            lambda: self.decider.prepare_request(
                state, questions, calibration, order_reads, keep_reading, handover=handover, remember=remember
            ),
            self.decider.launch_prepared,
            lambda prepared: prepared.tokens,
        )

    async def feedback(self, posted: FeedbackPost) -> dict[str, Any]:
        return await self.worker.wait_for(lambda: self.start_feedback(posted), self.timeout_s)

    async def suggest_labels(self, family: str | None, n: int) -> dict[str, Any]:
        return await asyncio.wrap_future(self.start_suggestions(family, n))

    async def feedback_report(self) -> dict[str, Any]:
        return await asyncio.wrap_future(self.start_report())

    def start_feedback(self, posted: FeedbackPost) -> Future:
        """A feedback post queued from any thread. By answer id: its labels stored and learned on the feedback
        thread from the answers held (no forward); where an id is not held and the post sent its state and
        questions too, and for a post of old, its request answered like any other (same queue, same batches, its
        reads kept), then its labels stored and learned on the feedback thread. A future of its body."""
        if not isinstance(posted, LabelsById):
            return self._answer_and_record(posted)
        done: Future = Future()

        def by_id() -> dict[str, Any] | None:
            try:
                return self.decider.label_by_id(posted)
            except AnswerNotHeld:
                if posted.fallback is None:
                    raise
                return None  # answered again below

        def then(labeled: Future) -> None:
            if labeled.exception() is not None or labeled.result() is not None:
                _chain(labeled, done)
            else:
                self._answer_and_record(posted.fallback).add_done_callback(lambda f: _chain(f, done))

        self.feedback_thread.submit(by_id).add_done_callback(then)
        return done

    def _answer_and_record(self, posted: FeedbackRequest) -> Future:
        """A post of old: its request answered, its reads kept, then its labels stored on the feedback thread."""
        request = posted.request
        answered = self.start(
            request.state, request.questions, request.calibration, request.order_reads, request.handover, True
        )
        done: Future = Future()

        def record(answer: Future) -> None:
            if answer.exception() is not None:
                done.set_exception(answer.exception())
                return
            recorded = self.feedback_thread.submit(self.decider.record_feedback, posted, answer.result())
            recorded.add_done_callback(lambda f: _chain(f, done))

        answered.add_done_callback(record)
        return done

    def start_suggestions(self, family: str | None, n: int) -> Future:
        """What to label next (`Decider.suggest_labels`), on the feedback thread: a future of its body."""
        return self.feedback_thread.submit(self.decider.suggest_labels, family, n)

    def start_report(self) -> Future:
        """The feedback report, built on the feedback thread: a future of its body."""
        return self.feedback_thread.submit(self.decider.feedback_report)

    def close(self) -> None:
        """Finish the forwards in flight and the feedback posts, then close the feedback database."""
        self.worker.close()
        self.feedback_thread.shutdown(wait=True)
        self.decider.close()


def _chain(source: Future, target: Future) -> None:
    """Settle `target` as `source` was settled."""
    if source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())
