"""The packed layout: every question's suffix and label tree in ONE sequence over a shared prefix.

Packed row i is one token. Each row has a parent (the row before it in its own question, or -1 for
the first suffix token, which follows the prefix), so every question is a chain of suffix tokens
followed by a small tree of label tokens (the inner nodes of its `LabelSet`). A row attends to the
whole prefix, to its ancestors and to itself, never to another question: that is what makes answers
independent of the other questions. Positions continue from the prefix as if each question were
alone: suffix token j sits at P + j, a label node of depth d at P + len(suffix) + d - 1.

The read plan says which rows go through the LM head and which (row, token) log-probabilities add
up to each complete label: a label's probability is the product of its tokens' conditionals.

An item's layout (everything but its tokens: positions, parents, read plan, visibility) depends only on
its suffix length and label set, so it is built once and kept (`ITEM_LAYOUTS`, bounded in bytes, least
recently used dropped). A whole batch's layout is the items' layouts joined with offsets, so it is kept too
(`BATCH_LAYOUTS`: a server asks the same questions of many documents), with the arrays derived from it later
(its segments' masks: counted when it is kept); `pack` copies its token ids, writes each suffix's tokens into
their rows and moves the positions past the prefix.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from typedlm.core.bounded import BoundedCache
from typedlm.text.labels import LabelSet

# item layouts kept, keyed by (suffix length, label set): no token ids in them
ITEM_LAYOUTS: BoundedCache[tuple[int, LabelSet], _Layout] = BoundedCache("item_layouts", 32 << 20)
GROUP_ENTRIES = 1 << 22  # own-part mask entries ([G, S, S], padded to the longest) past which questions are grouped
# whole batches' layouts kept, keyed by their items' (suffix length, label set)
BATCH_LAYOUTS: BoundedCache[tuple[tuple[int, LabelSet], ...], tuple[PackedBatch, np.ndarray]] = BoundedCache(
    "batch_layouts", 64 << 20
)


def length_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of `lengths` in groups. While every one padded to the longest makes at most GROUP_ENTRIES mask
    entries, one group in their order (what the cascade always did: the same sums, bit for bit); past that, groups
    longest first, each holding the lengths over half its first (longest)."""
    if len(lengths) * max(lengths, default=0) ** 2 <= GROUP_ENTRIES:
        return [list(range(len(lengths)))]
    groups: list[list[int]] = []
    for g in sorted(range(len(lengths)), key=lambda g: -lengths[g]):
        if not groups or 2 * lengths[g] <= lengths[groups[-1][0]]:
            groups.append([])
        groups[-1].append(g)
    return groups


@dataclass(frozen=True)
class PackedItem:
    """One question for the packed pass: its suffix token ids and its answer labels."""

    suffix_ids: Sequence[int]
    labels: LabelSet

    @property
    def rows(self) -> int:
        """The packed rows it takes: its suffix tokens and its label tree's inner nodes."""
        return len(self.suffix_ids) + len(self.labels.inner_nodes)


