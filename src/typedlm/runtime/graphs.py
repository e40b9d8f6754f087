"""Static-shape forwards, captured once per shape bucket as CUDA graphs and replayed.

On a GPU a forward of a small model is launch-bound: hundreds of small kernels, each issued from Python.
A CUDA graph records them once and replays them with one launch, but only for fixed shapes and fixed
memory. So a request's forward is made static:

- rows are padded to buckets (`bucket`: at most 25% padding, less for large forwards): the document rows, the
  packed rows, the segments and their width, the read rows and the label steps; one graph per bucketed `Shape`;
- lengths that vary within a bucket (the cached prefix p, the real document rows t) live in device
  tensors that the attention reads (`attention.StaticPlan`), so replays need no host round trip;
- keys and values go to one preallocated buffer `kv` [L, 2, C, Hkv, D]: the cached prefix at [0, p), this
  forward's document rows written after it. The buffer remembers which prefixes it holds, so the pinned
  system prompt is copied in once, not per request;
- all integer inputs of a request travel in one host→device copy (an int64 arena with a view per field; the
  segments' visibility packed as bits, 64 per word, unpacked on the device).

Several documents can share one forward (`run_documents`): each takes its own range of the key/value buffer
(its cached prefix copied in, then its rows), and the attention runs one range per document (`StaticPlan`).
`launch_documents` returns once the forward is queued: its label steps come back into pinned memory behind the
replay, so the next forward's inputs can be written (and the same graph replayed again) while it runs.

Without CUDA (or with `capture=False`) the same static forward runs eagerly; tests check it against the
dynamic path on CPU. The answers equal the dynamic path's up to floating-point summation order.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from typedlm.ops import kernel_blocks
from typedlm.ops.attention import StaticPlan, additive
from typedlm.runtime import hf
from typedlm.runtime.hf import Layers
from typedlm.runtime.packing import PackedBatch
from typedlm.runtime.patching import CAPTURED

MAX_GRAPHS = 64  # captured shapes kept (least recently used dropped)
KV_GRANULE = 256  # the key/value buffer grows in steps of this many tokens
MAX_HELD = 8  # prefixes the buffer remembers holding
FINE_FROM, FINE_STEP = 4096, 512  # rows past which the buckets grow by a fixed step (see `bucket`)


@dataclass(frozen=True)
class Document:
    """One document of a static forward: its new token ids after `cached` tokens of cached prefix (`base`, a
    `PrefixKV`; None when nothing is cached or the buffer needs no copy), and how many of the batch's packed rows
    (its questions, in order after the documents' before it) are its own."""

    ids: Sequence[int] | np.ndarray
    cached: int
    packed_rows: int
    base: object | None = None


@dataclass(frozen=True)
class Launched:
    """A static forward queued on the device (`StaticRunner.launch_documents`): its label steps once done, and
    each document's (keys/values per layer or None, length, stacked keys/values or None) at once."""

    host_steps: torch.Tensor
    done: torch.cuda.Event | None
    prefixes: list[tuple[Layers | None, int, torch.Tensor | None]]

    def steps(self) -> torch.Tensor:
        """The log-probability of every label step [K] (float32, on the CPU), waiting for the forward."""
        if self.done is not None:
            self.done.synchronize()
        return self.host_steps


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
        self.out: torch.Tensor | None = None
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


class StaticRunner:
    """Runs fused forwards (document rows + packed questions) with static shapes, as CUDA graphs when `capture`.

    `body` is the model without its head, its attention set to the cascade; `head` maps hidden states [R, D]
    to log-probabilities [R, V]; `masks` is what the body takes as `attention_mask` (none needed). With
    `attention_kernel` a layer's attention runs as `cascade_kernel`'s one Triton launch (on a CPU: in Triton's
    interpreter); the engine's `Features` decide it, and `capture`.
    """

    def __init__(
        self,
        body: torch.nn.Module,
        head: Callable[[torch.Tensor], torch.Tensor],
        masks,
        shape: hf.ModelShape,
        capture: bool,
        attention_kernel: bool,
    ):
        self.body, self.head, self.masks, self.capture = body, head, masks, capture
        self.heads, self.kv_heads, self.head_dim, self.layers = (
            shape.heads,
            shape.kv_heads,
            shape.head_dim,
            shape.layers,
        )
        param = next(body.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.attention_kernel = attention_kernel
        self.block_tokens = kernel_blocks.block_tokens(self.heads // self.kv_heads) if attention_kernel else 0
        self.kv: torch.Tensor | None = None  # [L, 2, C, Hkv, D]
        self.held: list = []  # prefixes whose keys/values the buffer holds at [0, length)
        self.slots: OrderedDict[Shape, Slot] = OrderedDict()
        self.stacked: list = []  # (prefix, its keys/values stacked [L, 2, P, Hkv, D]) of bases copied lately
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.bit_shifts = torch.arange(8, dtype=torch.uint8, device=self.device)  # unpacks own_mask's bytes

    def _ensure_capacity(self, tokens: int) -> None:
        if self.kv is not None and self.kv.shape[2] >= tokens:
            return
        if self.kv is not None:  # grown by half at least: each growth drops every captured graph
            tokens = max(tokens, self.kv.shape[2] * 3 // 2)
        capacity = -(-tokens // KV_GRANULE) * KV_GRANULE
        self._idle()
        self.slots.clear()  # captured graphs point at the old buffer
        self.held = []
        self.kv = None
        self.kv = torch.zeros(
            self.layers, 2, capacity, self.kv_heads, self.head_dim, dtype=self.dtype, device=self.device
        )

    def _load_base(self, base) -> None:
        """Make the buffer hold `base` at [0, base.length) (a copy only when it does not already)."""
        if base is None or any(held is base for held in self.held):
            return
        for layer, (k, v) in enumerate(base.layers):  # k, v: [1, Hkv, P, D]
            self.kv[layer, 0, : base.length].copy_(k[0].transpose(0, 1))
            self.kv[layer, 1, : base.length].copy_(v[0].transpose(0, 1))
        self.held = [base]

    def _copy_base(self, base, start: int) -> None:
        """Copy `base`'s keys/values into the buffer at [start, start + base.length) (a later document's range), in
        one call: from the tensor the layers are views of where a static forward built it, else from a stacked
        copy made once (the pinned system prompt is every new document's base)."""
        stacked = getattr(base, "stacked", None)  # [L, 2, P, Hkv, D]
        if stacked is None:
            found = next((s for b, s in self.stacked if b is base), None)
            if found is None:
                found = torch.stack([torch.stack((k[0], v[0])).transpose(1, 2) for k, v in base.layers])
                self.stacked = [*self.stacked[-(MAX_HELD - 1) :], (base, found)]
            stacked = found
        self.kv[:, :, start : start + base.length].copy_(stacked)

    def forward(self, slot: Slot) -> torch.Tensor:
        """One static forward over `slot`'s inputs: the log-probability of every label step [K] (on the device)."""
        shape, f = slot.shape, slot.field
        cu = f("cu").to(torch.int32)
        bits = f("own_mask").view(torch.uint8)[:, None] >> self.bit_shifts  # [G·S·S / 8, 8]: lowest bit first
        own_mask = (bits & 1).bool().view(shape.segments, shape.width, shape.width)  # [G, S, S]
        ranges = shape.documents + 1
        common = dict(
            kv=self.kv,
            doc_rows=shape.doc_rows,
            write_slots=f("write_slots"),
            cu_doc=cu[0:ranges],
            cu_keys=cu[ranges : 2 * ranges],
            cu_packed=cu[2 * ranges : 3 * ranges],
            own_rows=f("own_rows").view(shape.segments, shape.width),
            row_slot=f("row_slot"),
            cu=cu,
        )
        if self.attention_kernel:
            blocks = f("blocks").view(-1, kernel_blocks.FIELDS)
            plan = StaticPlan(**common, own_mask=own_mask, own_bias=None, kernel=True, blocks=blocks)
        else:
            own_mask = own_mask[:, None].repeat(1, 1, self.heads // self.kv_heads, 1)  # [G, 1, groups·S, S]
            bias = additive(own_mask, self.dtype)
            plan = StaticPlan(**common, own_mask=own_mask, own_bias=bias, longest=shape.longest)
        hidden = hf.run_body(
            self.body, f("input_ids")[None], f("position_ids")[None], plan=plan, attention_mask=self.masks
        )
        hidden = hidden[0, shape.doc_rows :][f("read_rows")]  # [Rr, D]
        return self.head(hidden)[f("step_read"), f("step_token")]  # [K]

    def _slot(self, shape: Shape) -> Slot:
        slot = self.slots.pop(shape, None) or Slot(shape, self.device, self.block_tokens)
        self.slots[shape] = slot  # most recently used last
        while len(self.slots) > MAX_GRAPHS:
            self._idle()
            self.slots.popitem(last=False)
        return slot

    def _idle(self) -> None:
        """Wait for every forward launched (`launch_documents`) before a captured graph is dropped."""
        if self.capture:
            torch.cuda.synchronize(self.device)

    def _capture(self, slot: Slot) -> None:
        setattr(self.body, CAPTURED, True)  # `kernels.fuse` must no longer move this model's weights
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.forward(slot)  # warm-up: lazy initialisation happens outside the capture
        torch.cuda.current_stream().wait_stream(side)
        if not any(other.graph is not None for other in self.slots.values() if other is not slot):
            # once no graph uses a pool (all dropped: a grown buffer, evictions), PyTorch frees it and an internal
            # assert refuses captures into its old handle: take a fresh one
            self.pool = torch.cuda.graph_pool_handle()
        slot.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(slot.graph, pool=self.pool):
            slot.out = self.forward(slot)

    @torch.inference_mode()
    def run(
        self, ids: Sequence[int] | np.ndarray, batch: PackedBatch, base, keep: bool = True
    ) -> tuple[torch.Tensor, Layers | None, int]:
        """The document's new tokens `ids` after `base` (a PrefixKV or None) and the packed questions.

        Returns the log-probability of every label step [K] (float32, on the CPU) and the new prefix's
        keys/values with its length: a fresh copy (the caller should `remember` the prefix it builds); with
        `keep=False` no keys/values (None), only the length.
        """
        document = Document(ids, base.length if base is not None else 0, batch.n_rows, base)
        steps, ((layers, length, _),) = self.run_documents([document], batch, keep)
        return steps, layers, length

    @torch.inference_mode()
    def run_documents(
        self, documents: Sequence[Document], batch: PackedBatch, keep: bool = True
    ) -> tuple[torch.Tensor, list[tuple[Layers | None, int, torch.Tensor | None]]]:
        """Several documents, each its new tokens after its cached prefix, and their questions (`batch`, laid out
        by `packing.pack_documents`) in ONE static forward (`launch_documents`, waited for)."""
        launched = self.launch_documents(documents, batch, keep)
        return launched.steps(), launched.prefixes

    @torch.inference_mode()
    def launch_documents(self, documents: Sequence[Document], batch: PackedBatch, keep: bool = True) -> Launched:
        """`run_documents`' forward queued on the device, not waited for: the host can prepare the next forward
        (or finish the last one's answers) while this one runs. Each document's keys take their own range of the
        buffer (the first's starts at 0: its cached prefix is copied only when the buffer does not hold it).

        Returns the forward in flight: the log-probability of every label step [K] (float32, on the CPU) once it
        is done (`Launched.steps`) and at once, per document, its new prefix's keys/values (as `run`), its
        length, and the same keys/values stacked [L, 2, T, Hkv, D] (what a later forward copies in one call;
        None where not kept or nothing new was computed). Those are device tensors written in the stream's
        order: any later forward, or copy, reads them after this one wrote them.
        """
        first = documents[0]
        starts, end = [], 0
        for document in documents:
            starts.append(end)
            end += document.cached + len(document.ids)
        shape = Shape.of(sum(len(d.ids) for d in documents), batch, documents)
        if self.attention_kernel:  # its grid is the block table's: the longest document does not size it
            shape = dataclasses.replace(shape, longest=None)
        self._ensure_capacity(end + shape.doc_rows)
        self._load_base(first.base)
        for document, start in zip(documents[1:], starts[1:]):
            if document.base is not None:
                self._copy_base(document.base, start)
        slot = self._slot(shape)
        slot.fill(documents, batch, starts)
        if not self.capture:
            steps = self.forward(slot)
        else:
            if slot.graph is None:
                self._capture(slot)
            slot.graph.replay()
            steps = slot.out
        steps, done = self._to_host(steps[: len(batch.step_token)])
        # the buffer was written from the first document's cached prefix on: it still holds that and shorter ones
        cached = first.cached
        self.held = [held for held in self.held if held.length <= cached and held is not first.base]
        if first.base is not None:
            self.held.append(first.base)
        prefixes = []
        for document, start in zip(documents, starts):
            length = document.cached + len(document.ids)
            if not keep:
                prefixes.append((None, length, None))
            elif not len(document.ids):
                prefixes.append((document.base.layers, length, None))
            else:
                snapshot = self.kv[:, :, start : start + length].clone()  # [L, 2, T, Hkv, D]
                # per layer (keys, values) [1, Hkv, T, D]: views made by few calls (host time counts at this size)
                per_layer = snapshot.transpose(2, 3)[:, :, None].unbind(0)  # L × [2, 1, Hkv, T, D]
                prefixes.append((tuple(pair.unbind(0) for pair in per_layer), length, snapshot))
        return Launched(steps, done, prefixes)

    def _to_host(self, steps: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A copy of `steps` on the host, queued now (before a later replay overwrites the graph's output) into
        pinned memory, and the event that marks it done; on a CPU the tensor itself."""
        if steps.device.type != "cuda":
            return steps, None
        host = torch.empty(steps.shape, dtype=steps.dtype, pin_memory=True)
        host.copy_(steps, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    def remember(self, prefix) -> None:
        """Note that the buffer holds `prefix` (the one just built from `run`'s keys/values)."""
        self.held = [*self.held[-(MAX_HELD - 1) :], prefix]
