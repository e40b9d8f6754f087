"""The packed layout: every question's suffix and label tree in ONE sequence over a shared prefix.

Packed row i is one token. Each row has a parent (the row before it in its own question, or -1 for
the first suffix token, which follows the prefix), so every question is a chain of suffix tokens
followed by a small tree of label tokens (the inner nodes of its `LabelSet`). A row attends to the
whole prefix, to its ancestors and to itself, never to another question: that is what makes answers
independent of the other questions. Positions continue from the prefix as if each question were
alone: suffix token j sits at P + j, a label node of depth d at P + len(suffix) + d - 1.

The read plan says which rows go through the LM head and which (row, token) log-probabilities add
up to each complete label: a label's probability is the product of its tokens' conditionals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from typedlm.labels import LabelSet


@dataclass(frozen=True)
class PackedItem:
    """One question for the packed pass: its suffix token ids and its answer labels."""

    suffix_ids: Sequence[int]
    labels: LabelSet


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
    groups_per_item: list[int]  # answer groups of each item, in order

    @property
    def n_rows(self) -> int:
        return len(self.input_ids)

    @cached_property
    def segments(self) -> list[tuple[int, int]]:
        """(start, end) packed rows of each item; an item starts where a row attaches to the prefix."""
        starts = np.flatnonzero(self.parent < 0).tolist()
        return list(zip(starts, [*starts[1:], self.n_rows]))

    def segment_visibility(self) -> np.ndarray:
        """[G, S, S] bool, S = the longest item: local row i of item g may attend its local row j."""
        index, valid = self.segment_index()
        local_parent = np.where(valid, self.parent[index] - index[:, :1], -1)  # [G, S], < 0: attaches to the prefix
        visible = np.zeros((*index.shape, index.shape[1]), dtype=bool)
        items = np.arange(len(index))
        for i in range(index.shape[1]):  # a row sees what its parent sees (parents come first), and itself
            child = local_parent[:, i] >= 0
            visible[child, i] = visible[items[child], local_parent[child, i]]
            visible[:, i, i] = valid[:, i]
        return visible

    def segment_index(self) -> tuple[np.ndarray, np.ndarray]:
        """index [G, S] (packed row of each local row, 0 as padding) and valid [G, S]."""
        starts, ends = np.array(self.segments).T  # [G], [G]
        local = np.arange((ends - starts).max())
        valid = local[None] < (ends - starts)[:, None]
        return np.where(valid, starts[:, None] + local[None], 0), valid

    def visibility(self) -> np.ndarray:
        """[N, N] bool: row i may attend packed row j (j is i or an ancestor of i)."""
        # visible: [N, N]
        visible = np.zeros((self.n_rows, self.n_rows), dtype=bool)
        blocks = self.segment_visibility()
        for (start, end), block in zip(self.segments, blocks):
            visible[start:end, start:end] = block[: end - start, : end - start]
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


def pack(prefix_len: int, items: Sequence[PackedItem]) -> PackedBatch:
    """Lay out every item's suffix and label tree after a prefix of `prefix_len` tokens."""
    ids: list[int] = []
    pos: list[int] = []
    parent: list[int] = []
    read_rows: list[int] = []
    step_read: list[int] = []
    step_token: list[int] = []
    step_form: list[int] = []
    form_group: list[int] = []
    groups_per_item: list[int] = []
    n_groups = 0
    for item in items:
        # 1. the suffix: a chain after the prefix
        start = len(ids)
        for j, token in enumerate(item.suffix_ids):
            ids.append(token)
            pos.append(prefix_len + j)
            parent.append(start + j - 1 if j else -1)
        root = len(ids) - 1
        # 2. the label tree: one row per inner node, a child of the node one token shorter
        node_row = {(): root}
        for node in item.labels.inner_nodes:
            node_row[node] = len(ids)
            ids.append(node[-1])
            pos.append(prefix_len + len(item.suffix_ids) + len(node) - 1)
            parent.append(node_row[node[:-1]])
        # 3. the read plan: each label token is read at the row of the node before it
        read_index = {}
        for row in node_row.values():
            read_index[row] = len(read_rows)
            read_rows.append(row)
        for group in item.labels.groups:
            for form in group:
                for s, token in enumerate(form):
                    step_read.append(read_index[node_row[form[:s]]])
                    step_token.append(token)
                    step_form.append(len(form_group))
                form_group.append(n_groups)
            n_groups += 1
        groups_per_item.append(len(item.labels.groups))
    as_array = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    return PackedBatch(
        prefix_len,
        as_array(ids),
        as_array(pos),
        as_array(parent),
        as_array(read_rows),
        as_array(step_read),
        as_array(step_token),
        as_array(step_form),
        as_array(form_group),
        groups_per_item,
    )
