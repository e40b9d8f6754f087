"""The cascade (`typedlm.ops.attention.cascade`, the path without static shapes) against one masked attention over
every key, on random queries, keys and values: documents rows, questions short and long (a long question's suffix
attended causally apart from its label tree), grouped heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from typedlm.ops import attention
from typedlm.ops.attention import CascadePlan, OwnSegments, cascade
from typedlm.ops.lse_attention import plain_attention
from typedlm.runtime.packing import PackedItem, pack
from typedlm.text.labels import LabelSet

HEADS, KV_HEADS, DIM = 4, 2, 16
TREE = LabelSet.build([[(5, 6)], [(5, 7)], [(8,)], [(9, 10, 11)]])  # siblings under the root and deeper nodes


def _reference(query, key, value, prefix_len: int, doc_rows: int, visible: np.ndarray) -> torch.Tensor:
    """Each row over the keys it may see, in one masked attention: the cached prefix, the document rows causally,
    and for packed rows every document row and their own question's rows (`visible`, [N, N])."""
    rows, keys = query.shape[2], key.shape[2]
    mask = torch.zeros(rows, keys, dtype=torch.bool)
    mask[:, :prefix_len] = True
    mask[:doc_rows, prefix_len : prefix_len + doc_rows] = torch.ones(doc_rows, doc_rows, dtype=torch.bool).tril()
    mask[doc_rows:, prefix_len : prefix_len + doc_rows] = True
    mask[doc_rows:, prefix_len + doc_rows :] = torch.from_numpy(visible)
    groups = HEADS // KV_HEADS
    k, v = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    out, _ = plain_attention(query, k, v, DIM**-0.5, mask=mask[None, None])
    return out.transpose(1, 2)  # [1, rows, H, D]


@pytest.mark.parametrize(
    ("suffixes", "split"),
    [
        ([12, 3, 40], False),  # short questions: one masked call
        ([300, 280], True),  # long ones: their suffixes causally, the trees through the mask
        ([300, 40], False),  # one group: its chain is its shortest question's
    ],
)
@pytest.mark.parametrize(("prefix_len", "doc_rows"), [(20, 10), (7, 0), (0, 5)])
def test_the_cascade_equals_one_masked_attention_over_every_key(suffixes, split, prefix_len, doc_rows, monkeypatch):
    calls = []
    own_attention = attention._own_attention
    monkeypatch.setattr(attention, "_own_attention", lambda *a: calls.append(a[3].chain) or own_attention(*a))
    batch = pack(prefix_len + doc_rows, [PackedItem(list(range(n)), TREE) for n in suffixes])
    own = tuple(
        OwnSegments(*map(torch.tensor, (index, valid, visible)), chain)
        for index, valid, visible, chain in batch.segment_groups()
    )
    plan = CascadePlan(prefix_len, doc_rows, own)
    rows = doc_rows + batch.n_rows
    generator = torch.Generator().manual_seed(len(suffixes) + prefix_len)
    query = torch.randn(1, HEADS, rows, DIM, generator=generator)
    key, value = (torch.randn(1, KV_HEADS, prefix_len + rows, DIM, generator=generator) for _ in range(2))
    got = cascade(0, query, key, value, plan)
    want = _reference(query, key, value, prefix_len, doc_rows, batch.visibility())
    assert (got - want).abs().max().item() < 1e-5
    assert (min(calls) >= attention.CHAIN_SPLIT_ROWS) == split