@dataclass(frozen=True)
class PackedBatch:
    prefix_len: int
    input_ids: np.ndarray  # [N] token fed at each packed row
    position_ids: np.ndarray  # [N] absolute position of each row
    parent: np.ndarray  # [N] parent row, -1 = attaches to the prefix
    read_rows: np.ndarray  # [R] rows whose hidden state goes through the LM head
    step_read: np.ndarray  # [K] index into read_rows for each label token step
    step_token: np.ndarray  # [K] the label token read at that step
    step_form: np.ndarray  # [K] the form (complete label) the step belongs to
    form_group: np.ndarray  # [F] global answer-group index of each form
    groups_per_item: tuple[int, ...]  # answer groups of each item, in order
    item_visibility: tuple[np.ndarray, ...]  # per item [n, n] bool: its local row i may attend its local row j
    # [items] index into read_rows of each item's decision read: its label tree's root, the row right after its
    # suffix where every label's first token is read (what a learned readout reads: `features`)
    first_reads: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # what depends only on the layout (not on the token ids or the prefix length), computed once and shared by
    # every batch of the same layout: segments, their index and visibility, and what other modules derive
    layout_memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_rows(self) -> int:
        return len(self.input_ids)

    def memo(self, key, compute):
        """`compute()`, once per layout: kept in `layout_memo`, which every batch of this layout shares."""
        if key not in self.layout_memo:
            self.layout_memo[key] = compute()
        return self.layout_memo[key]

    @property
    def segments(self) -> list[tuple[int, int]]:
        """(start, end) packed rows of each item; an item starts where a row attaches to the prefix."""

        def compute() -> list[tuple[int, int]]:
            starts = np.flatnonzero(self.parent < 0).tolist()
            return list(zip(starts, [*starts[1:], self.n_rows]))

        return self.memo("segments", compute)

    def segment_visibility(self) -> np.ndarray:
        """[G, S, S] bool, S = the longest item: local row i of item g may attend its local row j. Read-only."""

        def compute() -> np.ndarray:
            width = max((len(block) for block in self.item_visibility), default=0)
            visible = np.zeros((len(self.item_visibility), width, width), dtype=bool)
            for g, block in enumerate(self.item_visibility):  # padding rows see nothing
                visible[g, : len(block), : len(block)] = block
            return _frozen_array(visible)

        return self.memo("segment_visibility", compute)

    def segment_index(self) -> tuple[np.ndarray, np.ndarray]:
        """index [G, S] (packed row of each local row, 0 as padding) and valid [G, S]. Read-only."""

        def compute() -> tuple[np.ndarray, np.ndarray]:
            starts, ends = np.array(self.segments).T  # [G], [G]
            local = np.arange((ends - starts).max())
            valid = local[None] < (ends - starts)[:, None]
            return _frozen_array(np.where(valid, starts[:, None] + local[None], 0)), _frozen_array(valid)

        return self.memo("segment_index", compute)

    def segment_groups(self) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, int], ...]:
        """The segments in groups (`length_groups`), each group padded to its longest only: (index [G, S], valid
        [G, S], visibility [G, S, S], chain) per group, as `segment_index` and `segment_visibility` give them for
        all; `chain`: the leading rows of which each sees every row before it in every segment of the group (its
        questions' suffixes, the shortest of them), where attention is plain causal attention. A small batch is
        one group; a large one is grouped by length, longest first, each group holding the segments longer than
        half its longest: padding at most doubles a segment's rows, and its [S, S] mask never grows with a longer
        question's. Read-only."""

        def compute() -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, int], ...]:
            lengths = [end - start for start, end in self.segments]
            out = []
            for members in length_groups(lengths):
                width = max(lengths[g] for g in members)
                local = np.arange(width)
                starts = np.array([self.segments[g][0] for g in members])  # [G]
                valid = local[None] < np.array([lengths[g] for g in members])[:, None]  # [G, S]
                visible = np.zeros((len(members), width, width), dtype=bool)
                for i, g in enumerate(members):  # padding rows see nothing
                    block = self.item_visibility[g]
                    visible[i, : len(block), : len(block)] = block
                index = np.where(valid, starts[:, None] + local[None], 0)
                chain = min(self.chain_length(g) for g in members)
                out.append((*map(_frozen_array, (index, valid, visible)), chain))
            return tuple(out)

        return self.memo("segment_groups", compute)

    def chain_length(self, item: int) -> int:
        """The leading rows of `item` that form one chain (each row's parent the row before it): its suffix and the
        first node of its label tree. Each of them sees every row of the item before it."""
        start, end = self.segments[item]
        breaks = np.flatnonzero(self.parent[start + 1 : end] != np.arange(start, end - 1))
        return int(breaks[0]) + 1 if len(breaks) else end - start

    def visibility(self) -> np.ndarray:
        """[N, N] bool: row i may attend packed row j (j is i or an ancestor of i)."""
        # visible: [N, N]
        visible = np.zeros((self.n_rows, self.n_rows), dtype=bool)
        for (start, end), block in zip(self.segments, self.item_visibility, strict=True):
            visible[start:end, start:end] = block
        return visible

    def attention_mask(self, sliding_window: int | None = None) -> torch.Tensor:
        """[1, 1, N, P + N] bool over keys = prefix then packed rows; True = may attend.

        With a sliding window, key k is also hidden from query q when pos(q) - pos(k) >= window, the
        window measured over positions (what the model saw alone), not over packed row indices.
        """
        # mask: [N, P + N]
        mask = np.concatenate([np.ones((self.n_rows, self.prefix_len), dtype=bool), self.visibility()], axis=1)
        if sliding_window is not None:
            key_pos = np.concatenate([np.arange(self.prefix_len), self.position_ids])  # [P + N]
            mask &= (self.position_ids[:, None] - key_pos[None, :]) < sliding_window
        return torch.from_numpy(mask)[None, None]


