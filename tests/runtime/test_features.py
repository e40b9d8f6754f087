"""The feature switches resolved once at load: what each option means for a model on this machine (CPU here)."""

from __future__ import annotations

import pytest
import torch

from typedlm.core.options import EngineOptions
from typedlm.runtime.engine import Engine
from typedlm.runtime.forwards import OneForward, StaticForward, TwoForwards

from ..conftest import needs_triton, tiny_model


@pytest.fixture()
def model(tokenizer):
    return tiny_model("qwen3", len(tokenizer))


def test_defaults_on_a_cpu_run_one_eager_forward_with_the_cascade(model):
    engine = Engine(model)
    features = engine.features
    assert features.cascade and features.one_forward
    assert not features.static and not features.capture and not features.attention_kernel
    assert features.fusion is None, "fused kernels are for CUDA"
    assert isinstance(engine.forward, OneForward)
    assert features.summary() == [
        "attention: the cascade with torch's kernels",
        "a document and its questions in one forward",
    ]


def test_cuda_graphs_on_a_cpu_run_the_static_forward_eagerly(model):
    engine = Engine(model, EngineOptions(cuda_graphs=True, attention_kernel=False))
    assert engine.features.static and not engine.features.capture
    assert isinstance(engine.forward, StaticForward) and not engine.forward.runner.capture
    assert engine.features.summary()[-1] == "a document and its questions in one forward, static shapes"


@needs_triton
def test_the_attention_kernel_is_taken_as_asked_on_the_static_forward(model):
    engine = Engine(model, EngineOptions(cuda_graphs=True, attention_kernel=True))
    assert engine.features.attention_kernel and engine.forward.runner.attention_kernel
    assert "attention: the cascade as one Triton kernel per layer" in engine.features.summary()


def test_the_attention_kernel_needs_the_static_forward(model):
    assert not Engine(model, EngineOptions(attention_kernel=True)).features.attention_kernel


def test_without_the_cascade_every_layer_takes_one_masked_attention_in_two_forwards(model):
    engine = Engine(model, EngineOptions(cascade=False, cuda_graphs=True))
    assert not engine.features.cascade and not engine.features.one_forward and not engine.features.static
    assert isinstance(engine.forward, TwoForwards)
    assert engine.features.summary()[0] == "attention: one masked attention per layer"


def test_sliding_windows_take_two_forwards_even_with_graphs_asked_for(tokenizer):
    engine = Engine(tiny_model("gemma3", len(tokenizer)), EngineOptions(cuda_graphs=True))
    assert engine.features.cascade and not engine.features.one_forward and not engine.features.static
    assert isinstance(engine.forward, TwoForwards)
    assert engine.features.summary()[-1] == "a document, then its questions: two forwards (sliding windows)"


def test_a_model_without_sdpa_keeps_its_attention(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    model.set_attn_implementation("eager")
    engine = Engine(model)
    assert not engine.features.cascade and isinstance(engine.forward, TwoForwards)


def test_every_strategy_reads_the_same_masses(tokenizer):
    from typedlm.runtime.packing import PackedItem
    from typedlm.text.labels import LabelSet

    labels = LabelSet.build([[(5,)], [(6,), (7, 8)]])
    items = [PackedItem([11, 12, 13], labels), PackedItem([14], labels)]
    masses = {}
    for name, options in {
        "one": EngineOptions(),
        "static": EngineOptions(cuda_graphs=True, attention_kernel=False),
        "two": EngineOptions(cascade=False),
    }.items():
        engine = Engine(tiny_model("llama", len(tokenizer)), options)
        base = engine.snapshot(*engine.prefill([1, 2, 3]))
        masses[name], prefix = engine.run([4, 5, 6, 7], items, base)
        assert prefix.length == 7
    for name in ("static", "two"):
        for got, want in zip(masses[name], masses["one"], strict=True):
            assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-7), name
