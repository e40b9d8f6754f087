"""Fused-kernel swapping: a swapped model computes what it computed before, and a wrong kernel is refused."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from typedlm.ops.fused import agrees, reference_ops
from typedlm.runtime.patching import CAPTURED, fuse, unfuse_rope

from ..conftest import needs_triton, tiny_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def ids():
    return torch.randint(0, 200, (1, 23), generator=torch.Generator().manual_seed(0))


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_reference_kernels_swap_in_and_keep_the_outputs(family, ids):
    model = tiny_model(family, 256)
    want = _logits(model, ids)
    report = fuse(model, reference_ops())
    try:
        assert report.norms > 0 and report.mlps == model.config.num_hidden_layers and report.rope, report
        assert not report.kept, report
        assert agrees(_logits(model, ids), want)
        mlp = model.model.layers[0].mlp  # gate and up now run as one product: their weights share one tensor
        assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.up_proj.weight.untyped_storage().data_ptr()
        attention = model.model.layers[0].self_attn  # and so do q, k and v
        assert report.projections == model.config.num_hidden_layers
        assert len({m.weight.untyped_storage().data_ptr() for m in _projections(attention)}) == 1
        assert report.residual_norms == model.config.num_hidden_layers
        # Qwen3 norms each head of q and k before the rotary: the two norms and the rotary run as one op
        assert report.norm_ropes == (model.config.num_hidden_layers if family == "qwen3" else 0)
    finally:
        unfuse_rope(model)


def _projections(attention) -> list[torch.nn.Linear]:
    return [attention.q_proj, attention.k_proj, attention.v_proj]


def test_joined_projections_never_hand_out_another_inputs_part():
    model = tiny_model("qwen3", 256)
    attention = model.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(0)
    inputs = {name: torch.randn(3, attention.q_proj.in_features, generator=generator) for name in "xy"}
    with torch.inference_mode():
        want = {
            (index, name): torch.nn.functional.linear(z, m.weight)
            for name, z in inputs.items()
            for index, m in enumerate(_projections(attention))
        }
        fuse(model, reference_ops())
        unfuse_rope(model)
        # (projection: 0 q, 1 k, 2 v; input): in order, interleaved, out of order, a part asked for twice
        calls = ["0x", "1x", "2x", "0x", "1y", "2x", "1x", "2y", "1y", "0y", "0y", "1y", "1y", "2y"]
        for call in calls:
            index, name = int(call[0]), call[1]
            got = _projections(attention)[index](inputs[name])
            assert torch.allclose(got, want[index, name], atol=1e-6), call


def test_a_family_whose_operations_differ_keeps_its_own(ids):
    model = tiny_model("gemma3", 256)  # RMSNorm scales by 1 + weight; the MLP is GELU-gated
    want = _logits(model, ids)
    report = fuse(model, reference_ops())
    try:
        assert report.norms == 0 and report.mlps == 0 and report.residual_norms == 0, report
        assert any("RMSNorm" in kept for kept in report.kept) and any("MLP" in kept for kept in report.kept)
        assert agrees(_logits(model, ids), want)
    finally:
        unfuse_rope(model)


def test_a_wrong_residual_add_is_refused(ids):
    model = tiny_model("qwen3", 256)
    want = _logits(model, ids)
    reference = reference_ops()

    def wrong(x, residual, weight, eps):
        total, normed = reference.add_rms_norm(x, residual, weight, eps)
        return total * 1.01, normed

    report = fuse(model, dataclasses.replace(reference, add_rms_norm=wrong))
    try:
        assert report.residual_norms == 0 and "Qwen3DecoderLayer residual adds" in report.kept
        assert agrees(_logits(model, ids), want)
    finally:
        unfuse_rope(model)


def test_a_norm_takes_handed_rows_only_for_the_sum_they_came_from():
    model = tiny_model("qwen3", 256)
    fuse(model, reference_ops())
    unfuse_rope(model)
    layer, norm = model.model.layers[-1], model.model.norm
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.randn(1, 5, norm.weight.shape[0], generator=generator) for _ in range(2))
    with torch.inference_mode():
        own = lambda z: reference_ops().rms_norm(z, norm.weight, norm.variance_epsilon)  # noqa: E731
        layer.self_attn, attention = torch.nn.Identity(), layer.self_attn
        layer.self_attn.forward = lambda hidden_states, **kwargs: (hidden_states * 0.5, None)
        total = layer(x)  # the last layer leaves the final norm's rows for `total`
        layer.self_attn = attention
        assert torch.allclose(norm(y), own(y))  # another tensor: its own norm
        assert torch.allclose(norm(total), own(total))  # the handed rows
        assert torch.allclose(norm(total), own(total))  # taken once: computed again, the same


def test_a_wrong_norm_rope_is_refused(ids):
    model = tiny_model("qwen3", 256)
    want = _logits(model, ids)
    reference = reference_ops()

    def wrong(q, k, *args):
        q, k = reference.norm_rope(q, k, *args)
        return q, k.flip(-2)  # keys of the wrong positions

    report = fuse(model, dataclasses.replace(reference, norm_rope=wrong))
    try:
        assert report.norm_ropes == 0 and "Qwen3Attention q/k norms and rotary apart" in report.kept
        assert report.norms > 0 and report.residual_norms > 0  # the rest is fused as before
        assert agrees(_logits(model, ids), want)
    finally:
        unfuse_rope(model)


def test_a_fused_attention_with_a_cache_runs_its_own_forward():
    """Prefill and a continuation through transformers' cache: the fused forward steps aside for the cache and
    the logits stay the model's own."""
    from transformers import DynamicCache

    model = tiny_model("qwen3", 256)
    ids = torch.randint(0, 200, (1, 12), generator=torch.Generator().manual_seed(1))

    def prefill_then_continue():
        with torch.inference_mode():
            cache = DynamicCache()
            first = model(input_ids=ids[:, :8], past_key_values=cache, use_cache=True).logits
            rest = model(input_ids=ids[:, 8:], past_key_values=cache, use_cache=True).logits
            return torch.cat([first, rest], dim=1)

    want = prefill_then_continue()
    report = fuse(model, reference_ops())
    try:
        assert report.norm_ropes == model.config.num_hidden_layers
        assert agrees(prefill_then_continue(), want)
        assert agrees(_logits(model, ids), want)
    finally:
        unfuse_rope(model)


