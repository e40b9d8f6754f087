"""The fused gate/up product with SwiGLU equals the joined product, then `silu_mul_joined`'s activation.

Without a GPU the kernels run in Triton's interpreter (see tests/__init__); on a GPU, compiled (bf16 there).
"""

from __future__ import annotations

import pytest
import torch

from typedlm.ops import gated_product as gp

from .conftest import needs_triton

pytestmark = needs_triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def unfused(x: torch.Tensor, joined: torch.Tensor) -> torch.Tensor:
    """The two operations apart: the joined product in float64, then silu(gate)·up."""
    h = torch.nn.functional.linear(x.double(), joined.double())
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@pytest.mark.parametrize("path", ["pointers", "descriptors"])
@pytest.mark.parametrize(
    "shape, columns, depth",
    [((3, 70, 96), 40, 96), ((130,), 136, 100), ((0, 5), 8, 64), ((2, 129), 128, 64)],
)  # rows, columns and depth off the tiles; no rows; exactly one column tile
def test_gated_product_equals_the_product_then_the_activation(shape, columns, depth, path, monkeypatch):
    """Every row and column is written and right, tails included (float32: the interpreter's and torch's sums),
    whether the operands are read through pointers or tensor descriptors (rows past the end filled with zeros,
    stores clipped)."""
    monkeypatch.setattr(gp, "_descriptors_here", lambda *tensors: path == "descriptors")
    monkeypatch.setattr(gp, "BLOCK_M", 64)  # several row tiles and GROUP_M's grouping even for small inputs
    monkeypatch.setattr(gp, "GROUP_M", 2)
    torch.manual_seed(len(shape) + columns)
    x = torch.randn(*shape, depth, device=DEVICE)
    joined = torch.randn(2 * columns, depth, device=DEVICE) / depth**0.5
    got = gp.gated_product(x, joined)
    assert got.shape == (*shape, columns) and got.dtype == x.dtype
    torch.testing.assert_close(got.double(), unfused(x, joined), rtol=1e-4, atol=1e-4)


def test_a_row_does_not_depend_on_the_other_rows():
    """The same row alone and among others: bit for bit (batch invariance)."""
    torch.manual_seed(5)
    x = torch.randn(150, 64, device=DEVICE)
    joined = torch.randn(2 * 72, 64, device=DEVICE)
    together = gp.gated_product(x, joined)
    for row in (0, 77, 149):
        assert torch.equal(gp.gated_product(x[row : row + 1], joined), together[row : row + 1])


def test_strided_rows_are_read_where_they_lie():
    """x as a column slice of a wider tensor (rows not contiguous with each other)."""
    torch.manual_seed(6)
    wide = torch.randn(33, 200, device=DEVICE)
    x = wide[:, 8:72]
    joined = torch.randn(2 * 24, 64, device=DEVICE)
    torch.testing.assert_close(gp.gated_product(x, joined).double(), unfused(x, joined), rtol=1e-4, atol=1e-4)


def test_the_weight_must_be_joined_rows():
    with pytest.raises(AssertionError, match="joined"):
        gp.gated_product(torch.randn(2, 8, device=DEVICE), torch.randn(9, 8, device=DEVICE))
