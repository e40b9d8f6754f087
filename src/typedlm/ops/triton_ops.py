"""Small Triton kernels for the layers' operations that no installed library fuses the way typedlm needs.

`rms_norm(x, weight, eps)`: RMSNorm with several rows per program (liger-kernel's runs one program per row
for most shapes, which for a q/k norm over 128 values means tens of thousands of tiny programs).

`add_rms_norm(x, residual, weight, eps)`: a residual add and the RMSNorm that reads its sum, in one pass
(the sum is rounded to the inputs' dtype before it is normalised, as the two operations apart do).

`silu_mul_joined(h)`: a SwiGLU MLP's activation when its gate and up projections run as ONE matrix product
(`kernels` joins their weights): h [..., 2F] holds the gate's outputs then the up's, and the result is
silu(gate)·up [..., F], read from the two halves in place (no split copies).

`norm_rope(q, k, q_weight, k_weight, eps, cos, sin)`: an attention's per-head RMSNorms of its queries and keys
and the rotary embedding after them, in one pass that reads each head's row once (where it lies in a joined q/k/v
product) and writes it once, rotated (the norm's result rounded to the dtype before it is rotated, as the two
operations apart round it).

`store_rows(dst, slots, src)`: dst[slots[i]] = src[i] for rows that are each contiguous but lie apart (a layer's
keys or values, read straight out of the joined q/k/v product): what `index_copy_` does, a row per program
(20,480 rows of 1,024 bf16 values on an H200: 44 µs against index_copy_'s 67, whose index kernel computes an
offset per element).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

COLUMNS_PER_PROGRAM = 1024
ELEMENTS_PER_PROGRAM = 4096  # rms_norm: rows per program × the row's length rounded up to a power of two
NUM_WARPS = 4  # of every program here (Triton's default); benchmarks/kernel_rates.py times these three settings
# ROW_COUNTS: Triton compiles a kernel once per specialisation of its integer arguments (divisible by 16 or not,
# equal to 1). A kernel's row counts vary with every request's lengths and only bound its masks, so they are not
# specialised on (`do_not_specialize`): one compile serves every request, where each new residue meant another
# compile in a new machine's first requests (seconds on an H100; `cascade_kernel` says more). Strides and
# widths, which place the loads, stay specialised.


@triton.jit
def _silu_mul_joined_kernel(H, OUT, columns, stride_h, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    column = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = column < columns
    gate = tl.load(H + row * stride_h + column, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(H + row * stride_h + columns + column, mask=inside, other=0.0)
    activated = (gate * tl.sigmoid(gate)).to(up.dtype).to(tl.float32)  # rounded as silu(gate) would be
    tl.store(OUT + row * stride_out + column, activated * up.to(tl.float32), mask=inside)


def silu_mul_joined(h: torch.Tensor) -> torch.Tensor:
    """h [..., 2F] (gate outputs, then up outputs) -> silu(gate) · up [..., F]; silu computed in float32."""
    columns = h.shape[-1] // 2
    rows = h.reshape(-1, 2 * columns)  # a view for the contiguous outputs of a matrix product
    out = torch.empty(rows.shape[0], columns, dtype=h.dtype, device=h.device)
    grid = (rows.shape[0], triton.cdiv(columns, COLUMNS_PER_PROGRAM))
    _silu_mul_joined_kernel[grid](
        rows, out, columns, rows.stride(0), out.stride(0), BLOCK=COLUMNS_PER_PROGRAM, num_warps=NUM_WARPS
    )
    return out.view(*h.shape[:-1], columns)


@triton.jit
def _normed(x, W, column, columns, eps):
    """Rows x [ROWS, COLUMNS] (one dtype) -> W · (x·rsqrt(mean(x²) + eps) in float32, rounded to x's dtype)."""
    x32 = x.to(tl.float32)
    normed = x32 * tl.rsqrt(tl.sum(x32 * x32, 1) / columns + eps)[:, None]
    weight = tl.load(W + column, mask=column < columns, other=0.0).to(tl.float32)
    # the product of two rounded values, rounded once more on the store (as weight · normed.to(x's dtype) is)
    return weight[None, :] * normed.to(x.dtype).to(tl.float32)


def _row_blocks(rows: int, columns: int) -> tuple[tuple[int], int, int]:
    """(grid, rows per program, columns rounded up to a power of two) for a kernel over rows of `columns`."""
    block = triton.next_power_of_2(columns)
    per_program = max(ELEMENTS_PER_PROGRAM // block, 1)
    return (triton.cdiv(rows, per_program),), per_program, block


@triton.jit(do_not_specialize=["rows", "inner"])  # see ROW_COUNTS
def _rms_norm_kernel(
    X, W, Y, rows, inner, columns, stride_outer, stride_inner, eps, ROWS: tl.constexpr, COLUMNS: tl.constexpr
):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    column = tl.arange(0, COLUMNS)
    inside = (row < rows)[:, None] & (column < columns)[None, :]
    row = row.to(tl.int64)
    at = (row // inner) * stride_outer + (row % inner) * stride_inner  # row r of X is X[r // inner, r % inner]
    x = tl.load(X + at[:, None] + column[None, :], mask=inside, other=0.0)
    tl.store(Y + row[:, None] * columns + column[None, :], _normed(x, W, column, columns, eps), mask=inside)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> weight · (x·rsqrt(mean(x²) + eps) in float32, cast to x's dtype): the Llama convention.

    Several rows per program (ELEMENTS_PER_PROGRAM in all), so short rows (a head's 128 values for a q/k norm)
    do not cost one program each. x's rows are read in place as [A, B] with two strides: a contiguous tensor,
    or one head's columns of a joined q/k/v product viewed per head ([1, N, H, D] with rows of the product's
    width); the result is contiguous.
    """
    columns = x.shape[-1]
    grid_rows = x.flatten(0, -3) if x.dim() >= 3 else x[None]  # [A, B, D]: a view where the leading dims merge
    if grid_rows.stride(-1) != 1:
        grid_rows = grid_rows.contiguous()
    outer, inner = grid_rows.shape[:2]
    out = torch.empty(x.shape, dtype=torch.result_type(weight, x), device=x.device)
    grid, per_program, block = _row_blocks(outer * inner, columns)
    _rms_norm_kernel[grid](
        grid_rows, weight, out, outer * inner, inner, columns, *grid_rows.stride()[:2], eps,
        ROWS=per_program, COLUMNS=block, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


@triton.jit(do_not_specialize=["rows"])  # see ROW_COUNTS
def _add_rms_norm_kernel(
    X, R, W, S, Y, rows, columns, stride_x, stride_r, eps, ROWS: tl.constexpr, COLUMNS: tl.constexpr
):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    column = tl.arange(0, COLUMNS)
    inside = (row < rows)[:, None] & (column < columns)[None, :]
    row = row.to(tl.int64)
    x = tl.load(X + row[:, None] * stride_x + column[None, :], mask=inside, other=0.0)
    r = tl.load(R + row[:, None] * stride_r + column[None, :], mask=inside, other=0.0)
    total = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded as the plain add rounds it
    tl.store(S + row[:, None] * columns + column[None, :], total, mask=inside)
    tl.store(Y + row[:, None] * columns + column[None, :], _normed(total, W, column, columns, eps), mask=inside)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + x, rms_norm(residual + x)) for x, residual [..., D] of one dtype: the sum as the plain add
    gives it, its norm as `rms_norm` gives it; both contiguous."""
    columns = x.shape[-1]
    xs, rs = (t.reshape(-1, columns) for t in (x, residual))  # views where the rows have one stride
    xs, rs = (t if t.stride(-1) == 1 else t.contiguous() for t in (xs, rs))
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=torch.result_type(weight, x), device=x.device)
    grid, per_program, block = _row_blocks(xs.shape[0], columns)
    _add_rms_norm_kernel[grid](
        xs, rs, weight, total, out, xs.shape[0], columns, xs.stride(0), rs.stride(0), eps,
        ROWS=per_program, COLUMNS=block, num_warps=NUM_WARPS,
    )  # fmt: skip
    return total, out


@triton.jit
def _norm_rope_rows(
    X, Y, W, COS, SIN, program, rows, heads, half, stride_xt, stride_xh, stride_cos, stride_sin, eps,
    ROWS: tl.constexpr, HALF: tl.constexpr,
):  # fmt: skip
    """Rows r = t·heads + h of X (token t's head h, at t·stride_xt + h·stride_xh) normed by W, then rotated by
    halves with token t's COS/SIN: Y [rows, 2·half] contiguous."""
    row = program * ROWS + tl.arange(0, ROWS)
    column = tl.arange(0, HALF)
    inside = (row < rows)[:, None] & (column < half)[None, :]
    row = row.to(tl.int64)
    token = row // heads
    at = (token * stride_xt + (row % heads) * stride_xh)[:, None] + column[None, :]
    first = tl.load(X + at, mask=inside, other=0.0)
    second = tl.load(X + at + half, mask=inside, other=0.0)
    first32, second32 = first.to(tl.float32), second.to(tl.float32)
    scale = tl.rsqrt((tl.sum(first32 * first32, 1) + tl.sum(second32 * second32, 1)) / (2 * half) + eps)[:, None]
    w_first = tl.load(W + column, mask=column < half, other=0.0).to(tl.float32)[None, :]
    w_second = tl.load(W + half + column, mask=column < half, other=0.0).to(tl.float32)[None, :]
    out = Y.dtype.element_ty
    # the norm's result as `rms_norm` rounds it: the normed row in x's dtype, times the weight, in Y's dtype
    n_first = (w_first * (first32 * scale).to(first.dtype).to(tl.float32)).to(out).to(tl.float32)
    n_second = (w_second * (second32 * scale).to(first.dtype).to(tl.float32)).to(out).to(tl.float32)
    cos_at, sin_at = token[:, None] * stride_cos + column[None, :], token[:, None] * stride_sin + column[None, :]
    cos_first = tl.load(COS + cos_at, mask=inside, other=0.0).to(tl.float32)
    cos_second = tl.load(COS + cos_at + half, mask=inside, other=0.0).to(tl.float32)
    sin_first = tl.load(SIN + sin_at, mask=inside, other=0.0).to(tl.float32)
    sin_second = tl.load(SIN + sin_at + half, mask=inside, other=0.0).to(tl.float32)
    target = row[:, None] * (2 * half) + column[None, :]
    tl.store(Y + target, n_first * cos_first - n_second * sin_first, mask=inside)
    tl.store(Y + target + half, n_second * cos_second + n_first * sin_second, mask=inside)


@triton.jit(do_not_specialize=["q_rows", "k_rows"])  # see ROW_COUNTS
def _norm_rope_kernel(
    Q, K, QW, KW, QY, KY, COS, SIN, q_rows, k_rows, heads, kv_heads, half, stride_qt, stride_qh, stride_kt,
    stride_kh, stride_cos, stride_sin, eps, ROWS: tl.constexpr, HALF: tl.constexpr,
):  # fmt: skip
    program = tl.program_id(0)
    q_programs = tl.cdiv(q_rows, ROWS)
    if program < q_programs:
        _norm_rope_rows(
            Q, QY, QW, COS, SIN, program, q_rows, heads, half, stride_qt, stride_qh, stride_cos, stride_sin, eps,
            ROWS, HALF,
        )  # fmt: skip
    else:
        _norm_rope_rows(
            K, KY, KW, COS, SIN, program - q_programs, k_rows, kv_heads, half, stride_kt, stride_kh, stride_cos,
            stride_sin, eps, ROWS, HALF,
        )  # fmt: skip


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """[B, L, H, D] -> [B·L, H, D] (a view where the tokens have one stride), each head's row contiguous."""
    x = x.reshape(-1, *x.shape[-2:])
    return x if x.stride(-1) == 1 else x.contiguous()


def norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, L, H, D], k [B, L, Hkv, D] (views of a joined q/k/v product are read in place), cos/sin [B, L, D]
    -> (q, k) [B, H, L, D], [B, Hkv, L, D]: each head's row RMS-normed by its weight (`rms_norm`), then rotated
    by halves (`rope`); both are transposed views of contiguous [B, L, H, D] tensors, as the model's own
    `norm(x).transpose(1, 2)` and rotary give them."""
    batch, length, heads, dim = q.shape
    kv_heads = k.shape[2]
    qs, ks = _tokens(q), _tokens(k)
    cos, sin = (x.expand(batch, length, dim).reshape(-1, dim) for x in (cos, sin))  # [B·L, D]
    cos, sin = (x if x.stride(-1) == 1 else x.contiguous() for x in (cos, sin))
    q_out = torch.empty(q.shape, dtype=torch.result_type(q_weight, q), device=q.device)
    k_out = torch.empty(k.shape, dtype=torch.result_type(k_weight, k), device=k.device)
    half = dim // 2
    rows_per_program = max(ELEMENTS_PER_PROGRAM // triton.next_power_of_2(dim), 1)
    q_rows, k_rows = batch * length * heads, batch * length * kv_heads
    grid = (triton.cdiv(q_rows, rows_per_program) + triton.cdiv(k_rows, rows_per_program),)
    _norm_rope_kernel[grid](
        qs, ks, q_weight, k_weight, q_out, k_out, cos, sin, q_rows, k_rows, heads, kv_heads, half,
        *qs.stride()[:2], *ks.stride()[:2], cos.stride(0), sin.stride(0), eps,
        ROWS=rows_per_program, HALF=triton.next_power_of_2(half), num_warps=NUM_WARPS,
    )  # fmt: skip
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


@triton.jit
def _store_rows_kernel(SRC, DST, SLOTS, width, stride_src, stride_dst, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOTS + row).to(tl.int64)
    column = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = column < width
    tl.store(DST + slot * stride_dst + column, tl.load(SRC + row * stride_src + column, mask=inside), mask=inside)


def store_rows(dst: torch.Tensor, slots: torch.Tensor, src: torch.Tensor) -> None:
    """dst[slots[i]] = src[i] (`dst.index_copy_(0, slots, src)`), for dst [C, ...] contiguous and src [R, ...]
    whose rows are each contiguous (any stride between rows)."""
    width = dst[0].numel()
    rows = src.reshape(src.shape[0], width)  # a view where each row is contiguous; a copy otherwise
    grid = (rows.shape[0], triton.cdiv(width, COLUMNS_PER_PROGRAM))
    _store_rows_kernel[grid](rows, dst, slots, width, rows.stride(0), width, BLOCK=COLUMNS_PER_PROGRAM)