@dataclass(frozen=True)
class _Layout:
    """One item's rows laid out alone, everything but its suffix tokens: rows count from the item's first row,
    read rows, forms and groups from its first. Depends only on the suffix length and the label set."""

    label_ids: tuple[int, ...]  # token of each label-tree row (after the suffix rows)
    position: np.ndarray  # [L + n] position after the prefix
    parent: np.ndarray  # [L + n] parent row, -1 = attaches to the prefix
    read_rows: np.ndarray  # [r]
    step_read: np.ndarray  # [k]
    step_token: np.ndarray  # [k]
    step_form: np.ndarray  # [k]
    form_group: np.ndarray  # [f]
    groups: int
    visibility: np.ndarray  # [L + n, L + n] bool: row i may attend row j (j is i or an ancestor)


def _layout(suffix_len: int, labels: LabelSet) -> _Layout:
    """The item's layout, kept in `ITEM_LAYOUTS` (its arrays' bytes counted)."""
    key = (suffix_len, labels)
    layout = ITEM_LAYOUTS.get(key)
    if layout is None:
        layout = _build_layout(suffix_len, labels)
        size = sum(value.nbytes for value in vars(layout).values() if isinstance(value, np.ndarray))
        layout = ITEM_LAYOUTS.put(key, layout, size + 8 * len(layout.label_ids))
    return layout


def _build_layout(suffix_len: int, labels: LabelSet) -> _Layout:
    assert suffix_len > 0, "a question's suffix has at least one token (its label tree hangs from the last)"
    # 1. the suffix: a chain after the prefix
    pos, parent = list(range(suffix_len)), list(range(-1, suffix_len - 1))
    # 2. the label tree: one row per inner node, a child of the node one token shorter
    node_row = {(): suffix_len - 1}
    for node in labels.inner_nodes:
        node_row[node] = len(pos)
        pos.append(suffix_len + len(node) - 1)
        parent.append(node_row[node[:-1]])
    # 3. the read plan: each label token is read at the row of the node before it
    read_index = {row: i for i, row in enumerate(node_row.values())}
    step_read, step_token, step_form, form_group = [], [], [], []
    for g, group in enumerate(labels.groups):
        for form in group:
            for s, token in enumerate(form):
                step_read.append(read_index[node_row[form[:s]]])
                step_token.append(token)
                step_form.append(len(form_group))
            form_group.append(g)
    visible = np.zeros((len(pos), len(pos)), dtype=bool)
    for row, up in enumerate(parent):  # a row sees what its parent sees (parents come first), and itself
        if up >= 0:
            visible[row] = visible[up]
        visible[row, row] = True
    visible.flags.writeable = False
    arrays = (pos, parent, list(node_row.values()), step_read, step_token, step_form, form_group)
    label_ids = tuple(node[-1] for node in labels.inner_nodes)
    return _Layout(label_ids, *map(_frozen, arrays), len(labels.groups), visible)


def _frozen(values: list[int]) -> np.ndarray:
    return _frozen_array(np.asarray(values, dtype=np.int64))