def test_a_wrong_kernel_is_refused(ids):
    model = tiny_model("qwen3", 256)
    want = _logits(model, ids)
    reference = reference_ops()
    wrong = dataclasses.replace(reference, rms_norm=lambda x, weight, eps: reference.rms_norm(x, weight, eps) * 1.01)
    report = fuse(model, wrong)
    try:
        assert report.norms == 0 and report.mlps > 0 and "Qwen3RMSNorm" in report.kept
        assert report.residual_norms == 0  # the norms it would fuse with kept their own
        assert agrees(_logits(model, ids), want)
    finally:
        unfuse_rope(model)


def test_kernels_for_another_device_change_nothing(ids):
    model = tiny_model("qwen3", 256)
    cuda_only = dataclasses.replace(reference_ops(), device_type="cuda")
    report = fuse(model, cuda_only)
    assert report.norms == report.mlps == 0 and not report.rope and report.kept


def test_fusing_twice_swaps_once(ids):
    model = tiny_model("qwen3", 256)
    modeling = sys.modules[type(model.model.layers[0].self_attn).__module__]
    original = modeling.apply_rotary_pos_emb
    try:
        first = fuse(model, reference_ops())
        norm_forward = model.model.norm.forward
        setattr(model.model, CAPTURED, True)  # the first engine captured graphs: its joined MLPs stay as they are
        second = fuse(model, reference_ops())  # a second engine over the same model
        assert (second.norms, second.mlps, second.rope) == (first.norms, first.mlps, first.rope)
        assert not second.kept, second
        assert model.model.norm.forward is norm_forward  # swapped once, not wrapped again
        assert modeling.apply_rotary_pos_emb.__wrapped__ is original
    finally:
        unfuse_rope(model)
    assert modeling.apply_rotary_pos_emb is original


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_joined_silu_mul_kernel_equals_the_reference(dtype):
    from typedlm.ops.triton_ops import COLUMNS_PER_PROGRAM, silu_mul_joined

    columns = COLUMNS_PER_PROGRAM + 37  # a partial block of columns
    h = torch.randn(2, 5, 2 * columns, generator=torch.Generator().manual_seed(0)).to(dtype).to(DEVICE)
    got, want = silu_mul_joined(h), reference_ops().silu_mul_joined(h)
    assert got.dtype == want.dtype and agrees(got, want)


def test_gate_and_up_stay_apart_once_graphs_were_captured(ids):
    model = tiny_model("qwen3", 256)
    want = _logits(model, ids)
    setattr(model.model, CAPTURED, True)  # what a StaticRunner sets when it captures a graph of this model
    report = fuse(model, reference_ops())
    try:
        mlp = model.model.layers[0].mlp
        assert report.mlps == model.config.num_hidden_layers and any("gate/up apart" in k for k in report.kept)
        assert mlp.gate_proj.weight.untyped_storage().data_ptr() != mlp.up_proj.weight.untyped_storage().data_ptr()
        attention = model.model.layers[0].self_attn
        assert report.projections == 0 and any("q/k/v apart" in k for k in report.kept)
        assert len({m.weight.untyped_storage().data_ptr() for m in _projections(attention)}) == 3
        assert agrees(_logits(model, ids), want)
    finally:
        unfuse_rope(model)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 5, 1024), (1, 7, 16, 128), (3, 96)])  # hidden, per head, not a power of two
