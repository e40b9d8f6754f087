"""The engine's features: each read's hidden state at its decision row, from the forward that reads its masses, on
every forward strategy; checked against a plain full forward of the model (no cache, no packing, no cascade)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from typedlm.core.options import EngineOptions
from typedlm.runtime.engine import Engine
from typedlm.runtime.packing import PackedItem
from typedlm.text.labels import LabelSet

from ..conftest import tiny_model

ONE_TOKEN = LabelSet.build([[(5,)], [(9,)], [(10,), (11,)]])  # every label one token: read at the root alone
TREE = LabelSet.build([[(5, 7)], [(5, 8)], [(9,)]])  # labels sharing a first token: a tree, two read rows
STRATEGIES = [
    ("qwen3", EngineOptions()),  # one eager forward
    ("gemma3", EngineOptions()),  # sliding windows: two forwards
    ("llama", EngineOptions(cascade=False)),  # two forwards with masks
    ("qwen3", EngineOptions(cuda_graphs=True)),  # the static forward (CUDA graphs on a GPU, eager on a CPU)
    ("llama", EngineOptions(cuda_graphs=True)),
]


def _documents(engine: Engine):
    base = engine.snapshot(*engine.prefill([11, 23, 45]))
    first = [PackedItem([400, 401, 402], ONE_TOKEN), PackedItem([500, 501], TREE), PackedItem([600], ONE_TOKEN)]
    second = [PackedItem([700, 701], TREE), PackedItem([800, 801, 802, 803], ONE_TOKEN)]
    return [([67, 89, 101], first, base), ([33, 34], second, None)], [[11, 23, 45, 67, 89, 101], [33, 34]]


def _reference(model: torch.nn.Module, context: list[int], item: PackedItem) -> torch.Tensor:
    """The last hidden state (after the final norm) at the item's last suffix token, from one full forward."""
    ids = torch.tensor([[*context, *item.suffix_ids]])
    with torch.no_grad():
        return model.model(input_ids=ids).last_hidden_state[0, -1]


@pytest.mark.parametrize(("family", "options"), STRATEGIES)
def test_features_are_what_the_head_reads_at_each_decision_row(tokenizer, family, options):
    model = tiny_model(family, len(tokenizer), seed=3)
    engine = Engine(model, options)
    documents, contexts = _documents(engine)
    plain = engine.launch_many(documents, keep_prefix=False)
    assert plain.features is None  # nothing kept unless asked
    want_masses = plain.wait()
    launched = engine.launch_many(documents, keep_prefix=False, features=True)
    masses, features = launched.wait(), launched.features()
    assert masses == want_masses  # asking for features changes no answer, bit for bit
    for (_, items, _), context, rows, item_masses in zip(documents, contexts, features, masses, strict=True):
        assert rows.shape == (len(items), model.config.hidden_size) and rows.dtype == np.float32
        for item, row, groups in zip(items, rows, item_masses, strict=True):
            reference = _reference(model, context, item)
            assert torch.allclose(torch.from_numpy(row), reference, atol=2e-5, rtol=1e-4)
            if item.labels is ONE_TOKEN:  # every group's mass is the head's output at this row
                logprobs = engine.head.logprobs(torch.from_numpy(row)[None])[0]
                want = [sum(float(logprobs[form[0]].exp()) for form in group) for group in ONE_TOKEN.groups]
                assert np.allclose(groups, want, rtol=1e-5, atol=0)
