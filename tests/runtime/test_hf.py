"""The adapter over transformers' internals: config fields with their fallbacks, the cache, the cascade's
registration, the rotary function."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from typedlm.runtime import hf

from ..conftest import tiny_config, tiny_model


def test_model_shape_reads_the_config_and_its_fallbacks(tokenizer):
    shape = hf.ModelShape.of(tiny_model("gemma3", len(tokenizer)))
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.layers) == (4, 2, 16, 2)
    assert shape.layer_types == ("sliding_attention", "full_attention") and shape.sliding_window == 24
    assert shape.has_sliding_layers and shape.no_masks() == {"sliding_attention": None, "full_attention": None}
    assert shape.max_positions == 4096

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=None)  # fmt: skip
    config.head_dim = None
    bare = torch.nn.Module()
    bare.config = config
    shape = hf.ModelShape.of(bare)
    assert shape.kv_heads == 4 and shape.head_dim == 16, "no kv heads: one per query head; no head size: D / H"


def test_use_cascade_switches_sdpa_models_only(tokenizer):
    model = tiny_model("qwen3", len(tokenizer))
    assert hf.use_cascade(model) and hf.attention_implementation(model) == hf.CASCADE
    assert hf.use_cascade(model), "a model already switched stays switched"
    eager = tiny_model("llama", len(tokenizer))
    eager.set_attn_implementation("eager")
    assert not hf.use_cascade(eager) and hf.takes_additive_masks(eager)


def test_a_cache_is_built_read_and_rewound_as_plain_tensors(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    body, head = hf.decoder_and_head(model)
    assert head is model.get_output_embeddings()
    cache = hf.new_cache()
    ids = torch.tensor([[5, 6, 7, 8]])
    hidden = hf.run_body(body, ids, torch.arange(4)[None], cache)
    assert hidden.shape == (1, 4, tiny_config("llama", len(tokenizer)).hidden_size)
    assert hf.cache_length(cache) == 4
    layers = hf.cache_layers(cache, 3)
    assert len(layers) == 2 and layers[0][0].shape[-2] == 3
    again = hf.new_cache(layers)
    assert hf.cache_length(again) == 3 and torch.equal(again.layers[1].values, layers[1][1])
    assert hf.rewind(cache, 2) == 2


def test_the_rotary_function_is_found_and_replaced(tokenizer):
    model = tiny_model("qwen3", len(tokenizer))
    original = hf.rotary_function(model)
    assert callable(original)

    def wrapped(*args, **kwargs):
        return original(*args, **kwargs)

    hf.set_rotary_function(model, wrapped)
    try:
        assert hf.rotary_function(model) is wrapped
    finally:
        hf.set_rotary_function(model, original)
