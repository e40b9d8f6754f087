"""The cascade kernel's block table (host side, numpy): every row in exactly one block, blocks within a document."""

from __future__ import annotations

import numpy as np
import pytest

from typedlm.ops.kernel_blocks import FIELDS, block_table, block_tokens, capacity


@pytest.mark.parametrize("groups", [1, 2, 3, 7])
def test_every_row_is_in_one_block_of_its_own_document(groups):
    tokens = block_tokens(groups)
    lengths, cached, packed = [37, 0, 70, 3, 64], [5, 12, 0, 30, 1], [12, 4, 27, 2, 0]
    starts = list(np.cumsum([0, *(c + t for c, t in zip(cached, lengths))])[:-1])
    doc_rows, packed_rows = 192, 64  # padded
    rows = capacity(doc_rows, packed_rows, len(lengths), tokens)
    table = block_table(lengths, cached, starts, packed, doc_rows, packed_rows, tokens, rows)
    assert table.shape == (rows, FIELDS)
    used = table[table[:, 2] > 0]
    covered = np.zeros(doc_rows + packed_rows, dtype=int)
    doc_first = np.cumsum([0, *lengths])[:-1]
    packed_first = doc_rows + np.cumsum([0, *packed])[:-1]
    for first, real, stored, doc, t, key_start, p, is_packed in used:
        assert 0 < stored <= tokens and real in (0, stored)
        covered[first : first + stored] += 1
        if real:  # the block lies in one document's rows, which its fields name
            firsts, counts = (packed_first, packed) if is_packed else (doc_first, lengths)
            b = next(i for i in range(len(lengths)) if firsts[i] <= first < firsts[i] + counts[i])
            assert first + real <= firsts[b] + counts[b]
            assert (doc, t, key_start, p) == (doc_first[b], lengths[b], starts[b], cached[b])
        else:  # padding: after the real rows of its kind, nothing to read
            assert first >= (doc_rows + sum(packed) if is_packed else sum(lengths)) and t == p == 0
    assert (covered == 1).all(), "every row of the forward, real or padding, in exactly one block"
    real = used[used[:, 1] > 0]
    keys = real[:, 6] + np.where(real[:, 7] == 1, real[:, 4], real[:, 0] - real[:, 3] + real[:, 1])
    assert (np.diff(keys) <= 0).all(), "the blocks with the most keys first"


def test_a_table_too_small_is_refused():
    with pytest.raises(AssertionError):
        block_table([100], [0], [0], [10], 112, 16, 16, 3)
