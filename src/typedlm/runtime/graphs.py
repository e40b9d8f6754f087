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

The inputs themselves (documents, shapes, buckets, the arena) live in `static_inputs`. Without CUDA (or with
`capture=False`) the same static forward runs eagerly; tests check it against the dynamic path on CPU. The
answers equal the dynamic path's up to floating-point summation order.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from typedlm.ops import kernel_blocks
from typedlm.ops.attention import StaticPlan
from typedlm.ops.lse_attention import additive
from typedlm.runtime import hf
from typedlm.runtime.hf import Layers
from typedlm.runtime.packing import PackedBatch
from typedlm.runtime.patching import CAPTURED
from typedlm.runtime.static_inputs import Document, Shape, Slot

logger = logging.getLogger(__name__)

MAX_GRAPHS = 64  # captured shapes kept (least recently used dropped)
KV_GRANULE = 256  # the key/value buffer grows in steps of this many tokens
MAX_HELD = 8  # prefixes the buffer remembers holding


@dataclass(frozen=True)
class Launched:
    """A static forward queued on the device (`StaticRunner.launch_documents`): its label steps once done, and
    each document's (keys/values per layer or None, length, stacked keys/values or None) at once."""

    host_steps: torch.Tensor
    done: torch.cuda.Event | None
    prefixes: list[tuple[Layers | None, int, torch.Tensor | None]]
    host_features: torch.Tensor | None = None  # each item's decision row [items, D], where asked

    def steps(self) -> torch.Tensor:
        """The log-probability of every label step [K] (float32, on the CPU), waiting for the forward."""
        if self.done is not None:
            self.done.synchronize()
        return self.host_steps

    def features(self) -> np.ndarray:
        """Each item's hidden state at its decision row [items, D] (float32, on the CPU), waiting for the forward;
        launched with `features` only."""
        assert self.host_features is not None, "the forward was launched without features"
        self.steps()
        return self.host_features.to(torch.float32).numpy()


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
        self.captures = 0  # graphs captured since start (a shape not held, or held before the buffer grew)
        self.capture_failures = 0  # captures that failed since start (their shapes run eagerly)
        # shapes whose capture failed: run eagerly until the process ends, also once their slots are dropped (a
        # grown buffer, evictions), so a capture that fails is never tried again
        self.eager_shapes: set[Shape] = set()
        self.capture_stream: torch.cuda.Stream | None = None  # the warm-ups' and captures' stream, made at the first
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

    def forward(self, slot: Slot) -> tuple[torch.Tensor, torch.Tensor]:
        """One static forward over `slot`'s inputs: the log-probability of every label step [K] and the read rows'
        hidden states [Rr, D] (what the head read; the real ones first), both on the device. A captured graph
        keeps both as its outputs, so nothing is copied for the hidden states unless a forward asks for them."""
        shape, f = slot.shape, slot.field
        cu = f("cu").to(torch.int32)
        bits = f("own_mask").view(torch.uint8)[:, None] >> self.bit_shifts  # [G·S·S / 8, 8]: lowest bit first
        own_mask = (bits & 1).bool().view(shape.segments, shape.width, shape.width)  # [G, S, S]
        ranges = shape.documents + 1
        read_rows = f("read_rows")
        rows = shape.doc_rows + shape.packed_rows
        # the last layer may finish the read rows alone (see below); where they are as many as the forward's rows
        # there is nothing to leave out, and an output of either kind would have the same length
        out_rows = read_rows + shape.doc_rows if shape.read_rows < rows else None
        common = dict(
            out_rows=out_rows,
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
        # [Rr, D]: the read rows, gathered by the last layer (`plan.out_rows`) where its forward is the fused one;
        # with `out_rows` the two outputs differ in length (fewer read rows than rows)
        hidden = hidden[0] if hidden.shape[1] != rows else hidden[0, shape.doc_rows :][read_rows]
        return self.head(hidden)[f("step_read"), f("step_token")], hidden  # [K], [Rr, D]

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
        """Capture `slot`'s forward as a CUDA graph; where the capture fails, the shape runs eagerly from then on
        (logged, counted in `stats`): a slower forward, never a failed request.

        The warm-up and the capture run on one stream of the runner's own: what a library sets up lazily per
        stream on its first call (cuBLAS's workspace, which PyTorch keeps per handle and stream; a kernel's
        module) is set up by the warm-up, outside the capture, on the stream the capture then records."""
        setattr(self.body, CAPTURED, True)  # `kernels.fuse` must no longer move this model's weights
        if self.capture_stream is None:
            self.capture_stream = torch.cuda.Stream(self.device)
        side = self.capture_stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.forward(slot)  # warm-up: lazy initialisation happens outside the capture
        torch.cuda.current_stream().wait_stream(side)
        if not any(other.graph is not None for other in self.slots.values() if other is not slot):
            # once no graph uses a pool (all dropped: a grown buffer, evictions), PyTorch frees it and an internal
            # assert refuses captures into its old handle: take a fresh one
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=side):
                out = self.forward(slot)
        except RuntimeError as exc:  # the capture failed: the forward is run eagerly for this shape
            self.capture_failures += 1
            self.eager_shapes.add(slot.shape)
            logger.warning("capturing a CUDA graph failed for %s; that shape runs eagerly: %s", slot.shape, exc)
            torch.cuda.synchronize(self.device)
            return
        slot.graph, slot.out = graph, out
        self.captures += 1

    def stats(self) -> dict[str, int]:
        """Graphs captured since start, and held now: a capture holds up the forwards behind it (a latency tail
        where new batch shapes keep coming); captures that failed (their shapes run eagerly)."""
        # each slot's graph is captured as the slot is made; `len` only, as another thread may be adding one
        return {"captures": self.captures, "held": len(self.slots), "capture_failures": self.capture_failures}

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
    def launch_documents(
        self, documents: Sequence[Document], batch: PackedBatch, keep: bool = True, features: bool = False
    ) -> Launched:
        """`run_documents`' forward queued on the device, not waited for: the host can prepare the next forward
        (or finish the last one's answers) while this one runs. Each document's keys take their own range of the
        buffer (the first's starts at 0: its cached prefix is copied only when the buffer does not hold it).

        Returns the forward in flight: the log-probability of every label step [K] (float32, on the CPU) once it
        is done (`Launched.steps`), with `features` each item's decision row's hidden state (`Launched.features`),
        and at once, per document, its new prefix's keys/values (as `run`), its
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
        if self.capture and slot.graph is None and shape not in self.eager_shapes:
            self._capture(slot)
        if slot.graph is None:
            steps, hidden = self.forward(slot)
        else:
            slot.graph.replay()
            steps, hidden = slot.out
        host_features = None
        if features:  # gathered on the device, copied behind the replay like the steps
            rows = torch.tensor(batch.first_reads).to(self.device, non_blocking=True)
            host_features = self._to_host(hidden[rows])[0]
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
        return Launched(steps, done, prefixes, host_features)

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
