"""Model patching: a model's small operations (RMSNorm, the SwiGLU product, rotary embeddings) swapped for fused ones.

transformers runs a Llama-family layer's small operations as chains of elementwise kernels, in float32 (an
RMSNorm is six kernels, a rotary embedding about ten). On a GPU, under a CUDA graph, those kernels and their
memory traffic took more time than the matrix products (see benchmarks/README.md). `fuse(model, ops)` swaps
each for one kernel of `ops` (a `typedlm.ops.fused.FusedOps`: the Triton kernels, or the same operations in
plain torch for tests).

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from typedlm.ops.fused import FusedOps, agrees
from typedlm.runtime import hf

PROBE_ROWS = 8  # rows of the random inputs a candidate is checked on
CAPTURED = "_typedlm_graphs_captured"  # set on a model's decoder once CUDA graphs recorded its weights' addresses
_WRAPPED = "_typedlm_fused"  # marks a forward or rotary function already swapped (its value: the ops' name)


@dataclass
class FusionReport:
    """What `fuse` swapped, and what it kept because the fused operation disagreed or did not apply."""

    ops: str
    norms: int = 0
    mlps: int = 0
    rope: bool = False
    projections: int = 0  # attention layers whose q, k and v projections run as one matrix product
    residual_norms: int = 0  # decoder layers whose residual adds run fused with the norms that read them
    kept: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        kept = f"; kept the model's own: {', '.join(self.kept)}" if self.kept else ""
        rope = "fused" if self.rope else "not"
        joined = f", q/k/v joined in {self.projections} layers" if self.projections else ""
        added = f", residual adds fused with norms in {self.residual_norms} layers" if self.residual_norms else ""
        return f"{self.ops} kernels: {self.norms} norms, {self.mlps} MLPs, rotary {rope}{joined}{added}{kept}"


def _norm_forward(module: torch.nn.Module, original: Callable, ops: FusedOps) -> Callable:
    eps = _norm_eps(module)

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
    gate, up = module.gate_proj, module.up_proj
    return _joinable_linears([gate, up]) and gate.bias is None and gate.weight.shape == up.weight.shape


def _joins(module: torch.nn.Module, ops: FusedOps) -> bool:
    """Whether `ops` runs this MLP's gate and up as one matrix product."""
    return ops.silu_mul_joined is not None and _joinable(module)


def _fused_mlp(module: torch.nn.Module, x: torch.Tensor, ops: FusedOps, joined: torch.Tensor | None) -> torch.Tensor:
    """The MLP through `ops`: gate and up as one product with the `joined` weight, or apart without it."""
    if joined is not None:
        return module.down_proj(ops.silu_mul_joined(torch.nn.functional.linear(x, joined)))
    return module.down_proj(ops.silu_mul(module.gate_proj(x), module.up_proj(x)))


def _mlp_forward(module: torch.nn.Module, original: Callable, ops: FusedOps) -> Callable:
    joined = _join_linears([module.gate_proj, module.up_proj])[0] if _joins(module, ops) else None

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _fused_mlp(module, x, ops, joined) if ops.runs_on(x) else original(x)

    return forward


PROJECTIONS = ("q_proj", "k_proj", "v_proj")


class _JoinedProjections:
    """An attention's q, k and v projections as ONE matrix product.

    Their weights (and biases) move into one tensor, each module keeping a view of its rows (no memory added).
    The attention calls q, k and v in turn on one input: q's call computes the joined product and keeps k's
    and v's columns for their calls on that same input (views: no copies). A call on any other input, or in
    another order, runs the module's own product, so no call ever gets a part computed from another input.
    """

    def __init__(self, attention: torch.nn.Module):
        modules = [getattr(attention, name) for name in PROJECTIONS]
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
    modules = [getattr(module, name, None) for name in PROJECTIONS]
    return _joinable_linears(modules)


def _join_projections(model: torch.nn.Module, ops: FusedOps, report: FusionReport, move_weights: bool) -> None:
    """Run every attention's q, k and v projections as one matrix product (checked on a probe).

    Without `move_weights` (CUDA graphs were captured on the model) only those an earlier `fuse` joined stay so.
    """
    for module in model.modules():
        if not _joinable_projections(module):
            continue
        if getattr(module.q_proj.forward, _WRAPPED, None) == ops.name:
            report.projections += 1  # joined by an earlier `fuse`
            continue
        if not move_weights:
            note = "q/k/v apart (CUDA graphs already captured on this model)"
            if note not in report.kept:
                report.kept.append(note)
            continue
        projections = [getattr(module, name) for name in PROJECTIONS]
        x = _probe((PROBE_ROWS, module.q_proj.in_features), module.q_proj.weight)
        want = [m(x) for m in projections]
        originals = [m.forward for m in projections]
        joined = _JoinedProjections(module)
        for index, (m, original) in enumerate(zip(projections, originals)):
            m.forward = joined.forward(index, original)
            setattr(m.forward, _WRAPPED, ops.name)
        if all(agrees(m(x), w) for m, w in zip(projections, want)):
            report.projections += 1
            continue
        for m, original in zip(projections, originals):  # the weights stay views of the joined tensor: same values
            m.forward = original
        report.kept.append(f"{type(module).__name__} q/k/v apart")


