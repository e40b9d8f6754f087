"""The model worker: batching of waiting requests, token budgets, the pipeline of launches and answers, errors per
request or per batch, overload."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from typedlm.hosting.worker import ModelWorker
from typedlm.server.errors import APIError


class SlowBatches:
    """A fake model on a fake device, as a GPU behaves: a launch returns at once, the device runs the forwards
    launched one after another, each taking `seconds`; finishing one waits for its end (then `host_s` of
    building answers) and answers every item with its double. Notes what happens, in order, in `log`. A
    forward does not finish before `opened` is set (it is, unless a test holds the forwards back)."""

    def __init__(self, seconds: float = 0.2, host_s: float = 0.0):
        self.seconds, self.host_s, self.sizes, self.threads, self.log = seconds, host_s, [], set(), []
        self.device_free_at = 0.0
        self.opened = threading.Event()
        self.opened.set()

    def __call__(self, items: list[int]):
        self.sizes.append(len(items))
        self.threads.add(threading.current_thread().name)
        self.log.append(("launch", tuple(items)))
        self.device_free_at = end = max(time.perf_counter(), self.device_free_at) + self.seconds

        def finish() -> list[int]:
            time.sleep(max(0.0, end - time.perf_counter()) + self.host_s)
            self.opened.wait(timeout=30)
            self.log.append(("answered", tuple(items)))
            return [2 * item for item in items]

        return finish


def _failing(message: str):
    """A launched forward that fails once it runs (its finish raises)."""

    def finish():
        raise RuntimeError(message)

    return finish


async def _ask(worker: ModelWorker, model, item: int, tokens: int = 1, timeout_s: float = 30.0):
    return await worker.submit_batch(lambda: item, model, lambda _: tokens, timeout_s=timeout_s)


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not condition():
        assert time.perf_counter() < deadline, "the worker never got there"
        await asyncio.sleep(0.001)


async def _first_then_waiting(worker: ModelWorker, model: SlowBatches, items: list[int], tokens: int = 1) -> list:
    """Item 0 alone in a forward that is held until `items` are all prepared and waiting for the model thread (so
    they meet the next forward together, however slow this machine is), then everyone's answers (or errors)."""
    model.opened.clear()
    first = asyncio.create_task(_ask(worker, model, 0, tokens))
    await _until(lambda: len(model.sizes) == 1)
    rest = [asyncio.create_task(_ask(worker, model, i, tokens)) for i in items]
    await _until(lambda: worker._queue.qsize() == len(items))  # the worker's own queue: what it batches next
    model.opened.set()
    return await asyncio.gather(first, *rest, return_exceptions=True)


def test_requests_waiting_during_a_forward_are_answered_together():
    async def main():
        worker, model = ModelWorker(max_pending=32, pipeline_depth=1), SlowBatches(0.01)
        results = await _first_then_waiting(worker, model, list(range(1, 10)))  # nine wait for the first forward
        worker.close()
        return results, model

    results, model = asyncio.run(main())
    assert results == [2 * i for i in range(10)], "each request gets its own answer"
    assert model.sizes == [1, 8, 1], "nine waited: eight (a power of two) answered together, then the ninth"
    assert model.threads == {"typedlm-model"}


def test_batches_keep_to_the_token_budget_and_the_request_limit():
    async def main(max_batch: int, max_tokens: int):
        worker = ModelWorker(max_pending=32, max_batch=max_batch, max_batch_tokens=max_tokens, pipeline_depth=1)
        model = SlowBatches(0.01)
        await _first_then_waiting(worker, model, list(range(1, 7)), tokens=40)
        worker.close()
        return model.sizes

    assert asyncio.run(main(64, 100)) == [1, 2, 2, 2]  # 40 + 40 fit 100 tokens, a third does not
    assert asyncio.run(main(4, 10_000)) == [1, 4, 2]
    assert asyncio.run(main(64, 10)) == [1, 1, 1, 1, 1, 1, 1], "a request over the budget still runs, alone"


