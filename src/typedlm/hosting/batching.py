"""How many requests one forward answers: the limits that the model worker keeps as requests arrive (`worker`) and
that a batch job keeps over rows already read (`typedlm.jobs.batch`), in one place.

    fits(count, tokens, more, max_batch)        # may one more request of `more` tokens join this batch?
    groups(items, tokens_of, max_batch)         # items in order, cut into batches within the limits

A batch holds at most `max_batch` requests and `max_tokens` tokens; its first request always fits, so a single
request larger than `max_tokens` still runs, alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

MAX_BATCH_TOKENS = 65536  # tokens of one forward, at most (a single larger request still runs, alone)


def fits(count: int, tokens: int, more: int, max_batch: int, max_tokens: int = MAX_BATCH_TOKENS) -> bool:
    """Whether a request of `more` tokens may join a batch of `count` requests and `tokens` tokens."""
    return count == 0 or (count < max_batch and tokens + more <= max_tokens)


def groups(
    items: Iterable[T], tokens_of: Callable[[T], int], max_batch: int, max_tokens: int = MAX_BATCH_TOKENS
) -> Iterator[list[T]]:
    """`items` in their order, cut into consecutive batches within the limits (`fits`)."""
    batch: list[T] = []
    tokens = 0
    for item in items:
        more = tokens_of(item)
        if not fits(len(batch), tokens, more, max_batch, max_tokens):
            yield batch
            batch, tokens = [], 0
        batch.append(item)
        tokens += more
    if batch:
        yield batch
