"""`hosting.batching`: one forward's limits, kept the same way by the model worker and the batch jobs."""

from __future__ import annotations

from typedlm.hosting.batching import MAX_BATCH_TOKENS, fits, groups


def test_a_batch_takes_requests_up_to_its_count_and_its_tokens():
    assert fits(0, 0, 10 * MAX_BATCH_TOKENS, max_batch=4)  # the first always fits: a large request runs alone
    assert fits(3, 100, 50, max_batch=4, max_tokens=150)
    assert not fits(4, 100, 1, max_batch=4)  # full by count
    assert not fits(3, 100, 51, max_batch=4, max_tokens=150)  # full by tokens


def test_groups_keep_the_order_and_cut_where_a_limit_would_be_passed():
    tokens = [5, 5, 5, 12, 3, 3, 3, 3, 3, 20, 1]
    cut = list(groups(range(len(tokens)), tokens.__getitem__, max_batch=3, max_tokens=15))
    assert cut == [[0, 1, 2], [3, 4], [5, 6, 7], [8], [9], [10]]
    assert [i for group in cut for i in group] == list(range(len(tokens)))
    for group in cut:
        assert len(group) <= 3 and (len(group) == 1 or sum(tokens[i] for i in group) <= 15)
    assert list(groups([], len, max_batch=3)) == []