def test_with_a_forward_in_flight_a_batch_waits_for_the_requests_arriving_one_after_another():
    """Requests that arrive a few milliseconds apart while another forward runs go into one batch (the wait
    ends a gap after the last of them); with the wait off the first of them is launched alone. With nothing in
    flight a request is launched at once, however long the gap."""

    async def main(gap_s: float):
        worker, model = ModelWorker(max_pending=32, pipeline_depth=2, gather_gap_s=gap_s), SlowBatches(0.6)
        await _ask(worker, model, 0)  # one forward measured: the wait is at most a share of its time
        running = asyncio.create_task(_ask(worker, model, 1))
        await _until(lambda: len(model.sizes) == 2)
        arriving = []
        for i in range(2, 6):  # one after another, 10 ms apart, while forward 1 runs
            arriving.append(asyncio.create_task(_ask(worker, model, i)))
            await asyncio.sleep(0.01)
        results = await asyncio.gather(running, *arriving)
        worker.close()
        return results, model.sizes

    results, sizes = asyncio.run(main(0.1))
    assert results == [2, 4, 6, 8, 10]
    assert sizes == [1, 1, 4], "the four arriving during forward 1 were answered together"
    results, sizes = asyncio.run(main(0.0))
    assert results == [2, 4, 6, 8, 10]
    assert sizes[:3] == [1, 1, 1], "without the wait the first to arrive went alone"

    async def alone() -> float:
        worker, model = ModelWorker(max_pending=4, pipeline_depth=2, gather_gap_s=5.0), SlowBatches(0.05)
        await _ask(worker, model, 0)
        started = time.perf_counter()
        await _ask(worker, model, 1)
        seconds = time.perf_counter() - started
        worker.close()
        return seconds

    assert asyncio.run(alone()) < 2.5, "nothing in flight: no wait"


def test_a_failing_prepare_fails_only_its_request_and_a_failing_forward_its_requests():
    def refuse():
        raise ValueError("bad request")

    def broken(items):
        raise RuntimeError("model fault")

    def broken_on_the_device(items):
        return _failing("device fault")

    async def main():
        worker, model = ModelWorker(max_pending=4), SlowBatches(0.01)
        with pytest.raises(ValueError, match="bad request"):
            await worker.submit_batch(refuse, model, lambda _: 1, timeout_s=5)
        assert worker.pending == 0
        assert await _ask(worker, model, 21) == 42
        for fault in (broken, broken_on_the_device):  # failing as it is launched, or once it runs
            failed = await asyncio.gather(*(_ask(worker, fault, i) for i in range(3)), return_exceptions=True)
            assert all(isinstance(result, RuntimeError) for result in failed)
            assert await _ask(worker, model, 5) == 10, "the model thread survives a failed forward"
        await asyncio.sleep(0.01)
        assert worker.pending == 0
        worker.close()

    asyncio.run(main())


def test_a_failed_batch_is_answered_again_one_request_at_a_time():
    """A batch whose forward fails is run again request by request: a request that fails on its own gets its error,
    the others their answers; a batch that fails only for its size (memory) answers everyone."""

    class Picky(SlowBatches):
        def __call__(self, items: list[int]):
            if 13 in items:  # as it is launched
                self.sizes.append(len(items))
                raise RuntimeError("item 13 breaks any forward it is in")
            finish = super().__call__(items)
            return _failing("out of device memory") if len(items) > 4 else finish  # once it runs

    async def main(items: list[int]):
        worker, model = ModelWorker(max_pending=32, pipeline_depth=1), Picky(0.01)
        results = await _first_then_waiting(worker, model, items)  # the rest wait for the first, go in one batch
        worker.close()
        return results[1:], model.sizes

    results, sizes = asyncio.run(main([1, 2, 13, 4]))
    assert results[:2] == [2, 4] and results[3] == 8
    assert isinstance(results[2], RuntimeError) and "13" in str(results[2])
    assert sizes == [1, 4, 1, 1, 1, 1], "the batch of four failed, then each ran alone"
    results, sizes = asyncio.run(main(list(range(1, 9))))
    assert results == [2 * i for i in range(1, 9)], "a batch too large is answered request by request"
    assert sizes == [1, 8, *[1] * 8]


