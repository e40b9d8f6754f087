"""Model patching: a model's small operations (RMSNorm, the SwiGLU product, rotary embeddings) swapped for fused ones.

transformers runs a Llama-family layer's small operations as chains of elementwise kernels, in float32 (an
RMSNorm is six kernels, a rotary embedding about ten). On a GPU, under a CUDA graph, those kernels and their
memory traffic took more time than the matrix products (see docs/performance.md, "One request").
`fuse(model, ops)` swaps each for one kernel of `ops` (a `typedlm.ops.fused.FusedOps`: the Triton kernels, or the
same operations in plain torch for tests).

Nothing is swapped on trust. Each candidate runs beside the module or function it would replace, on random
inputs of the model's shapes, dtype and device, and is kept only where the two agree (`agrees`). A family whose
operation differs (Gemma's RMSNorm scales by 1 + weight, a GELU MLP, a partial rotary) keeps its own code for
that operation, and the report says so.

A SwiGLU MLP whose gate and up projections are plain linear maps of one shape runs them as ONE matrix product:
their weights are moved into one [2F, D] tensor (each module keeps a view of its half, so no memory is added)
and the activation reads the two halves of the product (`silu_mul_joined`). An attention's q, k and v
projections run as one matrix product the same way (`_JoinedProjections`: q's call computes all three, k's and
v's calls on the same input take their columns in place). Moving weights would break CUDA graphs already
captured on the model, so a model that has them keeps its projections apart.

Norms and MLPs are swapped per module instance. Rotary embeddings are a module-level function of the model's
modeling file (`apply_rotary_pos_emb`, reached through `hf`): it is wrapped there, for every model of the family
in this process; the wrapper calls the fused kernel only for CUDA tensors and the original otherwise.

Last, forwards that chain several operations are replaced where they agree (`layer_forwards`): a decoder layer's
residual adds fused with the norms that read them, and an attention's q/k norms with the rotary after them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from typedlm.ops.fused import FusedOps, agrees
from typedlm.runtime import hf
from typedlm.runtime.layer_forwards import (
    PROBE_ROWS,
    WRAPPED,
    fuse_norm_rope,
    fuse_residual_norms,
    probe,
    probe_rotary,
    swap_forwards,
)

CAPTURED = "_typedlm_graphs_captured"  # set on a model's decoder once CUDA graphs recorded its weights' addresses


@dataclass
class FusionReport:
    """What `fuse` swapped, and what it kept because the fused operation disagreed or did not apply."""

    ops: str
    norms: int = 0
    mlps: int = 0
    rope: bool = False
    projections: int = 0  # attention layers whose q, k and v projections run as one matrix product
    residual_norms: int = 0  # decoder layers whose residual adds run fused with the norms that read them
    norm_ropes: int = 0  # attention layers whose q/k norms and rotary run as one kernel
    kept: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        kept = f"; kept the model's own: {', '.join(self.kept)}" if self.kept else ""
        rope = "fused" if self.rope else "not"
        joined = f", q/k/v joined in {self.projections} layers" if self.projections else ""
        added = f", residual adds fused with norms in {self.residual_norms} layers" if self.residual_norms else ""
        rotated = f", q/k norms fused with rotary in {self.norm_ropes} layers" if self.norm_ropes else ""
        return f"{self.ops} kernels: {self.norms} norms, {self.mlps} MLPs, rotary {rope}{joined}{added}{rotated}{kept}"


def _norm_forward(module: torch.nn.Module, original: Callable, ops: FusedOps) -> Callable:
    eps = hf.norm_eps(module)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, module.weight, eps) if ops.runs_on(x) else original(x)

    return forward


def _joinable_linears(modules: list) -> bool:
    """Plain linear maps of one input size and dtype, all with biases or none: one matrix product can run them."""
    return (
        all(type(m) is torch.nn.Linear for m in modules)
        and len({m.in_features for m in modules}) == 1
        and len({m.bias is None for m in modules}) == 1
        and len({m.weight.dtype for m in modules}) == 1
    )


def _join_linears(modules: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The modules' weights (and biases) as one tensor, their rows in turn; each module's become views of its
    rows (no copy kept). Returns (weight, bias or None)."""
    weight = torch.cat([m.weight.detach() for m in modules])
    bias = torch.cat([m.bias.detach() for m in modules]) if modules[0].bias is not None else None
    start = 0
    for m in modules:
        rows = m.out_features
        m.weight.data = weight[start : start + rows]
        if bias is not None:
            m.bias.data = bias[start : start + rows]
        start += rows
    return weight, bias


