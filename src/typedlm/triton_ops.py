"""Small Triton kernels for the layers' operations that no installed library fuses the way typedlm needs.

`silu_mul_joined(h)`: a SwiGLU MLP's activation when its gate and up projections run as ONE matrix product
(`kernels` joins their weights): h [..., 2F] holds the gate's outputs then the up's, and the result is
silu(gate)·up [..., F], read from the two halves in place (no split copies).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

COLUMNS_PER_PROGRAM = 1024


@triton.jit
def _silu_mul_joined_kernel(H, OUT, columns, stride_h, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    column = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = column < columns
    gate = tl.load(H + row * stride_h + column, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(H + row * stride_h + columns + column, mask=inside, other=0.0)
    tl.store(OUT + row * stride_out + column, (gate * tl.sigmoid(gate)).to(up.dtype) * up, mask=inside)


def silu_mul_joined(h: torch.Tensor) -> torch.Tensor:
    """h [..., 2F] (gate outputs, then up outputs) -> silu(gate) · up [..., F]; silu computed in float32."""
    columns = h.shape[-1] // 2
    rows = h.reshape(-1, 2 * columns)  # a view for the contiguous outputs of a matrix product
    out = torch.empty(rows.shape[0], columns, dtype=h.dtype, device=h.device)
    grid = (rows.shape[0], triton.cdiv(columns, COLUMNS_PER_PROGRAM))
    _silu_mul_joined_kernel[grid](rows, out, columns, rows.stride(0), out.stride(0), BLOCK=COLUMNS_PER_PROGRAM)
    return out.view(*h.shape[:-1], columns)
