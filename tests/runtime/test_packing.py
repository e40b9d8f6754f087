"""The packed layout: positions, parents, visibility and the read plan."""

from __future__ import annotations

import numpy as np

from typedlm.runtime.packing import BATCH_LAYOUTS, ITEM_LAYOUTS, PackedItem, _layout, pack
from typedlm.text.labels import LabelSet


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
    assert batch.form_group.tolist() == [0, 1, 2, 3, 4] and batch.groups_per_item == (3, 2)


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


def test_a_small_batch_is_one_group_of_segments_in_their_order():
    flat = LabelSet.build([[(1,)], [(2,)]])
    batch = pack(10, [PackedItem(list(range(n)), flat) for n in [40, 3, 200, 5]])  # 4 x 200^2 entries: small
    ((index, valid, blocks, chain),) = batch.segment_groups()
    assert chain == 3  # the shortest question, its rows one chain (one-token labels: no tree rows)
    assert index.shape == (4, 200) and valid.sum(axis=1).tolist() == [40, 3, 200, 5]
    assert (blocks == batch.segment_visibility()).all()


def test_segment_groups_cover_every_row_once_padded_to_their_own_longest(monkeypatch):
    # one long question among short ones: grouped by length, no short one is padded to the long one's rows
    monkeypatch.setattr("typedlm.runtime.packing.GROUP_ENTRIES", 0)  # as a large batch is
    flat = LabelSet.build([[(1,)], [(2,)]])
    lengths = [40, 3, 200, 5, 90, 101, 4]
    batch = pack(10, [PackedItem(list(range(n)), flat) for n in lengths])
    ancestors = batch.visibility()
    groups = batch.segment_groups()
    assert [index.shape[1] for index, _, _, _ in groups] == [200, 90, 40, 5]  # longest first, each over half its first
    seen = np.concatenate([index[valid] for index, valid, _, _ in groups])
    assert sorted(seen.tolist()) == list(range(batch.n_rows))  # every packed row in exactly one segment
    for index, valid, blocks, chain in groups:
        assert (valid.sum(axis=1) * 2 > index.shape[1]).all()  # padding at most doubles a segment
        assert not blocks[~valid].any()
        assert (blocks == ancestors[index[:, :, None], index[:, None, :]] & valid[:, :, None] & valid[:, None, :]).all()
        assert chain == min(_causal_rows(block) for block in blocks)


def _causal_rows(block: np.ndarray) -> int:
    """The leading rows of a segment's mask that each see every row before them (brute force)."""
    return next((i for i in range(len(block)) if not block[i, : i + 1].all()), len(block))


def test_the_chain_is_each_questions_suffix_where_it_sees_every_row_before_it():
    tree = LabelSet.build([[(5, 6)], [(5, 7)], [(8,)]])  # a shared first token: a node with two children
    lengths = [300, 2, 280, 120]
    batch = pack(10, [PackedItem(list(range(n)), tree) for n in lengths])
    assert [batch.chain_length(g) for g in range(4)] == [_causal_rows(b) for b in batch.item_visibility]
    assert all(batch.chain_length(g) > n for g, n in enumerate(lengths))  # the suffix and the tree's first node
    (*_, chain), *rest = batch.segment_groups()
    assert not rest and chain == batch.chain_length(1)  # one group: its shortest question's


def test_layouts_are_shared_by_length_and_labels_but_tokens_are_each_items_own():
    flat = LabelSet.build([[(1,)], [(2,)]])
    deep = LabelSet.build([[(3, 4)], [(3, 5)]])
    # the same suffix length and labels share a cached layout; the tokens still come from each item
    batch = pack(4, [PackedItem([10, 11], flat), PackedItem([20, 21], flat), PackedItem([30, 31], deep)])
    assert batch.input_ids.tolist() == [10, 11, 20, 21, 30, 31, 3]
    assert batch.step_token.tolist() == [1, 2, 1, 2, 3, 4, 3, 5]
    assert batch.parent.tolist() == [-1, 0, -1, 2, -1, 4, 5]
    assert batch.read_rows.tolist() == [1, 3, 5, 6]
    assert batch.step_read.tolist() == [0, 0, 1, 1, 2, 3, 2, 3]
    assert batch.form_group.tolist() == [0, 1, 2, 3, 4, 5]
    # equal label sets built apart are one key; a different label set never gets another's layout
    again = pack(4, [PackedItem([40, 41], LabelSet.build([[(1,)], [(2,)]])), PackedItem([50, 51], deep)])
    assert again.input_ids.tolist() == [40, 41, 50, 51, 3] and again.step_token.tolist() == [1, 2, 3, 4, 3, 5]


