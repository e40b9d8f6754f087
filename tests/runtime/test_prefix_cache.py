"""The prefix cache: longest-prefix reuse across requests, LRU by bytes, identical answers with and without it."""

from __future__ import annotations

import torch

from typedlm.core.questions import ChoiceQuestion, NoulQuestion, ScoreQuestion
from typedlm.decide.decider import Decider
from typedlm.runtime.kv import PrefixKV
from typedlm.runtime.models import LoadedModel
from typedlm.runtime.prefix_cache import PrefixCache

from ..conftest import tiny_model


def kv_of(length: int, fill: float = 0.0) -> PrefixKV:
    layer = torch.full((1, 2, length, 4), fill)  # 4-byte floats: 32 bytes per token per tensor
    return PrefixKV(((layer, layer.clone()),), length)


def test_longest_prefix_match_truncates_as_views_and_counts():
    cache = PrefixCache(max_bytes=10_000)
    cache.pin([1, 2], kv_of(2))
    assert cache.lookup([9, 9]) is None  # nothing shared
    cache.insert([1, 2, 3, 4, 5], kv_of(5, 1.0))
    cache.insert([1, 2, 3, 7], kv_of(4, 2.0))
    found = cache.lookup([1, 2, 3, 4, 6])  # shares 4 tokens with the first entry
    assert found.length == 4 and float(found.layers[0][0][0, 0, 0, 0]) == 1.0
    assert found.layers[0][0].data_ptr() == cache.lookup([1, 2, 3, 4, 5]).layers[0][0].data_ptr()  # a view
    assert cache.lookup([1, 2, 8]).length == 2  # only the pinned system prompt
    stats = cache.stats()
    assert (stats["hits"], stats["partial_hits"], stats["misses"]) == (1, 1, 2)
    assert stats["entries"] == 2 and stats["bytes"] == 9 * 64


def test_least_recently_used_entries_are_evicted_by_bytes():
    cache = PrefixCache(max_bytes=64 * 10)  # room for 10 tokens
    cache.insert([1, 1, 1, 1], kv_of(4))
    cache.insert([2, 2, 2, 2], kv_of(4))
    cache.lookup([1, 1, 1, 1])  # touch the first: the second is now the oldest
    cache.insert([3, 3, 3, 3], kv_of(4))
    assert cache.lookup([2, 2, 2, 2]) is None
    assert cache.lookup([1, 1, 1, 1]).length == 4 and cache.lookup([3, 3, 3, 3]).length == 4
    cache.insert(list(range(20)), kv_of(20))  # larger than the whole budget: not kept
    assert cache.stats()["bytes"] <= 640


QUESTIONS = {
    "a": NoulQuestion("Is the customer upset?"),
    "b": ChoiceQuestion((("refund", None), ("exchange", "swap the item"), ("other", None))),
    "c": ScoreQuestion(("low", "medium", "high"), "How urgent?"),
}


def _probabilities(response) -> list[float]:
    out = []
    for answer in response.answers.values():
        if hasattr(answer, "p_yes"):
            out.append(answer.p_yes)
        else:
            values = answer.probabilities
            out += list(values.values() if isinstance(values, dict) else values)
        out.append(answer.raw_mass)
    return out


def test_answers_are_the_same_with_and_without_the_cache(tokenizer):
    model = tiny_model("qwen3", len(tokenizer), seed=3)
    cached = Decider(LoadedModel(model, tokenizer, "tiny"), calibration="raw")
    uncached = Decider(LoadedModel(model, tokenizer, "tiny"), prefix_cache_bytes=0, calibration="raw")
    turn1 = "Customer: my parcel is late."
    turn2 = turn1 + "\nAgent: sorry, let me check.\nCustomer: it was due on Monday and I need it now."

    first = cached.decide(turn1, QUESTIONS)
    again = cached.decide(turn1, QUESTIONS)  # repeated state: a hit, nothing prefilled
    assert _probabilities(first) == _probabilities(again)  # the same keys/values: bit for bit
    # usage means one thing: the whole prompt every time; what the cache served is counted apart
    assert again.usage.input_tokens == first.usage.input_tokens
    assert again.usage.cached_tokens > first.usage.cached_tokens
    assert again.to_wire()["usage"]["x_cached_tokens"] == again.usage.cached_tokens
    assert _probabilities(uncached.decide(turn1, QUESTIONS)) == _probabilities(first)

    grown = cached.decide(turn2, QUESTIONS)  # extends turn 1: only the new tokens are prefilled
    reference = uncached.decide(turn2, QUESTIONS)
    assert grown.usage.input_tokens == reference.usage.input_tokens
    assert grown.usage.cached_tokens > reference.usage.cached_tokens
    assert max(abs(a - b) for a, b in zip(_probabilities(grown), _probabilities(reference), strict=True)) < 1e-5
    stats = cached.stats()["prefix_cache"]
    assert stats["hits"] == 1 and stats["partial_hits"] == 1 and stats["misses"] == 1
    assert uncached.stats()["prefix_cache"]["entries"] == 0


def test_a_view_into_a_larger_cache_is_copied_out_so_the_budget_holds():
    # a forward's cache: 3 document tokens, then 997 rows of its questions; the prefix is a view of the first 3
    whole = torch.arange(2 * 1000 * 4, dtype=torch.float32).reshape(1, 2, 1000, 4)
    view = PrefixKV(((whole[:, :, :3], whole[:, :, :3].clone()),), 3)
    assert view.held_bytes() > 100 * view.nbytes
    cache = PrefixCache(max_bytes=10_000)
    cache.insert([1, 2, 3], view)
    stored = cache.lookup([1, 2, 3])
    assert stored.held_bytes() == stored.nbytes == cache.stats()["bytes"] == 3 * 64
    assert torch.equal(stored.layers[0][0], whole[:, :, :3]) and torch.equal(stored.layers[0][1], whole[:, :, :3])
    fitted = PrefixKV(((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)),), 3)
    assert fitted.compact() is fitted, "nothing to copy when a tensor holds only itself"