def _frozen_array(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False  # shared by every batch that packs this layout
    return array


def pack(prefix_len: int, items: Sequence[PackedItem]) -> PackedBatch:
    """Lay out every item's suffix and label tree after a prefix of `prefix_len` tokens."""
    template, suffix_rows = _batch_layout(tuple((len(item.suffix_ids), item.labels) for item in items))
    input_ids = template.input_ids.copy()
    if len(suffix_rows):
        input_ids[suffix_rows] = np.fromiter(
            itertools.chain.from_iterable(item.suffix_ids for item in items), dtype=np.int64, count=len(suffix_rows)
        )
    return replace(
        template, prefix_len=prefix_len, input_ids=input_ids, position_ids=template.position_ids + prefix_len
    )


def _batch_layout(key: tuple[tuple[int, LabelSet], ...]) -> tuple[PackedBatch, np.ndarray]:
    """The batch of items with these (suffix length, label set), with prefix length 0 and every suffix token 0;
    and the rows that hold suffix tokens. Its arrays are shared, read-only, by every batch `pack` makes from it
    (each batch has its own `input_ids` and `position_ids`). Kept in `BATCH_LAYOUTS`, counted with what is
    derived from it later: its segments' masks, padded to the longest (`segment_visibility`, the static forward's)
    or in groups (`segment_groups`, the eager one's), and their indices."""
    found = BATCH_LAYOUTS.get(key)
    if found is None:
        found = _build_batch_layout(key)
        rows = [end - start for start, end in found[0].segments]
        flat = 64 * sum(rows)  # each row's entry in the joined arrays and the derived indices
        derived = len(rows) * max(rows, default=0) ** 2 + 4 * sum(n * n for n in rows)  # padded and grouped masks
        found = BATCH_LAYOUTS.put(key, found, flat + derived)
    return found


def _build_batch_layout(key: tuple[tuple[int, LabelSet], ...]) -> tuple[PackedBatch, np.ndarray]:
    layouts = [_layout(length, labels) for length, labels in key]
    ids: list[int] = []
    suffix_rows: list[int] = []
    for (length, _), layout in zip(key, layouts):
        suffix_rows.extend(range(len(ids), len(ids) + length))
        ids.extend([0] * length)
        ids.extend(layout.label_ids)
    rows = [len(layout.parent) for layout in layouts]
    reads = [len(layout.read_rows) for layout in layouts]
    steps = [len(layout.step_read) for layout in layouts]
    forms = [len(layout.form_group) for layout in layouts]
    groups = [layout.groups for layout in layouts]

    def joined(name: str) -> np.ndarray:  # the layouts' `name` arrays, one after another
        return np.concatenate([getattr(layout, name) for layout in layouts] or [np.zeros(0, np.int64)])

    def shifted(name: str, sizes: list[int], counts: list[int]) -> np.ndarray:
        """Joined local indices, each item's moved past the `counts` (rows, reads, ...) of the items before it."""
        before = np.cumsum(counts, dtype=np.int64) - counts  # [items]
        return joined(name) + np.repeat(before, sizes)

    parent = joined("parent")
    template = PackedBatch(
        0,
        _frozen(ids),
        *map(
            _frozen_array,
            (
                joined("position"),
                np.where(parent >= 0, shifted("parent", rows, rows), -1),
                shifted("read_rows", reads, rows),
                shifted("step_read", steps, reads),
                joined("step_token"),
                shifted("step_form", steps, forms),
                shifted("form_group", forms, groups),
            ),
        ),
        tuple(groups),
        tuple(layout.visibility for layout in layouts),
        _frozen_array(np.cumsum(reads, dtype=np.int64) - np.asarray(reads, dtype=np.int64)),
    )
    return template, _frozen(suffix_rows)


def pack_documents(prefix_lens: Sequence[int], items: Sequence[Sequence[PackedItem]]) -> PackedBatch:
    """Lay out several documents' items in one batch: document d's items (in order, after the items of the documents
    before it) are placed after a prefix of `prefix_lens[d]` tokens. Rows, reads and answer groups follow the items'
    order, so `group_masses` returns every item's masses in that order."""
    flat = [item for doc in items for item in doc]
    batch = pack(0, flat)
    if len(prefix_lens) == 1:
        return replace(batch, prefix_len=prefix_lens[0], position_ids=batch.position_ids + prefix_lens[0])
    rows = [sum(item.rows for item in doc) for doc in items]
    offsets = np.repeat(np.asarray(prefix_lens, dtype=np.int64), rows)  # [N] each row's document's prefix length
    return replace(batch, position_ids=batch.position_ids + offsets)
