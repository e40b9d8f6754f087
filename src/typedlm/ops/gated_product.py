"""A SwiGLU MLP's gate and up products and its activation in ONE Triton kernel: silu(x·Wg^T)·(x·Wu^T).

Unfused, the MLP's joined gate/up product writes [rows, 2F] to memory and `triton_ops.silu_mul_joined` reads it
back to write [rows, F]: for Qwen3-0.6B's F = 3072 that is three passes over 12 KiB per row and layer, about a
quarter of a forward's memory traffic. Here each program multiplies one tile of rows by the same tile of the gate's
and the up's columns (two accumulators, float32) and writes only silu(gate)·up. The gate's and up's products are
rounded to the dtype before the activation, and the activation before the product, as the two operations apart
round them: only the order of the products' sums differs from theirs.

`gated_product(x [..., K], joined [2F, K]) -> [..., F]`: `joined` holds the gate's weight rows, then the up's (the
layout `patching` joins them in). Operands are read through tensor descriptors (the copy engine of Hopper and
newer GPUs, which fills rows past the end with zeros and clips the stores) where `DESCRIPTORS` and the device
allow, through pointers otherwise. Each output row depends on its own input row alone, in a fixed order of
sums: a row's result does not depend on the other rows of the call (batch invariance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64  # tiles of rows, output columns, depth
NUM_WARPS, NUM_STAGES = 8, 3
GROUP_M = 8  # row tiles that take their column tiles in turn, so a weight tile is reused from L2
DESCRIPTORS = True  # tensor descriptors where the device has them (compute capability 9 and newer)


@triton.jit
def _tile(pid, rows, columns, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program `pid`'s tile (row tile, column tile), row tiles grouped by GROUP_M."""
    blocks_m = tl.cdiv(rows, BLOCK_M)
    blocks_n = tl.cdiv(columns, BLOCK_N)
    per_group = GROUP_M * blocks_n
    first_m = pid // per_group * GROUP_M
    group_m = tl.minimum(blocks_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@triton.jit
def _activate(gate, up, dtype: tl.constexpr):
    """silu(gate)·up from float32 accumulators, rounded as the unfused products and activation are."""
    gate = gate.to(dtype).to(tl.float32)
    activated = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
    return (activated * up.to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _gated_product_pointers(
    X, W, OUT, rows, columns, depth, stride_x, stride_w, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    tile_m, tile_n = _tile(tl.program_id(0), rows, columns, BLOCK_M, BLOCK_N, GROUP_M)
    m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    m_read = tl.where(m < rows, m, 0).to(tl.int64)  # rows past the end read row 0 and are not stored
    n_read = tl.where(n < columns, n, 0).to(tl.int64)
    x_ptrs = X + m_read[:, None] * stride_x + k[None, :]  # [BM, BK]
    gate_ptrs = W + n_read[None, :] * stride_w + k[:, None]  # [BK, BN]: the gate's weight, transposed
    up_ptrs = gate_ptrs + columns * stride_w  # the up's rows follow the gate's
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, depth, BLOCK_K):
        inside = k < depth - start
        x = tl.load(x_ptrs, mask=inside[None, :], other=0.0)
        gate = tl.dot(x, tl.load(gate_ptrs, mask=inside[:, None], other=0.0), gate)
        up = tl.dot(x, tl.load(up_ptrs, mask=inside[:, None], other=0.0), up)
        x_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
        up_ptrs += BLOCK_K
    out = _activate(gate, up, OUT.dtype.element_ty)
    stored = (m < rows)[:, None] & (n < columns)[None, :]
    tl.store(OUT + m.to(tl.int64)[:, None] * stride_out + n[None, :], out, mask=stored)


@triton.jit
def _gated_product_descriptors(
    x_desc, w_desc, out_desc, rows, columns, depth,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    tile_m, tile_n = _tile(tl.program_id(0), rows, columns, BLOCK_M, BLOCK_N, GROUP_M)
    row, column = tile_m * BLOCK_M, tile_n * BLOCK_N
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, depth, BLOCK_K):
        x = x_desc.load([row, start])  # [BM, BK]
        gate = tl.dot(x, w_desc.load([column, start]).T, gate)  # the gate's weight rows [BN, BK]
        up = tl.dot(x, w_desc.load([columns + column, start]).T, up)
    out_desc.store([row, column], _activate(gate, up, out_desc.dtype))


def _descriptors_here(*tensors: torch.Tensor) -> bool:
    """Tensor descriptors need Hopper or newer, and rows that start on 16 bytes."""
    if not DESCRIPTORS or tensors[0].device.type != "cuda":
        return False
    if torch.cuda.get_device_capability(tensors[0].device)[0] < 9:
        return False
    return all(t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0 for t in tensors)


def gated_product(x: torch.Tensor, joined: torch.Tensor) -> torch.Tensor:
    """x [..., K], joined [2F, K] (the gate's weight, then the up's) -> silu(x·gate^T)·(x·up^T) [..., F]."""
    depth = x.shape[-1]
    columns = joined.shape[0] // 2
    assert joined.shape == (2 * columns, depth) and joined.stride(-1) == 1, "joined: [2F, K], rows contiguous"
    assert joined.dtype == x.dtype, "x and the weight share a dtype"
    rows_x = x.reshape(-1, depth)
    if rows_x.stride(-1) != 1:
        rows_x = rows_x.contiguous()
    out = torch.empty(rows_x.shape[0], columns, dtype=x.dtype, device=x.device)
    rows = rows_x.shape[0]
    if rows:
        grid = (triton.cdiv(rows, BLOCK_M) * triton.cdiv(columns, BLOCK_N),)
        tiles = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M)
        launch = dict(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
        if _descriptors_here(rows_x, joined, out):
            from triton.tools.tensor_descriptor import TensorDescriptor

            descriptors = (
                TensorDescriptor.from_tensor(rows_x, [BLOCK_M, BLOCK_K]),
                TensorDescriptor.from_tensor(joined, [BLOCK_N, BLOCK_K]),
                TensorDescriptor.from_tensor(out, [BLOCK_M, BLOCK_N]),
            )
            _gated_product_descriptors[grid](*descriptors, rows, columns, depth, **tiles, **launch)
        else:
            _gated_product_pointers[grid](
                rows_x, joined, out, rows, columns, depth, rows_x.stride(0), joined.stride(0), out.stride(0),
                **tiles, **launch,
            )  # fmt: skip
    return out.view(*x.shape[:-1], columns)