def test_overload_answers_503_and_slow_answers_504():
    async def main():
        worker, model = ModelWorker(max_pending=2), SlowBatches(0.5)
        running = [asyncio.create_task(_ask(worker, model, i)) for i in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as overloaded:
            await _ask(worker, model, 9)
        assert overloaded.value.status == 503 and overloaded.value.headers["Retry-After"] == "1"
        await asyncio.gather(*running)
        with pytest.raises(APIError) as slow:
            await _ask(worker, model, 1, timeout_s=0.1)
        assert slow.value.status == 504
        worker.close()  # waits for the forward that timed out

    asyncio.run(main())


def test_requests_are_prepared_on_several_host_threads_at_once():
    """Two requests whose preparing waits for the other's: done only when two host threads prepare at once (with
    one, the barrier breaks and both requests fail)."""
    barrier = threading.Barrier(2, timeout=5)

    def prepare(item: int) -> int:
        barrier.wait()
        return item

    async def main(host_threads: int):
        worker, model = ModelWorker(max_pending=8, host_threads=host_threads), SlowBatches(0.01)
        asks = [worker.submit_batch(lambda i=i: prepare(i), model, lambda _: 1, timeout_s=30) for i in (1, 2)]
        try:
            return await asyncio.gather(*asks, return_exceptions=True)
        finally:
            worker.close()

    assert asyncio.run(main(2)) == [2, 4]
    barrier.reset()
    assert all(isinstance(r, threading.BrokenBarrierError) for r in asyncio.run(main(1)))


def test_the_next_forward_is_launched_while_the_last_ones_answers_are_built():
    """Two forwards in flight: the second request's forward is launched before the first's answers are done, so
    the device runs it while the host finishes the first (with `pipeline_depth=1`, strictly one after another).
    Launches happen on the model thread, answers on the finishing thread."""

    async def main(depth: int):
        worker = ModelWorker(max_pending=8, max_batch=1, pipeline_depth=depth)
        model = SlowBatches(0.1, host_s=0.1)
        results = await asyncio.gather(*(_ask(worker, model, i) for i in range(4)))
        worker.close()
        return results, model

    results, model = asyncio.run(main(2))
    assert results == [0, 2, 4, 6]
    assert model.log[:5] == [
        ("launch", (0,)),
        ("launch", (1,)),
        ("answered", (0,)),
        ("launch", (2,)),
        ("answered", (1,)),
    ]
    assert model.threads == {"typedlm-model"}
    results, model = asyncio.run(main(1))
    assert results == [0, 2, 4, 6]
    assert model.log == [(event, (i,)) for i in range(4) for event in ("launch", "answered")]


def test_the_model_threads_waits_say_which_side_sets_the_pace():
    """Forwards slower than the requests come: the model thread waits for a slot. Nothing asked: it waits for a
    request, and the wait going on counts as far as it went (a scrape during an idle spell sees it grow)."""

    async def main():
        worker = ModelWorker(max_pending=16, max_batch=1, pipeline_depth=1)
        model = SlowBatches(0.05)
        await asyncio.gather(*(_ask(worker, model, i) for i in range(5)))  # five at once, one forward each
        busy = worker.stats()
        await asyncio.sleep(0.3)
        idle = worker.stats()
        worker.close()
        return busy, idle

    busy, idle = asyncio.run(main())
    assert busy["waited_for_slot_seconds"] >= 0.15, "behind at least three forwards of 0.05 s"
    assert busy["waited_for_requests_seconds"] < busy["waited_for_slot_seconds"]
    assert idle["waited_for_requests_seconds"] - busy["waited_for_requests_seconds"] >= 0.25
    assert idle["waited_for_slot_seconds"] >= busy["waited_for_slot_seconds"], "a counter never goes back"


def test_pipelined_batches_answer_every_request_and_retry_a_failed_batch_alone():
    """With two forwards in flight (the default), batches still answer each request with its own result, a
    request that breaks its batch gets its error, the others their answers."""

    class Picky(SlowBatches):
        def __call__(self, items: list[int]):
            if 13 in items and len(items) > 1:
                raise RuntimeError("item 13 breaks any forward it is in")
            finish = super().__call__(items)
            return _failing("13 alone fails too") if 13 in items else finish

    async def main():
        worker, model = ModelWorker(max_pending=64), Picky(0.02)
        results = await asyncio.gather(*(_ask(worker, model, i) for i in range(30)), return_exceptions=True)
        worker.close()
        return results, model

    results, model = asyncio.run(main())
    assert [r for i, r in enumerate(results) if i != 13] == [2 * i for i in range(30) if i != 13]
    assert isinstance(results[13], RuntimeError)
    assert max(model.sizes) > 1, "requests waiting were batched"


def test_a_call_of_its_own_runs_once_the_forwards_in_flight_are_done():
    async def main():
        worker, model = ModelWorker(max_pending=8), SlowBatches(0.1)
        batched = [asyncio.create_task(_ask(worker, model, i)) for i in range(2)]
        await _until(lambda: len(model.log) > 0)  # a forward launched
        alone = await worker.submit(lambda: list(model.log), timeout_s=5)
        await asyncio.gather(*batched)
        worker.close()
        return alone

    seen = asyncio.run(main())
    assert [event for event, _ in seen].count("launch") == [event for event, _ in seen].count("answered") >= 1


def test_close_waits_for_the_forwards_in_flight_and_a_failing_callback_stops_nothing():
    """Graceful shutdown with two forwards in flight: `close` returns once both are answered. A metrics callback
    that raises is logged on the finishing thread, which goes on answering."""

    def broken_callback(requests: int, tokens: int) -> None:
        raise RuntimeError("metrics fault")

    async def main():
        worker, model = ModelWorker(max_pending=8, max_batch=1, on_batch=broken_callback), SlowBatches(0.1)
        asks = [asyncio.create_task(_ask(worker, model, i)) for i in range(3)]
        await _until(lambda: len(model.sizes) == 2 and worker._queue.qsize() == 1)  # two launched, one waiting

        def close() -> list:
            worker.close()
            return [items for what, items in model.log if what == "answered"]  # as close returns, on its thread

        answered = await asyncio.get_running_loop().run_in_executor(None, close)
        assert sorted(answered) == [(0,), (1,), (2,)], "close returned before every request was answered"
        return await asyncio.wait_for(asyncio.gather(*asks), 5)  # settled: the event loop only has to see it

    assert asyncio.run(main()) == [0, 2, 4]


def test_a_request_is_in_the_metrics_by_the_time_it_is_answered():
    """The metrics callbacks run before a request's future is settled: a scrape right after a response counts it,
    however slow the callback (for a batched request and for a call of its own)."""
    recorded: list[str] = []

    def slow(kind: str):
        def callback(*_):
            time.sleep(0.05)
            recorded.append(kind)

        return callback

    async def main():
        worker = ModelWorker(max_pending=8, on_batch=slow("batch"), on_timing=slow("timing"))
        model = SlowBatches(0.01)
        answered = await _ask(worker, model, 3)
        seen_after_batch = list(recorded)
        await worker.submit(lambda: None, timeout_s=5)
        seen_after_call = list(recorded)
        worker.close()
        return answered, seen_after_batch, seen_after_call

    answered, seen_after_batch, seen_after_call = asyncio.run(main())
    assert answered == 6
    assert seen_after_batch == ["batch", "timing"]
    assert seen_after_call == ["batch", "timing", "timing"]


def test_a_finished_batch_leaves_nothing_of_its_forward_behind():
    # a forward's work (on a real model: its whole key/value cache, as views) lived on in the finishing thread's
    # locals until the next batch arrived: an idle server kept its last request's memory
    import weakref

    class Held:
        """Stands for what a launched forward holds until it is finished."""

    held: list[weakref.ref] = []

    def launch(items: list[int]):
        work = Held()
        held.append(weakref.ref(work))

        def finish() -> list[int]:
            assert work is not None
            return [2 * item for item in items]

        return finish

    async def run() -> None:
        worker = ModelWorker(max_pending=4, max_batch=1)
        try:
            assert await _ask(worker, launch, 3) == 6
            await _until(lambda: worker._finished == 1)
            await _until(lambda: held[0]() is None, timeout_s=5)
        finally:
            worker.close()

    asyncio.run(run())
