"""The cascade kernel's block table (host side, numpy): every row in exactly one block, blocks within a document."""

from __future__ import annotations

import numpy as np
import pytest

from typedlm.ops.kernel_blocks import FIELDS, block_table, block_tokens, capacity, read_capacity, read_table


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


@pytest.mark.parametrize("groups", [1, 2, 7])
def test_every_read_is_in_one_block_of_its_own_document(groups):
    """The last layer's table over the list of read rows: each place of the list in one block, a block's reads
    one document's, padding places after the reads."""
    tokens = block_tokens(groups)
    lengths, cached, reads = [37, 0, 70, 3], [5, 12, 0, 30], [40, 1, 0, 3]
    starts = list(np.cumsum([0, *(c + t for c, t in zip(cached, lengths))])[:-1])
    listed = 52  # 8 padding places
    rows = read_capacity(listed, len(lengths), tokens)
    table = read_table(lengths, cached, starts, reads, listed, tokens, rows)
    used = table[table[:, 2] > 0]
    covered = np.zeros(listed, dtype=int)
    read_first, doc_first = np.cumsum([0, *reads])[:-1], np.cumsum([0, *lengths])[:-1]
    for first, real, stored, doc, t, key_start, p, is_packed in used:
        assert is_packed == 1 and 0 < stored <= tokens and real in (0, stored)
        covered[first : first + stored] += 1
        if real:
            b = next(i for i in range(len(reads)) if read_first[i] <= first < read_first[i] + reads[i])
            assert first + real <= read_first[b] + reads[b]
            assert (doc, t, key_start, p) == (doc_first[b], lengths[b], starts[b], cached[b])
        else:
            assert first >= sum(reads) and t == p == 0
    assert (covered == 1).all()
    with pytest.raises(AssertionError):
        read_table(lengths, cached, starts, reads, 40, tokens, rows)  # more reads than places


def test_a_table_too_small_is_refused():
    with pytest.raises(AssertionError):
        block_table([100], [0], [0], [10], 112, 16, 16, 3)
