"""The static-shape forward (CUDA graphs on a GPU) equals the dynamic one; here it runs eagerly on the CPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from typedlm.core.options import EngineOptions
from typedlm.ops.fused import reference_ops
from typedlm.ops.lse_attention import attend_ranges, attend_with_lse
from typedlm.runtime.engine import Engine
from typedlm.runtime.packing import PackedItem, pack
from typedlm.runtime.patching import fuse
from typedlm.runtime.static_inputs import FINE_FROM, FINE_STEP, Document, Shape, Slot, bucket
from typedlm.text.labels import LabelSet

from ..conftest import needs_triton, tiny_model

on_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="Triton runs CPU tensors only in its interpreter")
# model families, each with the attention as torch's kernels and as the cascade kernel (Triton's interpreter)
FAMILIES_AND_KERNEL = [
    ("qwen3", False),
    ("llama", False),
    pytest.param("qwen3", True, marks=[needs_triton, on_cpu]),
    pytest.param("llama", True, marks=[needs_triton, on_cpu]),
]
LABELS = LabelSet.build([[(5, 7)], [(5, 8)], [(9,)], [(10,), (11,)]])


def items(n: int, length: int) -> list[PackedItem]:
    return [PackedItem([300 + 7 * i + j for j in range(length + i % 3)], LABELS) for i in range(n)]


def assert_masses_match(got, want) -> None:
    """Each group's masses as `want`'s: within 1e-6 (the batch-invariance bound in float32) and, as a random model's
    masses are tiny (a two-token label's ~1e-11, where 1e-6 would hold for any answer), within 1e-4 of their size."""
    pairs = [(a, b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True)]
    assert max(abs(a - b) for a, b in pairs) < 1e-6
    assert max(abs(a - b) / abs(b) for a, b in pairs) < 1e-4


def test_bucket_pads_at_most_a_quarter():
    assert bucket(0) == 0 and bucket(1) == 16 and bucket(16) == 16
    for n in range(17, 5000):
        assert n <= bucket(n) <= 1.25 * n, n
    assert bucket(1266) == 1280 and bucket(31) == 32
    # a forward of several long documents: a fixed step of rows, so little padding
    assert all(n <= bucket(n) < n + FINE_STEP for n in range(FINE_FROM + 1, 70_000, 37))
    assert bucket(10 * 1266) == 12_800  # a quarter of the power of two would give 14,336


def test_shapes_are_shared_by_similar_requests():
    a = Shape.of(1200, pack(1300, items(30, 20)))
    b = Shape.of(1250, pack(1350, items(31, 20)))
    assert a == b


@pytest.mark.parametrize("documents", [1, 2, 4, 8])
def test_every_input_field_keeps_one_alignment_whatever_the_shape(documents):
    # Triton compiles a kernel once per alignment of its pointers: a field a kernel reads must not start at an odd
    # int64 in one shape and an even one in another (with 2 documents the fields before the block table change parity)
    shape = dataclasses.replace(Shape.of(20, pack(40, items(12, 9))), documents=documents)
    slot = Slot(shape, torch.device("cpu"), block_tokens=16)
    assert all(lo % 2 == 0 for lo, _ in slot.views.values()), slot.views
    assert all(slot.field(name).data_ptr() % 16 == 0 for name in slot.views)


def test_a_reused_slot_holds_only_the_latest_request():
    big, small = pack(40, items(12, 9)), pack(30, items(9, 8))
    shape = Shape.of(20, big)  # the small request fits it in every dimension
    reused, fresh = Slot(shape, torch.device("cpu")), Slot(shape, torch.device("cpu"))
    reused.fill([Document(list(range(20)), 20, big.n_rows)], big, [0])
    reused.fill([Document(list(range(18)), 12, small.n_rows)], small, [0])
    fresh.fill([Document(list(range(18)), 12, small.n_rows)], small, [0])
    assert (reused.host == fresh.host).all() and torch.equal(reused.arena, fresh.arena)
    # padding segment slots see only themselves; real ones see their item's rows
    bits = fresh.host_field("own_mask").view(np.uint8)
    own_mask = np.unpackbits(bits, bitorder="little").reshape(shape.segments, shape.width, shape.width)
    assert (own_mask[len(small.segments) :] == np.eye(shape.width)).all()
    blocks = small.segment_visibility()  # [G, S, S]
    g, s = blocks.shape[:2]
    assert (own_mask[:g, :s, :s] == blocks).all() and not own_mask[:g, :s, s:].any()


@pytest.mark.parametrize("causal", [False, True])
def test_ranges_attention_equals_the_masked_computation(causal):
    torch.manual_seed(0)
    q = torch.randn(12, 4, 16)  # [L, H, D], the first 9 real
    k, v = torch.randn(40, 2, 16), torch.randn(40, 2, 16)  # [C, Hkv, D], the first 30 used
    cu_q, cu_k = torch.tensor([0, 9], dtype=torch.int32), torch.tensor([0, 30], dtype=torch.int32)
    out, lse = attend_ranges(q, k, v, cu_q, cu_k, 0.25, causal=causal)
    mask = torch.ones(9, 30, dtype=torch.bool)
    if causal:
        mask = torch.arange(30)[None] <= torch.arange(9)[:, None] + 21
    kk, vv = (x[:30].repeat_interleave(2, dim=1).transpose(0, 1)[None] for x in (k, v))  # [1, H, 30, D]
    want, want_lse = attend_with_lse(q[:9].transpose(0, 1)[None], kk, vv, 0.25, mask=mask[None, None])
    assert torch.allclose(out[:9], want[0].transpose(0, 1), atol=1e-6)
    assert torch.allclose(lse[:9], want_lse[0].T, atol=1e-6)


@pytest.mark.parametrize("family, kernel", FAMILIES_AND_KERNEL)
def test_static_run_equals_the_dynamic_run(family, kernel, tokenizer):
    model = tiny_model(family, len(tokenizer), seed=3)
    dynamic, static = Engine(model), Engine(model, EngineOptions(cuda_graphs=True, attention_kernel=kernel))
    assert static.features.static and not dynamic.features.static
    assert static.stats() == dynamic.stats() == {}  # nothing captured on a CPU: no graph counters
    system = dynamic.snapshot(*dynamic.prefill([11, 23, 45, 67, 89]))
    requests = [
        ([100 + i for i in range(40)], items(3, 6), system),
        ([200 + i for i in range(37)], items(5, 4), system),  # the same buckets: the slot is reused
        ([], items(2, 5), system),  # nothing new after the base
        ([300 + i for i in range(90)], items(9, 12), None),  # no base at all
        ([400 + i for i in range(20)], items(1, 3), system),  # the base must be copied in again
        ([600 + i for i in range(33)], items(3, 6), system),  # the first request's layout: its static inputs kept
    ]
    for ids, packed, base in requests:
        want, want_prefix = dynamic.run(ids, packed, base)
        got, prefix = static.run(ids, packed, base)
        assert prefix.length == want_prefix.length == (base.length if base else 0) + len(ids)
        for (k, v), (wk, wv) in zip(prefix.layers, want_prefix.layers, strict=True):
            assert torch.allclose(k, wk, atol=1e-5) and torch.allclose(v, wv, atol=1e-5)
        assert_masses_match(got, want)
    # a later request over a prefix the static path built itself (a prefix-cache hit)
    ids, packed = [500 + i for i in range(10)], items(4, 5)
    assert_masses_match(static.run(ids, packed, prefix)[0], dynamic.run(ids, packed, prefix)[0])


@pytest.mark.parametrize(
    "family, kernel",
    [
        ("qwen3", False),
        ("llama", False),
        ("gemma3", False),
        pytest.param("qwen3", True, marks=[needs_triton, on_cpu]),
        pytest.param("llama", True, marks=[needs_triton, on_cpu]),
    ],
)
def test_documents_in_one_static_forward_equal_each_alone(family, kernel, tokenizer):
    """Batch invariance: several documents (new, cached, empty, without a base) and their questions in ONE static
    forward answer as each does alone, within 1e-6 in float32, and build the same prefixes; with the attention as
    torch's kernels or as the one Triton kernel."""
    model = tiny_model(family, len(tokenizer), seed=5)
    dynamic, static = Engine(model), Engine(model, EngineOptions(cuda_graphs=True, attention_kernel=kernel))
    assert not kernel or static.forward.runner.attention_kernel
    system = dynamic.snapshot(*dynamic.prefill([11, 23, 45, 67, 89]))
    built = static.run([700 + i for i in range(25)], items(2, 4), system)[1]  # a prefix built by a static forward
    documents = [
        ([100 + i for i in range(40)], items(3, 6), system),
        ([200 + i for i in range(17)], items(5, 4), built),  # a cached document, copied in as one tensor
        ([], items(2, 5), system),  # nothing new after the base
        ([300 + i for i in range(30)], items(4, 7), None),  # no base at all
        ([400 + i for i in range(9)], items(1, 3), system),
    ]
    for batch in (documents, documents[1:], documents[::-1], documents[:1]):
        together = static.run_many(batch, keep_prefix=True)
        for (ids, packed, base), (masses, prefix) in zip(batch, together, strict=True):
            alone, alone_prefix = dynamic.run(ids, packed, base)
            assert_masses_match(masses, alone)
            assert prefix.length == alone_prefix.length
            for (k, v), (wk, wv) in zip(prefix.layers, alone_prefix.layers, strict=True):
                assert torch.allclose(k, wk, atol=1e-5) and torch.allclose(v, wv, atol=1e-5)


@pytest.mark.parametrize("family, kernel", FAMILIES_AND_KERNEL)
def test_the_last_layer_finishes_only_the_read_rows(family, kernel, tokenizer):
    """With the layers' fused forwards (here the plain-torch reference operations, which run on a CPU), the static
    forward's last layer runs its MLP on the read rows only, and the answers and prefixes stay the dynamic run's."""
    model = tiny_model(family, len(tokenizer), seed=7)
    report = fuse(model, reference_ops())
    assert report.residual_norms == len(model.model.layers)
    dynamic, static = Engine(model), Engine(model, EngineOptions(cuda_graphs=True, attention_kernel=kernel))
    assert static.forward.runner.attention_kernel == kernel
    mlp_rows: list[int] = []
    hook = model.model.layers[-1].mlp.register_forward_hook(lambda _m, args, _o: mlp_rows.append(args[0].shape[1]))
    system = dynamic.snapshot(*dynamic.prefill([11, 23, 45, 67, 89]))
    ids, packed = [100 + i for i in range(40)], items(3, 6)
    want, want_prefix = dynamic.run(ids, packed, system)
    mlp_rows.clear()
    got, prefix = static.run(ids, packed, system)
    hook.remove()
    batch = pack(system.length + len(ids), packed)
    assert mlp_rows == [bucket(len(batch.read_rows))] and bucket(len(batch.read_rows)) < len(ids) + batch.n_rows
    assert_masses_match(got, want)
    for (k, v), (wk, wv) in zip(prefix.layers, want_prefix.layers, strict=True):
        assert torch.allclose(k, wk, atol=1e-5) and torch.allclose(v, wv, atol=1e-5)
    # several documents in one forward: each document's read rows, in order
    documents = [(ids, packed, system), ([200 + i for i in range(17)], items(5, 4), None), ([], items(2, 5), system)]
    for (ids, packed, base), (masses, _) in zip(documents, static.run_many(documents, False), strict=True):
        alone, _ = dynamic.run(ids, packed, base)
        assert_masses_match(masses, alone)


def test_read_rows_as_many_as_the_forwards_rows_are_still_read_right(tokenizer):
    """A cached document (no new rows) and a question whose label tree is nearly all its rows: the read rows fill
    the forward's bucket of rows. The last layer then has nothing to leave out, and the runner must not take the
    read rows a second time from rows already taken."""
    model = tiny_model("qwen3", len(tokenizer), seed=7)
    fuse(model, reference_ops())
    dynamic, static = Engine(model), Engine(model, EngineOptions(cuda_graphs=True))
    system = dynamic.snapshot(*dynamic.prefill([11, 23, 45, 67, 89]))
    labels = LabelSet.build([[(100 + i, 200 + i)] for i in range(30)])  # 30 options of two tokens: 30 inner nodes
    packed = [PackedItem([300, 301], labels)]
    batch = pack(system.length, packed)
    assert bucket(len(batch.read_rows)) == bucket(batch.n_rows)  # 31 reads of 32 rows: one bucket
    want, _ = dynamic.run([], packed, system)
    got, _ = static.run([], packed, system)
    assert_masses_match(got, want)
