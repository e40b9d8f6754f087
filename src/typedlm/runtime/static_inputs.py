"""A static forward's inputs: the documents it holds, its bucketed shape, and the slot its inputs live in.

`graphs.StaticRunner` replays one captured graph per `Shape`; everything a replay reads from the host side is
here:

- `Document`: one document of a forward (its new token ids, its cached prefix, its questions' packed rows);
- `bucket` / `documents_bucket`: row counts and document counts rounded up, so that similar requests share a
  shape (at most 25% padding; past `FINE_FROM` rows a fixed step of `FINE_STEP` keeps large forwards' padding
  low);
- `Shape`: the bucketed sizes of one forward;
- `Slot`: one shape's static inputs, all integers in one int64 arena (a pinned host copy and its device twin,
  one host→device copy per forward; the segments' visibility packed as bits), filled per forward by `fill`.
  With the attention kernel the arena holds its block table too (`ops.kernel_blocks`).

Plain numpy and torch tensors: no model, no graphs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from typedlm.ops import kernel_blocks
from typedlm.runtime.packing import PackedBatch

FINE_FROM, FINE_STEP = 4096, 512  # rows past which the buckets grow by a fixed step (see `bucket`)
# every field of the arena starts a multiple of this many int64s (16 bytes) from its start: Triton compiles a kernel
# once per alignment of its pointer arguments, so a field read by a kernel (the block table, the row slots, the
# write slots) keeps one alignment whatever the shape (with several documents the fields before them change parity)
FIELD_ALIGN = 2


@dataclass(frozen=True)
class Document:
    """One document of a static forward: its new token ids after `cached` tokens of cached prefix (`base`, a
    `PrefixKV`; None when nothing is cached or the buffer needs no copy), and how many of the batch's packed rows
    (its questions, in order after the documents' before it) are its own."""

    ids: Sequence[int] | np.ndarray
    cached: int
    packed_rows: int
    base: object | None = None


def bucket(n: int, minimum: int = 16) -> int:
    """`n` rounded up to one of four steps per power of two (≤ 25% padding), at least `minimum`; 0 stays 0.

    Past `FINE_FROM` rows the step stays `FINE_STEP` (≤ 12.5% padding there, falling with n): the padding rows of
    a large forward (several documents) cost as much as real ones in every matrix product, and a step of a
    quarter of the power of two would pad batches of 1266-token documents by 9% on average."""
    if n <= 0:
        return 0
    if n <= minimum:
        return minimum
    step = FINE_STEP if n > FINE_FROM else 1 << max(n.bit_length() - 3, 0)
    return -(-n // step) * step


def documents_bucket(n: int) -> int:
    """Documents per forward rounded up to a power of two (few graph shapes; unused ranges are empty)."""
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class Shape:
    """Bucketed sizes of one static forward."""

    doc_rows: int
    packed_rows: int
    segments: int
    width: int
    read_rows: int
    steps: int
    documents: int = 1
    longest: tuple[int, int, int] | None = None  # several documents: the most document rows, packed rows and keys of
    # one of them (bucketed; they size the attention's grid), see StaticPlan.longest

    @classmethod
    def of(cls, doc_rows: int, batch: PackedBatch, documents: Sequence[Document] = ()) -> Shape:
        segments = batch.segments
        width = max(end - start for start, end in segments)
        longest = None
        if len(documents) > 1:
            packed = bucket(batch.n_rows)
            longest = (
                bucket(max(len(d.ids) for d in documents)),
                bucket(max(d.packed_rows for d in documents) + packed - batch.n_rows),  # padding joins the last
                bucket(max(d.cached + len(d.ids) for d in documents)),
            )
        return cls(
            bucket(doc_rows),
            bucket(batch.n_rows),
            bucket(len(segments), 4),
            -(-width // 8) * 8,
            bucket(len(batch.read_rows)),
            bucket(len(batch.step_token)),
            documents_bucket(max(len(documents), 1)),
            longest,
        )

    def fields(self, block_tokens: int = 0) -> dict[str, int]:
        """The int64 arena's fields and their lengths, in order; with `block_tokens`, the attention kernel's
        table of blocks of that many tokens (see `kernel_blocks`)."""
        g, s = self.segments, self.width
        rows = self.doc_rows + self.packed_rows
        blocks = (
            kernel_blocks.capacity(self.doc_rows, self.packed_rows, self.documents, block_tokens) if block_tokens else 0
        )
        return {
            "input_ids": rows,
            "position_ids": rows,
            "write_slots": self.doc_rows,
            "cu": 3 * (self.documents + 1) + 2,  # cu_doc, cu_keys, cu_packed, (real packed rows, 0)
            "blocks": kernel_blocks.FIELDS * blocks,
            "own_rows": g * s,
            "own_mask": g * s * s // 64,  # bits, 64 per word (the width is a multiple of 8)
            "row_slot": self.packed_rows,
            "read_rows": self.read_rows,
            "step_read": self.steps,
            "step_token": self.steps,
        }


class Slot:
    """One shape's static inputs (an int64 arena on the device), its output, and its graph once captured.
    With `block_tokens`, the inputs hold the attention kernel's block table too (see `kernel_blocks`)."""

    def __init__(self, shape: Shape, device: torch.device, block_tokens: int = 0):
        self.shape, self.block_tokens = shape, block_tokens
        sizes = shape.fields(block_tokens)
        self.views: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, size in sizes.items():
            offset = -(-offset // FIELD_ALIGN) * FIELD_ALIGN
            self.views[name] = (offset, offset + size)
            offset += size
        # what every request starts from: zeros, and padding segment slots that see only themselves
        self.blank_mask = np.broadcast_to(np.eye(shape.width, dtype=bool), (shape.segments, shape.width, shape.width))
        # on a GPU the host side is pinned: its copy to the device is queued without waiting, and the next
        # request waits for `copied` before writing it again (by then long done: the output was read since)
        pinned = device.type == "cuda"
        self.host_tensor = torch.zeros(offset, dtype=torch.int64, pin_memory=pinned)
        self.copied = torch.cuda.Event() if pinned else None
        self.host = self.host_tensor.numpy()
        self.arena = torch.zeros(offset, dtype=torch.int64, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None  # a captured graph's (steps, read rows' hidden)
        self.layout_key = ("static inputs", dataclasses.replace(shape, doc_rows=0))  # what `fill` keeps per layout

    def host_field(self, name: str) -> np.ndarray:
        lo, hi = self.views[name]
        return self.host[lo:hi]

    def field(self, name: str) -> torch.Tensor:
        lo, hi = self.views[name]
        return self.arena[lo:hi]

    def fill(self, documents: Sequence[Document], batch: PackedBatch, starts: Sequence[int]) -> None:
        """Write one forward's documents and questions into the host arena and copy it to the device in one
        transfer. Document b's keys go to the buffer's range from `starts[b]`: its cached prefix, then its rows.

        The fields from `own_rows` on depend only on the batch's layout and this shape's sizes: they are
        computed once per layout (kept with it, see `PackedBatch.memo`) and copied in.
        """
        shape, n = self.shape, batch.n_rows
        start = self.views["own_rows"][0]
        if self.copied is not None:
            self.copied.synchronize()
        self.host[start:] = batch.memo(self.layout_key, lambda: self._layout_inputs(batch))
        self.host[:start] = 0
        tb = shape.doc_rows
        input_ids, positions = self.host_field("input_ids"), self.host_field("position_ids")
        slots, cu = self.host_field("write_slots"), self.host_field("cu")
        if len(documents) == 1:  # one document: its range starts at 0, padding rows continue it (never read)
            (document,), t = documents, len(documents[0].ids)
            input_ids[:t] = document.ids
            positions[:tb] = np.arange(document.cached, document.cached + tb)
            slots[:] = positions[:tb]
            cu[:8] = (0, t, 0, document.cached + t, 0, shape.packed_rows, n, 0)
        else:
            self._fill_documents(documents, starts)
        if self.block_tokens:
            self.host_field("blocks")[:] = kernel_blocks.block_table(
                [len(document.ids) for document in documents],
                [document.cached for document in documents],
                starts,
                [document.packed_rows for document in documents],
                tb,
                shape.packed_rows,
                self.block_tokens,
                len(self.host_field("blocks")) // kernel_blocks.FIELDS,
            ).ravel()
        input_ids[tb : tb + n] = batch.input_ids
        positions[tb : tb + n] = batch.position_ids
        self.arena.copy_(self.host_tensor, non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def _fill_documents(self, documents: Sequence[Document], starts: Sequence[int]) -> None:
        """The rows, positions, key slots and ranges of several documents (see `StaticPlan`): document b's rows
        follow the documents' before it; its keys are [starts[b], starts[b] + cached + rows). Unused document
        ranges are empty; padding rows write their keys after every range (never read)."""
        shape, b = self.shape, len(documents)
        rows = np.array([len(document.ids) for document in documents], dtype=np.int64)  # [B]
        cached = np.array([document.cached for document in documents], dtype=np.int64)  # [B]
        first = np.cumsum(rows) - rows  # [B] each document's first row
        t = int(rows.sum())
        local = np.arange(t) - np.repeat(first, rows)  # [T] each row's index in its document
        input_ids, positions = self.host_field("input_ids"), self.host_field("position_ids")
        slots = self.host_field("write_slots")
        input_ids[:t] = np.concatenate([np.asarray(document.ids, dtype=np.int64) for document in documents])
        positions[:t] = np.repeat(cached, rows) + local
        slots[:t] = np.repeat(np.asarray(starts, dtype=np.int64) + cached, rows) + local
        end = int(starts[-1] + cached[-1] + rows[-1])  # the last key of every range
        slots[t:] = positions[t : shape.doc_rows] = np.arange(end, end + shape.doc_rows - t)
        ranges = shape.documents + 1
        cu_doc, cu_keys, cu_packed = (self.host_field("cu")[i * ranges : (i + 1) * ranges] for i in range(3))
        cu_doc[1 : b + 1], cu_doc[b + 1 :] = np.cumsum(rows), t
        cu_keys[0] = starts[0]
        cu_keys[1 : b + 1] = np.asarray(starts, dtype=np.int64) + cached + rows
        cu_keys[b + 1 :] = end
        packed = np.cumsum([document.packed_rows for document in documents])
        cu_packed[1 : b + 1], cu_packed[b + 1 :] = packed, packed[-1]
        cu_packed[-1] = shape.packed_rows  # padding rows join the last range (their output is never read)
        self.host_field("cu")[3 * ranges :] = (packed[-1], 0)

    def _layout_inputs(self, batch: PackedBatch) -> np.ndarray:
        """The arena's fields from `own_rows` on, for this batch's layout: segments, read plan."""
        shape, start = self.shape, self.views["own_rows"][0]
        host = np.zeros(len(self.host) - start, dtype=np.int64)

        def field(name: str) -> np.ndarray:
            lo, hi = self.views[name]
            return host[lo - start : hi - start]

        # segments: slot (g, s) holds packed row index[g, s]; padding slots see only themselves
        index, valid = batch.segment_index()
        g, s = index.shape
        field("own_rows").reshape(shape.segments, shape.width)[:g, :s] = index
        own_mask = self.blank_mask.copy()  # [G, S, S] bool
        own_mask[:g, :s, :s] = batch.segment_visibility()
        field("own_mask")[:] = np.packbits(own_mask, axis=None, bitorder="little").view(np.int64)
        field("row_slot")[index[valid]] = (np.arange(g)[:, None] * shape.width + np.arange(s)[None])[valid]
        field("read_rows")[: len(batch.read_rows)] = batch.read_rows
        field("step_read")[: len(batch.step_read)] = batch.step_read
        field("step_token")[: len(batch.step_token)] = batch.step_token
        return host
