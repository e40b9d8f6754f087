"""The model worker: batching of waiting requests, token budgets, errors per request or per batch, overload."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from typedlm.server.errors import APIError
from typedlm.server.worker import ModelWorker


class SlowBatches:
    """A fake model: each forward takes `seconds` and answers every item with its double."""

    def __init__(self, seconds: float = 0.2):
        self.seconds, self.sizes, self.threads = seconds, [], set()

    def __call__(self, items: list[int]) -> list[int]:
        self.sizes.append(len(items))
        self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)
        return [2 * item for item in items]


async def _ask(worker: ModelWorker, model, item: int, tokens: int = 1, timeout_s: float = 30.0):
    return await worker.submit_batch(lambda: item, model, lambda _: tokens, timeout_s=timeout_s)


def test_requests_waiting_during_a_forward_are_answered_together():
    async def main():
        worker, model = ModelWorker(max_pending=32), SlowBatches()
        first = asyncio.create_task(_ask(worker, model, 0))
        await asyncio.sleep(0.05)  # the first forward runs: the next nine wait for it
        rest = [asyncio.create_task(_ask(worker, model, i)) for i in range(1, 10)]
        results = await asyncio.gather(first, *rest)
        worker.close()
        return results, model

    results, model = asyncio.run(main())
    assert results == [2 * i for i in range(10)], "each request gets its own answer"
    assert model.sizes == [1, 8, 1], "nine waited: eight (a power of two) answered together, then the ninth"
    assert model.threads == {"typedlm-model"}


def test_batches_keep_to_the_token_budget_and_the_request_limit():
    async def main(max_batch: int, max_tokens: int):
        worker, model = ModelWorker(max_pending=32, max_batch=max_batch, max_batch_tokens=max_tokens), SlowBatches()
        first = asyncio.create_task(_ask(worker, model, 0, tokens=40))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(_ask(worker, model, i, tokens=40)) for i in range(1, 7)]
        await asyncio.gather(first, *rest)
        worker.close()
        return model.sizes

    assert asyncio.run(main(64, 100)) == [1, 2, 2, 2]  # 40 + 40 fit 100 tokens, a third does not
    assert asyncio.run(main(4, 10_000)) == [1, 4, 2]
    assert asyncio.run(main(64, 10)) == [1, 1, 1, 1, 1, 1, 1], "a request over the budget still runs, alone"


def test_a_failing_prepare_fails_only_its_request_and_a_failing_forward_its_requests():
    def refuse():
        raise ValueError("bad request")

    def broken(items):
        raise RuntimeError("model fault")

    async def main():
        worker, model = ModelWorker(max_pending=4), SlowBatches(0.01)
        with pytest.raises(ValueError, match="bad request"):
            await worker.submit_batch(refuse, model, lambda _: 1, timeout_s=5)
        assert worker.pending == 0
        assert await _ask(worker, model, 21) == 42
        failed = await asyncio.gather(*(_ask(worker, broken, i) for i in range(3)), return_exceptions=True)
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
        def __call__(self, items: list[int]) -> list[int]:
            if 13 in items:
                self.sizes.append(len(items))
                raise RuntimeError("item 13 breaks any forward it is in")
            if len(items) > 4:
                self.sizes.append(len(items))
                raise RuntimeError("out of device memory")
            return super().__call__(items)

    async def main(items: list[int]):
        worker, model = ModelWorker(max_pending=32), Picky(0.05)
        first = asyncio.create_task(_ask(worker, model, 0))
        await asyncio.sleep(0.02)  # the first forward runs: the rest wait for it and go in one batch
        rest = [asyncio.create_task(_ask(worker, model, i)) for i in items]
        results = await asyncio.gather(first, *rest, return_exceptions=True)
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
