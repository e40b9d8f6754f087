"""What one request's forward may hold in memory, estimated from its shape before it runs.

    budget = ForwardBudget.of(model, shape, cascade=True)
    budget.bytes(prefix_tokens=1266, rows=[31, 31, 40])    # bytes the forward will hold at its peak, at most
    budget.tokens(1 << 30)                                   # the most tokens one GiB may admit

A forward holds, at its peak (one layer at a time; measured on a CPU, `benchmarks/hostile.py`):
- the keys/values of every token (the cached prefix is copied into the forward's own cache): per token
  2 · layers · kv_heads · head_dim values;
- one layer's activations for every new row: the residual stream and its norms, the MLP's inner products, the
  queries, keys and values (ACTIVATION_HIDDEN residual widths and ACTIVATION_INNER inner widths per row);
- the cascade's own part, one group of questions of similar length at a time (each padded to its group's
  longest, at most twice its rows): the group's queries, keys, values and outputs ([G, S, ...]) and its
  visibility mask, boolean and additive ([G, S, S]); every group's boolean mask is made up front;
- where a layer cannot run the cascade (sliding windows, or the cascade off), a full mask over every row and key.

The estimate is an upper bound within about 10-40% on the embedded model (its benchmark checks it against the
measured peak of every request shape it sends); what the model's weights, the prefix cache and the allocator
keep are apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from typedlm.runtime import hf
from typedlm.runtime.packing import length_groups

CPU_FORWARD_BYTES = 1 << 30  # a request's forward on a CPU, by default: about 11,000 tokens of the embedded model
DEVICE_SHARE = 4  # on an accelerator, by default: this share of its memory


def default_forward_bytes(device: torch.device) -> int:
    """The memory one request's forward may take by default: CPU_FORWARD_BYTES on a CPU (beside the weights, the
    prefix cache and what the process holds, a few such forwards fit a small machine), a quarter of the device's
    memory on CUDA."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // DEVICE_SHARE
    return CPU_FORWARD_BYTES


ACTIVATION_HIDDEN = 6  # residual-width tensors one layer holds per row at once (input, norms, attention out, ...)
ACTIVATION_INNER = 4  # inner-width tensors of the MLP per row (gate, up, activation, product)
MASK_BYTES = 2  # per boolean mask entry: the packing's array and the tensor made from it


@dataclass(frozen=True)
class ForwardBudget:
    """Bytes per token, per row and per mask entry of one forward on this model (see the module)."""

    kv_token: int  # keys and values of one token, every layer
    row: int  # one layer's activations of one new row
    own_row: int  # the cascade's own part, per padded question row
    mask_entry: int  # a mask entry, boolean and additive
    full_masks: int  # full masks a forward makes (layers that do not run the cascade): 0, 1 or 2

    @classmethod
    def of(cls, model: torch.nn.Module, shape: hf.ModelShape, cascade: bool) -> ForwardBudget:
        size = next(model.parameters()).element_size()
        qkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
        hidden = shape.hidden or shape.heads * shape.head_dim
        full = 0 if cascade and not shape.has_sliding_layers else 1 + int(shape.has_sliding_layers)
        return cls(
            kv_token=2 * shape.layers * shape.kv_heads * shape.head_dim * size,
            row=size * (ACTIVATION_HIDDEN * hidden + ACTIVATION_INNER * (shape.intermediate or 4 * hidden) + 2 * qkv),
            own_row=size * 2 * (shape.heads + shape.kv_heads) * shape.head_dim,
            mask_entry=MASK_BYTES + size,
            full_masks=full,
        )

    def bytes(self, prefix_tokens: int, rows: Sequence[int]) -> int:
        """The most a forward over `prefix_tokens` document tokens (counted as new: whether they are cached is
        known only at the forward) and questions of `rows` rows each may hold."""
        n = prefix_tokens + sum(rows)
        own = 0
        for group in length_groups(rows):  # the cascade's own part, group by group (`PackedBatch.segment_groups`)
            width = max(rows[g] for g in group)
            own = max(own, len(group) * width * self.own_row + len(group) * width * width * self.mask_entry)
        masks = sum(rows[g] ** 2 for g in range(len(rows))) * 4 * MASK_BYTES  # every group's mask, kept all along
        full = self.full_masks * n * n * self.mask_entry
        return n * (self.kv_token + self.row) + own + masks + full

    def tokens(self, max_bytes: int) -> int:
        """The most tokens a forward of at most `max_bytes` may hold, whatever their shape (`bytes` of more
        tokens is more: its mask and padding terms only add to it)."""
        return max(1, max_bytes // (self.kv_token + self.row))
