"""Fused operations as one table: `FusedOps` holds one implementation of each small operation of a decoder layer.

`reference_ops()` computes them in plain torch (what any fused kernel must compute, on any device: the tests
use it); `liger_ops()` gives the Triton kernels where liger-kernel is installed (`pip install 'typedlm[cuda]'`:
its rotary and SwiGLU product, with typedlm's own RMSNorm, joined SwiGLU, residual-add RMSNorm and q/k norms
with the rotary after them from `triton_ops`). `agrees` is the test a candidate passes before
`typedlm.runtime.patching` swaps it into a model.
No model and no transformers here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FusedOps:
    """One implementation of each operation.

    - `rms_norm(x [..., D], weight [D], eps) -> [..., D]`: x·rsqrt(mean(x²) + eps) in float32, cast back to
      x's dtype, times weight (transformers' Llama convention);
    - `silu_mul(gate [..., F], up [..., F]) -> [..., F]`: silu(gate)·up;
    - `rope(q [B, H, L, D], k [B, Hkv, L, D], cos [B, L, D], sin [B, L, D]) -> (q, k)`: rotated by halves (may
      write into q and k);
    - `silu_mul_joined(h [..., 2F]) -> [..., F]`: silu(h[..., :F])·h[..., F:], for an MLP whose gate and up
      projections run as one matrix product (None: they run apart, through `silu_mul`);
    - `add_rms_norm(x, residual, weight, eps) -> (residual + x, rms_norm(residual + x))`: a decoder layer's
      residual add and the norm that reads its sum (None: they run apart);
    - `norm_rope(q [B, L, H, D], k [B, L, Hkv, D], q_weight [D], k_weight [D], eps, cos [B, L, D], sin) -> (q, k)`
      [B, H, L, D], [B, Hkv, L, D]: an attention's per-head q and k norms (`rms_norm`), then `rope`, for a model
      that norms each head before rotating it (None: they run apart).
    """

    name: str
    device_type: str | None  # the device these kernels run on (None: any); other tensors take the original path
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul_joined: Callable[[torch.Tensor], torch.Tensor] | None = None
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    norm_rope: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None

    def runs_on(self, x: torch.Tensor) -> bool:
        return self.device_type is None or x.device.type == self.device_type


def _reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [..., D]
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _reference_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def _reference_rope(q, k, cos, sin):
    # q: [B, H, L, D], cos/sin: [B, L, D] -> broadcast over heads
    cos, sin = cos[:, None], sin[:, None]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


def _reference_silu_mul_joined(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return _reference_silu_mul(gate, up)


def _reference_add_rms_norm(x, residual, weight, eps):
    total = residual + x
    return total, _reference_rms_norm(total, weight, eps)


def _reference_norm_rope(q, k, q_weight, k_weight, eps, cos, sin):
    # q: [B, L, H, D] -> normed per head, [B, H, L, D], then rotated
    q, k = (_reference_rms_norm(x, w, eps).transpose(1, 2) for x, w in ((q, q_weight), (k, k_weight)))
    return _reference_rope(q, k, cos, sin)


def reference_ops() -> FusedOps:
    """The operations in plain torch: what the fused kernels must compute."""
    return FusedOps(
        "reference",
        None,
        _reference_rms_norm,
        _reference_silu_mul,
        _reference_rope,
        _reference_silu_mul_joined,
        _reference_add_rms_norm,
        _reference_norm_rope,
    )


def liger_ops() -> FusedOps | None:
    """Triton kernels: liger-kernel's rotary and SwiGLU product, typedlm's RMSNorm, joined SwiGLU, residual add
    with RMSNorm and q/k norms with rotary (`triton_ops`); None where liger-kernel (or Triton) is not installed."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        from typedlm.ops.triton_ops import add_rms_norm, norm_rope, rms_norm, silu_mul_joined
    except ImportError:
        return None
    return FusedOps(
        "triton",
        "cuda",
        rms_norm,
        LigerSiLUMulFunction.apply,
        lambda q, k, cos, sin: LigerRopeFunction.apply(q, k, cos, sin),
        silu_mul_joined,
        add_rms_norm,
        norm_rope,
    )


def agrees(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to the rounding of the dtype (relative to the values' scale)."""
    tolerance = 1e-5 if want.dtype in (torch.float32, torch.float64) else 2e-2
    scale = 1.0 + want.float().abs().max().item()
    return got.shape == want.shape and bool((got.float() - want.float()).abs().max().item() <= tolerance * scale)
