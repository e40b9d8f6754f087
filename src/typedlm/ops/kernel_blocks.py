"""Which rows each program of the cascade kernel takes: its block table, built on the host (numpy, no Triton).

`cascade_kernel` runs one program per block of rows and key/value head. A forward holds one or several
documents: document b's rows (after the documents' before it), then later its questions' packed rows, see its
own range of the key/value buffer (its cached prefix, then its rows). A block never mixes documents, so each
program reads one document's keys. Lengths vary from forward to forward within one captured shape, so the
blocks are data: a row per program, `FIELDS` integers,

    (first row, real rows, rows stored, document's first row, document's rows, key start, cached, packed)

- first row: of the forward (packed rows count after the `doc_rows` document rows);
- real rows: how many of the block's rows are real (the rest, up to `rows stored`, are padding: written as 0);
- the document's first row and rows: where its new keys lie in this forward's keys (a document block's rows see
  them causally, a packed block's rows see them all);
- key start, cached: its range in the buffer begins at `key start` with `cached` keys of cached prefix, and its
  new rows' keys are written after them;
- packed: 1 for a block of question rows, 0 for document rows.

Rows past `real rows` of every block, and whole rows of the table past the blocks used, are padding. Blocks
are listed with the most keys first, so the longest programs start first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FIELDS = 8
BLOCK_ROWS = 64  # query rows (tokens × grouped heads) per program, at most
MIN_ROWS = 16  # the matrix units' smallest tile


def group_rows(groups: int) -> int:
    """Rows a program gives each token: the query heads sharing a key/value head, rounded up to a power of two."""
    return 1 << max(groups - 1, 0).bit_length()


def block_tokens(groups: int) -> int:
    """Tokens per block for `groups` query heads per key/value head (a program has tokens × group_rows rows)."""
    rows = group_rows(groups)
    return max(BLOCK_ROWS // rows, MIN_ROWS // rows, 1)


def capacity(doc_rows: int, packed_rows: int, documents: int, tokens: int) -> int:
    """Table rows enough for any forward of these padded sizes: each document may end one block short, and
    each kind's padding takes blocks of its own."""
    return -(-doc_rows // tokens) + -(-packed_rows // tokens) + 2 * documents + 2


def _split(lengths: np.ndarray, tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranges of `lengths` in blocks of `tokens`: each block's range, its first place in it, and its length."""
    counts = -(-lengths // tokens)
    owner = np.repeat(np.arange(len(lengths)), counts)
    first = (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)) * tokens
    return owner, first, np.minimum(lengths[owner] - first, tokens)


def _padding(start: int, end: int, tokens: int) -> np.ndarray:
    """Blocks of padding rows [start, end): only zeros to write."""
    firsts = np.arange(start, end, tokens, dtype=np.int64)
    table = np.zeros((len(firsts), FIELDS), dtype=np.int64)
    table[:, 0], table[:, 2] = firsts, np.minimum(end - firsts, tokens)
    return table


def block_table(
    doc_lengths: Sequence[int],
    cached: Sequence[int],
    key_starts: Sequence[int],
    packed_lengths: Sequence[int],
    doc_rows: int,
    packed_rows: int,
    tokens: int,
    rows: int,
) -> np.ndarray:
    """The table [rows, FIELDS] (int64) for documents of `doc_lengths` new rows after `cached` keys each, whose
    buffer ranges start at `key_starts`, with `packed_lengths` packed rows each; the forward pads them to
    `doc_rows` and `packed_rows`. `rows`: the table's size (see `capacity`)."""
    lengths = np.asarray(doc_lengths, dtype=np.int64)
    cached_ = np.asarray(cached, dtype=np.int64)
    starts = np.asarray(key_starts, dtype=np.int64)
    packed = np.asarray(packed_lengths, dtype=np.int64)
    doc_first = np.cumsum(lengths) - lengths
    packed_first = np.cumsum(packed) - packed
    t, n = int(lengths.sum()), int(packed.sum())
    assert t <= doc_rows and n <= packed_rows, "more rows than the forward holds"
    kinds = []
    for kind, (firsts, counts) in enumerate(((doc_first, lengths), (doc_rows + packed_first, packed))):
        owner, first, real = _split(counts, tokens)
        table = np.empty((len(owner), FIELDS), dtype=np.int64)
        table[:, 0] = firsts[owner] + first
        table[:, 1] = table[:, 2] = real
        table[:, 3], table[:, 4] = doc_first[owner], lengths[owner]
        table[:, 5], table[:, 6] = starts[owner], cached_[owner]
        table[:, 7] = kind
        keys = cached_[owner] + (first + real if kind == 0 else lengths[owner])  # the most keys a row sees
        kinds.append((table, keys))
    blocks = np.concatenate([table for table, _ in kinds])
    keys = np.concatenate([keys for _, keys in kinds])
    blocks = blocks[np.argsort(-keys, kind="stable")]
    padding_packed = _padding(doc_rows + n, doc_rows + packed_rows, tokens)
    padding_packed[:, 7] = 1
    blocks = np.concatenate([blocks, _padding(t, doc_rows, tokens), padding_packed])
    assert len(blocks) <= rows, f"{len(blocks)} blocks for a table of {rows}"
    out = np.zeros((rows, FIELDS), dtype=np.int64)
    out[: len(blocks)] = blocks
    return out