def _joinable(module: torch.nn.Module) -> bool:
    """Gate and up are bias-free linear maps of one shape: they can run as one matrix product whose halves
    `silu_mul_joined` reads."""
    gate, up, _ = hf.gated_mlp(module)
    return _joinable_linears([gate, up]) and gate.bias is None and gate.weight.shape == up.weight.shape


def _joins(module: torch.nn.Module, ops: FusedOps) -> bool:
    """Whether `ops` runs this MLP's gate and up as one matrix product."""
    return ops.silu_mul_joined is not None and _joinable(module)


def _fused_mlp(module: torch.nn.Module, x: torch.Tensor, ops: FusedOps, joined: torch.Tensor | None) -> torch.Tensor:
    """The MLP through `ops`: gate and up as one product with the `joined` weight, or apart without it."""
    gate, up, down = hf.gated_mlp(module)
    if joined is not None:
        return down(ops.silu_mul_joined(torch.nn.functional.linear(x, joined)))
    return down(ops.silu_mul(gate(x), up(x)))


def _mlp_forward(module: torch.nn.Module, original: Callable, ops: FusedOps) -> Callable:
    gate, up, _ = hf.gated_mlp(module)
    joined = _join_linears([gate, up])[0] if _joins(module, ops) else None

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _fused_mlp(module, x, ops, joined) if ops.runs_on(x) else original(x)

    return forward


class _JoinedProjections:
    """An attention's q, k and v projections as ONE matrix product.

    Their weights (and biases) move into one tensor, each module keeping a view of its rows (no memory added).
    The attention calls q, k and v in turn on one input: q's call computes the joined product and keeps k's
    and v's columns for their calls on that same input (views: no copies). A call on any other input, or in
    another order, runs the module's own product, so no call ever gets a part computed from another input.
    """

    def __init__(self, attention: torch.nn.Module):
        modules = list(hf.qkv_projections(attention))
        self.weight, self.bias = _join_linears(modules)
        self.sizes = [m.out_features for m in modules]
        self.input: torch.Tensor | None = None
        self.parts: dict[int, torch.Tensor] = {}

    def forward(self, index: int, original: Callable) -> Callable:
        """The forward of projection `index` (0: q, 1: k, 2: v)."""

        def forward(x: torch.Tensor) -> torch.Tensor:
            if index == 0:
                q, *rest = torch.nn.functional.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
                self.input, self.parts = x, dict(enumerate(rest, 1))
                return q
            part = self.parts.pop(index, None) if x is self.input else None
            if not self.parts:
                self.input = None  # both parts handed out: nothing kept alive
            return part if part is not None else original(x)

        return forward


def _joinable_projections(module: torch.nn.Module) -> bool:
    """The module has q, k and v projections that one matrix product can run."""
    return _joinable_linears(list(hf.qkv_projections(module)))


def _join_projections(model: torch.nn.Module, ops: FusedOps, report: FusionReport, move_weights: bool) -> None:
    """Run every attention's q, k and v projections as one matrix product (checked on a probe).

    Without `move_weights` (CUDA graphs were captured on the model) only those an earlier `fuse` joined stay so.
    """
    for module in model.modules():
        if not _joinable_projections(module):
            continue
        projections = list(hf.qkv_projections(module))
        q = projections[0]
        if getattr(q.forward, WRAPPED, None) == ops.name:
            report.projections += 1  # joined by an earlier `fuse`
            continue
        if not move_weights:
            note = "q/k/v apart (CUDA graphs already captured on this model)"
            if note not in report.kept:
                report.kept.append(note)
            continue
        x = probe((PROBE_ROWS, q.in_features), q.weight)
        want = [m(x) for m in projections]
        originals = [m.forward for m in projections]
        joined = _JoinedProjections(module)
        for index, (m, original) in enumerate(zip(projections, originals)):
            m.forward = joined.forward(index, original)
            setattr(m.forward, WRAPPED, ops.name)
        if all(agrees(m(x), w) for m, w in zip(projections, want)):
            report.projections += 1
            continue
        for m, original in zip(projections, originals):  # the weights stay views of the joined tensor: same values
            m.forward = original
        report.kept.append(f"{type(module).__name__} q/k/v apart")