def test_rms_norm_kernel_equals_the_reference(shape, dtype):
    from typedlm.ops.fused import _reference_rms_norm
    from typedlm.ops.triton_ops import rms_norm

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator).to(dtype).to(DEVICE)
    weight = torch.randn(shape[-1], generator=generator).to(dtype).to(DEVICE)
    got, want = rms_norm(x, weight, 1e-6), _reference_rms_norm(x, weight, 1e-6)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert agrees(got, want)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_kernel_reads_heads_of_a_joined_product_in_place(dtype):
    from typedlm.ops.fused import _reference_rms_norm
    from typedlm.ops.triton_ops import rms_norm

    generator = torch.Generator().manual_seed(0)
    joined = torch.randn(1, 7, (4 + 2 + 2) * 128, generator=generator).to(dtype).to(DEVICE)  # q, k, v heads
    keys = joined[..., 4 * 128 : 6 * 128].view(1, 7, 2, 128)  # rows of the product's width: not one stride
    weight = torch.randn(128, generator=generator).to(dtype).to(DEVICE)
    got, want = rms_norm(keys, weight, 1e-6), _reference_rms_norm(keys, weight, 1e-6)
    assert got.shape == want.shape and got.is_contiguous() and agrees(got, want)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [128, 80])  # Qwen3's heads; a half that is not a power of two
def test_norm_rope_kernel_equals_the_norms_then_the_rotary(dtype, dim):
    from typedlm.ops.triton_ops import norm_rope

    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, length = 4, 2, 37  # more rows than one program takes
    joined = torch.randn(1, length, (heads + 2 * kv_heads) * dim, generator=generator).to(dtype).to(DEVICE)
    q = joined[..., : heads * dim].view(1, length, heads, dim)  # heads of the joined product, read in place
    k = joined[..., heads * dim : (heads + kv_heads) * dim].view(1, length, kv_heads, dim)
    q_weight, k_weight = (torch.randn(dim, generator=generator).to(dtype).to(DEVICE) for _ in range(2))
    angles = torch.randn(1, length, dim // 2, generator=generator) * 3
    cos, sin = (f(torch.cat((angles, angles), dim=-1)).to(dtype).to(DEVICE) for f in (torch.cos, torch.sin))
    got = norm_rope(q, k, q_weight, k_weight, 1e-6, cos, sin)
    want = reference_ops().norm_rope(q, k, q_weight, k_weight, 1e-6, cos, sin)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and agrees(g, w)
        assert g.transpose(1, 2).is_contiguous()  # as the model's own norm(x).transpose(1, 2) lays it out


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_kernel_equals_the_add_and_the_norm(dtype):
    from typedlm.ops.triton_ops import add_rms_norm

    generator = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(2, 5, 1024, generator=generator).to(dtype).to(DEVICE) for _ in range(2))
    weight = torch.randn(1024, generator=generator).to(dtype).to(DEVICE)
    total, normed = add_rms_norm(x, residual, weight, 1e-6)
    want_total, want_normed = reference_ops().add_rms_norm(x, residual, weight, 1e-6)
    if dtype == torch.float32 or DEVICE == "cuda":  # Triton's interpreter truncates to bfloat16 instead of rounding
        assert torch.equal(total, want_total)  # the sum rounded as the plain add rounds it
    assert agrees(total, want_total)
    assert normed.dtype == want_normed.dtype and agrees(normed, want_normed)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_store_kernel_equals_index_copy(dtype):
    """Rows that lie apart (the keys of a joined q/k/v product), stored at scattered slots: what index_copy_ stores,
    and nothing else touched; rows wider than one program's block."""
    from typedlm.ops.triton_ops import COLUMNS_PER_PROGRAM, store_rows

    generator = torch.Generator().manual_seed(0)
    heads, dim = 3, COLUMNS_PER_PROGRAM // 2 + 8  # 3 × 520 values per row: two blocks, the second partial
    joined = torch.randn(37, 7, dim, generator=generator).to(dtype).to(DEVICE)
    rows = joined[:, 2 : 2 + heads]  # [37, 3, dim]: each row contiguous, rows 7·dim apart
    slots = torch.randperm(50, generator=generator)[:37].to(DEVICE)
    got = torch.randn(50, heads, dim, generator=generator).to(dtype).to(DEVICE)
    want = got.clone().index_copy_(0, slots, rows)
    store_rows(got, slots, rows)
    assert torch.equal(got, want)