def test_layout_cache_is_bounded_and_read_only():
    flat = LabelSet.build([[(1,)], [(2,)]])
    pack(0, [PackedItem([1, 2, 3], flat)])
    layout = _layout(3, flat)
    assert not layout.parent.flags.writeable and not layout.visibility.flags.writeable
    batch = pack(0, [PackedItem([1, 2, 3], flat)])
    assert not batch.parent.flags.writeable and not batch.read_rows.flags.writeable  # shared by the layout's batches
    batch.input_ids[0] = 99  # the tokens and positions are each batch's own
    batch.position_ids[0] = 99
    again = pack(5, [PackedItem([4, 5, 6], flat)])
    assert again.input_ids.tolist()[:3] == [4, 5, 6] and again.position_ids.tolist()[:3] == [5, 6, 7]
    assert again.parent is batch.parent and again.layout_memo is batch.layout_memo
    for cache in (ITEM_LAYOUTS, BATCH_LAYOUTS):  # bounded in bytes, what was packed counted
        assert 0 < cache.nbytes <= cache.max_bytes and cache.stats()["hits"] > 0
    # a question of 5,000 rows alone: its [n, n] visibility is more than a quarter of the items' budget: not kept
    long = pack(0, [PackedItem(list(range(5_000)), flat)])
    assert long.n_rows == 5_000 and ITEM_LAYOUTS.peek((5_000, flat)) is None


def test_matches_the_row_by_row_layout():
    rng = np.random.default_rng(0)
    sets = [
        LabelSet.build([[(1, 2, 3)], [(1, 2, 4)], [(1, 5)], [(6, 7)], [(8,)]]),
        LabelSet.build([[(5,), (9, 3)], [(7, 8), (7, 9, 1)], [(4,)]]),
    ]
    for _ in range(20):
        items = [
            PackedItem(rng.integers(0, 1000, rng.integers(1, 12)).tolist(), sets[rng.integers(2)])
            for _ in range(rng.integers(1, 9))
        ]
        batch, want = pack(7, items), row_by_row(7, items)
        for name, values in want.items():
            assert getattr(batch, name).tolist() == values, name


def row_by_row(prefix_len: int, items: list[PackedItem]) -> dict[str, list[int]]:
    """The layout built one row at a time, straight from the module docstring."""
    out = {name: [] for name in ("input_ids", "position_ids", "parent", "read_rows")}
    out |= {name: [] for name in ("step_read", "step_token", "step_form", "form_group")}
    groups = 0
    for item in items:
        start = len(out["input_ids"])
        for j, token in enumerate(item.suffix_ids):
            out["input_ids"].append(token)
            out["position_ids"].append(prefix_len + j)
            out["parent"].append(start + j - 1 if j else -1)
        node_row = {(): len(out["input_ids"]) - 1}
        for node in item.labels.inner_nodes:
            node_row[node] = len(out["input_ids"])
            out["input_ids"].append(node[-1])
            out["position_ids"].append(prefix_len + len(item.suffix_ids) + len(node) - 1)
            out["parent"].append(node_row[node[:-1]])
        read_index = {}
        for row in node_row.values():
            read_index[row] = len(out["read_rows"])
            out["read_rows"].append(row)
        for group in item.labels.groups:
            for form in group:
                for s, token in enumerate(form):
                    out["step_read"].append(read_index[node_row[form[:s]]])
                    out["step_token"].append(token)
                    out["step_form"].append(len(out["form_group"]))
                out["form_group"].append(groups)
            groups += 1
    return out