RESIDUAL_LAYER = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")


class _ResidualHandoff:
    """A decoder layer's last residual add, fused with the norm that reads the sum next (the next layer's input
    norm, or the final norm): the layer returns the sum and leaves the normed rows here, and that norm's call on
    that very tensor takes them. A norm called on any other tensor computes its own."""

    def __init__(self):
        self.total: torch.Tensor | None = None
        self.normed: torch.Tensor | None = None

    def give(self, total: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        self.total, self.normed = total, normed
        return total

    def take(self, x: torch.Tensor) -> torch.Tensor | None:
        if x is not self.total:
            return None
        normed, self.total, self.normed = self.normed, None, None
        return normed


class _ProbeAttention(torch.nn.Module):
    """Stands in for a layer's attention while the layer's forward is checked: a fixed map of its input."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
        return hidden_states.flip(-1) * 0.5, None


def _residual_forward(
    layer: torch.nn.Module, original: Callable, ops: FusedOps, handoff: _ResidualHandoff, next_norm
) -> Callable:
    """A pre-norm decoder layer (x + attention(norm(x)), then + mlp(norm(·))) with both residual adds fused
    with the norms that read them: the attention's with the post-attention norm, the MLP's with `next_norm`."""
    post, post_eps = layer.post_attention_layernorm, _norm_eps(layer.post_attention_layernorm)
    next_eps = _norm_eps(next_norm) if next_norm is not None else None

    def forward(hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or not ops.runs_on(hidden_states):  # positional arguments: the layer's own order, its own forward
            return original(hidden_states, *args, **kwargs)
        attention, *_ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
        residual, normed = ops.add_rms_norm(attention, hidden_states, post.weight, post_eps)
        out = layer.mlp(normed)
        if next_norm is None:
            return residual + out
        return handoff.give(*ops.add_rms_norm(out, residual, next_norm.weight, next_eps))

    return forward


def _handoff_norm_forward(norm: torch.nn.Module, handoff: _ResidualHandoff) -> Callable:
    own = norm.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        normed = handoff.take(x)
        return normed if normed is not None else own(x)

    return forward


def _residual_layer_agrees(layer: torch.nn.Module, ops: FusedOps) -> bool:
    """The fused forward equals the layer's own with a stand-in attention, and hands the next norm its rows."""
    attention, post = layer.self_attn, layer.post_attention_layernorm
    layer.self_attn = _ProbeAttention()
    try:
        x = _probe((1, PROBE_ROWS, post.weight.shape[0]), post.weight)
        want = layer.forward(x)
        if not isinstance(want, torch.Tensor):  # a layer returning a tuple (older transformers) keeps its own
            return False
        norm = layer.input_layernorm  # any fused norm serves as the next one
        handoff = _ResidualHandoff()
        alone = _residual_forward(layer, layer.forward, ops, handoff, None)(x)
        handed = _residual_forward(layer, layer.forward, ops, handoff, norm)(x)
        taken = handoff.take(handed)
        return agrees(alone, want) and agrees(handed, want) and taken is not None and agrees(taken, norm(want))
    finally:
        layer.self_attn = attention


def _fuse_residual_norms(model: torch.nn.Module, ops: FusedOps, report: FusionReport) -> None:
    """Fuse every pre-norm decoder layer's residual adds with the norms that read their sums (checked per layer
    class with a stand-in attention). Needs the layers' norms fused already (their kernels agreed)."""
    if ops.add_rms_norm is None:
        return
    for decoder in model.modules():
        layers, final = getattr(decoder, "layers", None), getattr(decoder, "norm", None)
        if not isinstance(layers, torch.nn.ModuleList) or final is None:
            continue
        handoff, verdict = _ResidualHandoff(), {}
        for i, layer in enumerate(layers):
            if getattr(layer.forward, _WRAPPED, None) == ops.name:
                report.residual_norms += 1  # fused by an earlier `fuse`
                continue
            next_norm = getattr(layers[i + 1], "input_layernorm", None) if i + 1 < len(layers) else final
            norms = [getattr(layer, name, None) for name in RESIDUAL_LAYER[2:]] + [next_norm]
            if not all(hasattr(layer, name) for name in RESIDUAL_LAYER) or not all(
                getattr(n, "forward", None) is not None and getattr(n.forward, _WRAPPED, None) == ops.name
                for n in norms
            ):
                continue
            kind = type(layer)
            if kind not in verdict:
                verdict[kind] = _residual_layer_agrees(layer, ops)
                if not verdict[kind]:
                    report.kept.append(f"{kind.__name__} residual adds")
            if not verdict[kind]:
                continue
            layer.forward = _residual_forward(layer, layer.forward, ops, handoff, next_norm)
            setattr(layer.forward, _WRAPPED, ops.name)
            next_norm.forward = _handoff_norm_forward(next_norm, handoff)
            setattr(next_norm.forward, _WRAPPED, ops.name)
            report.residual_norms += 1


def _probe(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator(device=like.device).manual_seed(0)
    return torch.randn(shape, generator=generator, device=like.device).to(like.dtype)


def _norm_eps(module: torch.nn.Module) -> float | None:
    return getattr(module, "variance_epsilon", getattr(module, "eps", None))


def _is_rms_norm(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and _norm_eps(module) is not None
        and weight is not None
        and weight.dim() == 1
    )


def _is_gated_mlp(module: torch.nn.Module) -> bool:
    return all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj"))


def _norm_agrees(module: torch.nn.Module, ops: FusedOps) -> bool:
    x = _probe((PROBE_ROWS, module.weight.shape[0]), module.weight)
    return agrees(ops.rms_norm(x, module.weight, _norm_eps(module)), module.forward(x))


def _mlp_agrees(module: torch.nn.Module, ops: FusedOps) -> bool:
    """The fused MLP as `_mlp_forward` will run it (gate and up joined where they can be) against the module's."""
    x = _probe((PROBE_ROWS, module.gate_proj.in_features), module.gate_proj.weight)
    joined = torch.cat([module.gate_proj.weight, module.up_proj.weight]) if _joins(module, ops) else None
    return agrees(_fused_mlp(module, x, ops, joined), module.forward(x))


def _swap_forwards(
    model: torch.nn.Module,
    ops: FusedOps,
    report: FusionReport,
    applies: Callable[[torch.nn.Module], bool],
    check: Callable[[torch.nn.Module, FusedOps], bool],
    fused_forward: Callable[[torch.nn.Module, Callable, FusedOps], Callable],
) -> int:
    """Swap the forward of every module `applies` to whose class `check` passes (on its first instance).

    Returns how many modules run `ops` now; those an earlier `fuse` swapped are neither checked nor wrapped again.
    """
    verdict: dict[type, bool] = {}
    swapped = 0
    for module in model.modules():
        if not applies(module):
            continue
        if getattr(module.forward, _WRAPPED, None) == ops.name:
            swapped += 1
            continue
        kind = type(module)
        if kind not in verdict:
            verdict[kind] = check(module, ops)
            if not verdict[kind]:
                report.kept.append(kind.__name__)
        if verdict[kind]:
            forward = fused_forward(module, module.forward, ops)
            setattr(forward, _WRAPPED, ops.name)
            module.forward = forward
            swapped += 1
    return swapped


def _fuse_rope(model: torch.nn.Module, ops: FusedOps, report: FusionReport) -> None:
    shape = hf.ModelShape.of(model)
    original = hf.rotary_function(model)
    if original is None:
        report.kept.append("rotary (no apply_rotary_pos_emb)")
        return
    if getattr(original, _WRAPPED, None) == ops.name:
        report.rope = True
        return
    original = getattr(original, "__wrapped__", original)
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    like = next(model.parameters())
    q, k = _probe((1, heads, PROBE_ROWS, dim), like), _probe((1, kv_heads, PROBE_ROWS, dim), like) * 0.5
    angles = _probe((1, PROBE_ROWS, dim // 2), like).float()
    cos, sin = (f(torch.cat((angles, angles), dim=-1)).to(like.dtype) for f in (torch.cos, torch.sin))
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
    setattr(rope, _WRAPPED, ops.name)
    hf.set_rotary_function(model, rope)
    report.rope = True


@torch.inference_mode()
def fuse(model: torch.nn.Module, ops: FusedOps) -> FusionReport:
    """Swap the model's RMSNorms, SwiGLU MLPs and rotary embedding for `ops` where each agrees on a probe, and
    join each attention's q/k/v projections into one matrix product."""
    report = FusionReport(ops.name)
    if not ops.runs_on(next(model.parameters())):
        report.kept.append(f"everything (these kernels need {ops.device_type})")
        return report
    captured = any(getattr(m, CAPTURED, False) for m in model.modules())
    unswapped_mlps = any(_is_gated_mlp(m) and getattr(m.forward, _WRAPPED, None) != ops.name for m in model.modules())
    if ops.silu_mul_joined is not None and unswapped_mlps and captured:
        # joining moves the gate/up weights, and graphs captured earlier would read their old memory
        ops = dataclasses.replace(ops, silu_mul_joined=None)
        report.kept.append("gate/up apart (CUDA graphs already captured on this model)")
    report.norms = _swap_forwards(model, ops, report, _is_rms_norm, _norm_agrees, _norm_forward)
    report.mlps = _swap_forwards(model, ops, report, _is_gated_mlp, _mlp_agrees, _mlp_forward)
    _fuse_rope(model, ops, report)
    _join_projections(model, ops, report, move_weights=not captured)
    _fuse_residual_norms(model, ops, report)
    return report


def unfuse_rope(model: torch.nn.Module) -> None:
    """Restore the original rotary function of the model's family (tests)."""
    current = hf.rotary_function(model)
    if current is not None and hasattr(current, "__wrapped__"):
        hf.set_rotary_function(model, current.__wrapped__)
