"""The packed layout: positions, parents, visibility and the read plan."""

from __future__ import annotations

import numpy as np

from typedlm.labels import LabelSet
from typedlm.packing import PackedItem, pack


def test_layout_of_two_questions_with_a_label_tree():
    tree = LabelSet.build([[(7, 8)], [(7, 9)], [(6,)]])
    flat = LabelSet.build([[(1,)], [(2,)]])
    batch = pack(10, [PackedItem([100, 101, 102], tree), PackedItem([200, 201], flat)])
    assert batch.input_ids.tolist() == [100, 101, 102, 7, 200, 201]
    assert batch.position_ids.tolist() == [10, 11, 12, 13, 10, 11]  # each question starts after the prefix
    assert batch.parent.tolist() == [-1, 0, 1, 2, -1, 4]
    assert batch.read_rows.tolist() == [2, 3, 5]  # question 1: suffix end and node (7,); question 2: suffix end
    visible = batch.visibility()
    assert not visible[:4, 4:].any() and not visible[4:, :4].any()  # questions never see each other
    assert visible[3, :4].all()  # the label node sees its whole suffix and itself
    mask = batch.attention_mask()
    assert mask.shape == (1, 1, 6, 16) and mask[0, 0, :, :10].all()  # everyone sees the prefix
    # form (7, 9) = read at suffix end for 7, then at node (7,) for 9
    steps = list(zip(batch.step_form.tolist(), batch.step_read.tolist(), batch.step_token.tolist(), strict=True))
    assert (1, 0, 7) in steps and (1, 1, 9) in steps
    assert batch.form_group.tolist() == [0, 1, 2, 3, 4] and batch.groups_per_item == [3, 2]


def test_sliding_window_is_measured_over_positions():
    flat = LabelSet.build([[(1,)], [(2,)]])
    batch = pack(6, [PackedItem([10, 11], flat), PackedItem([20, 21, 22], flat)])
    mask = batch.attention_mask(sliding_window=3)[0, 0].numpy()
    # row 4: the second question's third token, at position 8, sees positions 6..8 = its own rows 2..4
    expected = np.zeros(11, dtype=bool)
    expected[[6 + 2, 6 + 3, 6 + 4]] = True
    assert mask[4].tolist() == expected.tolist()
    # row 2: its first token, at position 6, sees prefix positions 4 and 5 and itself
    expected = np.zeros(11, dtype=bool)
    expected[[4, 5, 6 + 2]] = True
    assert mask[2].tolist() == expected.tolist()


def test_each_row_sees_exactly_its_ancestors_and_itself():
    deep = LabelSet.build([[(1, 2, 3)], [(1, 2, 4)], [(1, 5)], [(6, 7)], [(8,)]])
    items = [PackedItem(list(range(100, 100 + n)), labels) for n, labels in [(3, deep), (1, deep), (5, deep)]]
    batch = pack(10, items)
    ancestors = np.eye(batch.n_rows, dtype=bool)
    for row, parent in enumerate(batch.parent.tolist()):
        if parent >= 0:
            ancestors[row] |= ancestors[parent]
    assert (batch.visibility() == ancestors).all()
    index, valid = batch.segment_index()
    blocks = batch.segment_visibility()
    assert not blocks[~valid].any()  # padding rows see nothing
    assert (blocks == ancestors[index[:, :, None], index[:, None, :]] & valid[:, :, None] & valid[:, None, :]).all()