def _norm_agrees(module: torch.nn.Module, ops: FusedOps) -> bool:
    x = probe((PROBE_ROWS, module.weight.shape[0]), module.weight)
    return agrees(ops.rms_norm(x, module.weight, hf.norm_eps(module)), module.forward(x))


def _mlp_agrees(module: torch.nn.Module, ops: FusedOps) -> bool:
    """The fused MLP as `_mlp_forward` will run it (gate and up joined where they can be) against the module's."""
    gate, up, _ = hf.gated_mlp(module)
    x = probe((PROBE_ROWS, gate.in_features), gate.weight)
    joined = torch.cat([gate.weight, up.weight]) if _joins(module, ops) else None
    return agrees(_fused_mlp(module, x, ops, joined), module.forward(x))


def _fuse_rope(model: torch.nn.Module, ops: FusedOps, report: FusionReport) -> None:
    shape = hf.ModelShape.of(model)
    original = hf.rotary_function(model)
    if original is None:
        report.kept.append(f"rotary (no {hf.ROTARY_FUNCTION})")
        return
    if getattr(original, WRAPPED, None) == ops.name:
        report.rope = True
        return
    original = getattr(original, "__wrapped__", original)
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    like = next(model.parameters())
    q, k = probe((1, heads, PROBE_ROWS, dim), like), probe((1, kv_heads, PROBE_ROWS, dim), like) * 0.5
    cos, sin = probe_rotary(dim, like)
    want_q, want_k = original(q.clone(), k.clone(), cos, sin)
    got_q, got_k = ops.rope(q.clone(), k.clone(), cos, sin)
    if not (agrees(got_q, want_q) and agrees(got_k, want_k)):
        report.kept.append("rotary")
        return

    def rope(q, k, cos, sin, *args, **kwargs):
        if args or kwargs or not ops.runs_on(q):
            return original(q, k, cos, sin, *args, **kwargs)
        return ops.rope(q, k, cos, sin)

    rope.__wrapped__ = original
    setattr(rope, WRAPPED, ops.name)
    hf.set_rotary_function(model, rope)
    report.rope = True


@torch.inference_mode()
def fuse(model: torch.nn.Module, ops: FusedOps) -> FusionReport:
    """Swap the model's RMSNorms, SwiGLU MLPs and rotary embedding for `ops` where each agrees on a probe, join
    each attention's q/k/v projections into one matrix product, then fuse the attentions' q/k norms with the
    rotary and the layers' residual adds with their norms (`layer_forwards`)."""
    report = FusionReport(ops.name)
    if not ops.runs_on(next(model.parameters())):
        report.kept.append(f"everything (these kernels need {ops.device_type})")
        return report
    captured = any(getattr(m, CAPTURED, False) for m in model.modules())
    unswapped_mlps = any(hf.is_gated_mlp(m) and getattr(m.forward, WRAPPED, None) != ops.name for m in model.modules())
    if ops.silu_mul_joined is not None and unswapped_mlps and captured:
        # joining moves the gate/up weights, and graphs captured earlier would read their old memory
        ops = dataclasses.replace(ops, silu_mul_joined=None)
        report.kept.append("gate/up apart (CUDA graphs already captured on this model)")
    report.norms, kept_norms = swap_forwards(model, ops, hf.is_rms_norm, _norm_agrees, _norm_forward)
    report.mlps, kept_mlps = swap_forwards(model, ops, hf.is_gated_mlp, _mlp_agrees, _mlp_forward)
    report.kept += kept_norms + kept_mlps
    _fuse_rope(model, ops, report)
    _join_projections(model, ops, report, move_weights=not captured)
    report.norm_ropes, kept = fuse_norm_rope(model, ops)
    report.residual_norms, kept_layers = fuse_residual_norms(model, ops)
    report.kept += kept + kept_layers
    return report


def unfuse_rope(model: torch.nn.Module) -> None:
    """Restore the original rotary function of the model's family (tests)."""
    current = hf.rotary_function(model)
    if current is not None and hasattr(current, "__wrapped__"):
        hf.set_rotary_function(model, current.__wrapped__)
