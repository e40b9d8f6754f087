"""The engine's feature switches (`typedlm.core.options.EngineOptions`) resolved once, for one model on its device.

`prepare(model, options)` decides every switch that was left to it, applies the two that change the model
(the cascade attention implementation, fused kernels) and returns `Features`, what holds from then on. No lower
layer decides any of them again: the engine picks its forward strategy from `Features`, the static forward takes
the attention kernel from it, and `serve` prints its `summary()`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from typedlm.core.options import EngineOptions
from typedlm.ops.attention import kernel_agrees, kernel_available
from typedlm.ops.fused import liger_ops
from typedlm.runtime import hf
from typedlm.runtime.patching import FusionReport, fuse


@dataclass(frozen=True)
class Features:
    """What runs for one loaded model.

    - `cascade`: cascade attention (else one masked attention per layer);
    - `one_forward`: the document and every question in ONE forward (the cascade on every layer: no sliding
      windows); else two (the document, then the questions);
    - `static`: that one forward with static shapes (`graphs`); `capture`: replayed as CUDA graphs (on CUDA;
      a static forward on a CPU runs eagerly);
    - `attention_kernel`: the static forward's attention as one Triton launch per layer;
    - `fusion`: what fused kernels were swapped in (None: the model's own operations).
    """

    device: torch.device
    cascade: bool
    one_forward: bool
    static: bool
    capture: bool
    attention_kernel: bool
    fusion: FusionReport | None
    fused_kernels_asked: bool | None = None

    def summary(self) -> list[str]:
        """One line per switch, for the server's start-up log."""
        lines = []
        if self.fusion is not None:
            lines.append(str(self.fusion))
        elif self.device.type == "cuda" and self.fused_kernels_asked is not False:
            lines.append("fused kernels off (pip install 'typedlm[cuda]' for liger-kernel)")
        if not self.cascade:
            lines.append("attention: one masked attention per layer")
        elif self.attention_kernel:
            lines.append("attention: the cascade as one Triton kernel per layer")
        else:
            lines.append("attention: the cascade with torch's kernels")
        forwards = (
            "a document and its questions in one forward"
            if self.one_forward
            else "a document, then its questions: two forwards (sliding windows)"
        )
        graphs = ", replayed as CUDA graphs" if self.capture else (", static shapes" if self.static else "")
        lines.append(forwards + graphs)
        return lines


def prepare(model: torch.nn.Module, options: EngineOptions, shape: hf.ModelShape) -> Features:
    """Resolve `options` for `model` (see `typedlm.core.options`), switching its attention to the cascade and
    swapping in fused kernels where they apply."""
    cascade = options.cascade and hf.use_cascade(model)
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    on_cuda = device.type == "cuda"
    ops = liger_ops() if options.fused_kernels is not False and on_cuda else None
    fusion = fuse(model, ops) if ops is not None else None
    one_forward = cascade and not shape.has_sliding_layers
    static = (on_cuda if options.cuda_graphs is None else options.cuda_graphs) and one_forward
    attention_kernel = False
    if static:
        attention_kernel = options.attention_kernel
        if attention_kernel is None:
            attention_kernel = (
                options.fused_kernels is not False
                and on_cuda
                and dtype in (torch.float16, torch.bfloat16)
                and kernel_available()
                and kernel_agrees(shape.heads, shape.kv_heads, shape.head_dim, dtype, device)
            )
    return Features(
        device, cascade, one_forward, static, static and on_cuda, attention_kernel, fusion, options.fused_kernels
    )
