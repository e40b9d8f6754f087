"""Exactness of the packed one-pass readout against independent full forwards, on three families."""

from __future__ import annotations

import pytest
import torch

from typedlm.core.confidence import normalise
from typedlm.core.options import EngineOptions
from typedlm.core.questions import ChoiceQuestion, NoulQuestion, ScoreQuestion
from typedlm.ops import attention
from typedlm.runtime.engine import Engine
from typedlm.runtime.packing import PackedItem
from typedlm.text.labels import LabelSet

from ..conftest import reference_masses, tiny_model

STATE = {"ticket": "I was charged twice for my subscription this month.", "customer": {"plan": "pro", "years": 3}}
QUESTIONS = {
    "billing": NoulQuestion("Is this about billing?", true="money or charges", false="anything else"),
    "bare": NoulQuestion(),
    "tone": ChoiceQuestion((("angry", "upset or hostile"), ("calm", None), ("excited", {"signs": ["!", "wow"]}))),
    "many": ChoiceQuestion(tuple((f"option {i}", f"description {i}") for i in range(255))),
    "urgency": ScoreQuestion(("can wait", "this week", "today", ["now", "immediately"]), "How urgent is it?"),
    "ten": ScoreQuestion(tuple(f"level {i}" for i in range(10))),
}


def test_many_options_use_multi_token_labels(tiny_decider):
    labels = tiny_decider.labeler.for_question(QUESTIONS["many"])
    assert labels.max_depth >= 2 and labels.inner_nodes, "255 options should exercise the label tree"


def test_packed_readout_equals_full_forward_per_question(tiny_decider):
    _assert_equals_full_forwards(tiny_decider, QUESTIONS)


def test_a_long_question_alone_attends_its_suffix_causally_and_equals_full_forwards(tiny_decider, monkeypatch):
    # alone, the 255 options' suffix is the chain of its group: attended causally, the label tree through the mask
    # (the same with many long questions, one group of segments)
    seen = []
    own_attention = attention._own_attention
    monkeypatch.setattr(attention, "_own_attention", lambda *a: seen.append(a[3].chain) or own_attention(*a))
    many = QUESTIONS["many"]
    _assert_equals_full_forwards(tiny_decider, {"many": many})
    _assert_equals_full_forwards(tiny_decider, {"many": many, "again": ChoiceQuestion(many.options, "Which one?")})
    assert seen and min(seen) >= attention.CHAIN_SPLIT_ROWS


def _assert_equals_full_forwards(decider, questions):
    response = decider.decide(STATE, questions)
    prefix_text = decider.layout.prefix_text(STATE)
    for qid, question in questions.items():
        whole = decider.layout.encode(prefix_text + decider.layout.suffix_text(question))
        masses = reference_masses(decider.engine.model, whole, decider.labeler.for_question(question))
        probs, raw_mass = normalise(masses)
        answer = response.answers[qid]
        got = [answer.p_yes] if isinstance(question, NoulQuestion) else list(answer.probabilities)
        if isinstance(question, ChoiceQuestion):
            got = list(answer.probabilities.values())
        want = probs[:1] if isinstance(question, NoulQuestion) else probs
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5, qid
        assert abs(answer.raw_mass - raw_mass) < 1e-5, qid


def _probabilities(answer) -> list[float]:
    if hasattr(answer, "p_yes"):
        return [answer.p_yes, answer.raw_mass]
    values = answer.probabilities.values() if isinstance(answer.probabilities, dict) else answer.probabilities
    return [*values, answer.raw_mass]


def _assert_same(a, b, tol=1e-6):
    assert max(abs(x - y) for x, y in zip(_probabilities(a), _probabilities(b), strict=True)) <= tol


def test_answers_are_independent_of_other_questions(tiny_decider):
    small = {k: QUESTIONS[k] for k in ("billing", "tone", "urgency", "bare")}
    base = tiny_decider.decide(STATE, small).answers
    variants = [
        {k: small[k] for k in reversed(small)},  # reordered
        {"billing": small["billing"], "urgency": small["urgency"]},  # removed
        {**small, "extra": ChoiceQuestion((("a", "first"), ("b", "second")), "Another question entirely?")},  # added
    ]
    for variant in variants:
        answers = tiny_decider.decide(STATE, variant).answers
        for qid in variant:
            if qid in base:
                _assert_same(base[qid], answers[qid])
    renamed = tiny_decider.decide(STATE, {f"renamed-{k}": q for k, q in small.items()}).answers
    for qid in small:
        _assert_same(base[qid], renamed[f"renamed-{qid}"])


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_tree_readout_equals_sequential_scoring(family, tokenizer):
    """Arbitrary multi-token, shared-prefix labels: each complete label scored token by token, one forward each."""
    model = tiny_model(family, len(tokenizer), seed=1)
    engine = Engine(model)
    vocab = len(tokenizer)
    labels = LabelSet.build([[(5, 7, 9), (5, 8)], [(5, 7, 10), (300,)], [(6,), (4000, 17, 17, 3)]])
    prefix = [11, 23, 45, 67, 89, 101, 300, 301, 302, 303]
    suffixes = [[400, 401, 402], [500, 501], [vocab - 1, 7, 8, 9, 10]]
    cache, prefix_len = engine.prefill(prefix[4:], engine.snapshot(*engine.prefill(prefix[:4])))
    got = engine.score_suffixes(cache, prefix_len, [PackedItem(s, labels) for s in suffixes])
    with torch.inference_mode():
        for suffix, masses in zip(suffixes, got, strict=True):
            want = []
            for forms in labels.groups:
                total = 0.0
                for form in forms:
                    logp = 0.0
                    for k, token in enumerate(form):
                        logits = model(torch.tensor([prefix + suffix + list(form[:k])])).logits[0, -1]
                        logp += float(torch.log_softmax(logits.double(), -1)[token])
                    total += torch.exp(torch.tensor(logp)).item()
                want.append(total)
            assert max(abs(a - b) / b for a, b in zip(masses, want, strict=True)) < 1e-4
            assert max(abs(a - b) for a, b in zip(masses, want, strict=True)) < 1e-6


def test_score_rejects_a_cache_of_the_wrong_length(tokenizer):
    engine = Engine(tiny_model("llama", len(tokenizer)))
    cache, length = engine.prefill([1, 2, 3])
    with pytest.raises(AssertionError):
        engine.score_suffixes(cache, length + 1, [PackedItem([4], LabelSet.build([[(5,)], [(6,)]]))])


def test_a_bfloat16_head_is_applied_in_float32(tokenizer):
    model = tiny_model("qwen3", len(tokenizer)).to(torch.bfloat16)
    engine = Engine(model)
    hidden = torch.randn(3, 64)
    weight = model.get_output_embeddings().weight
    want = torch.log_softmax(hidden @ weight.float().T, dim=-1)  # every vocabulary chunk included
    assert torch.allclose(engine.head.logprobs(hidden), want, atol=1e-5)


def test_one_forward_run_equals_prefill_then_score(tokenizer):
    model = tiny_model("llama", len(tokenizer), seed=2)
    fused = Engine(model)
    assert fused.features.one_forward, "a model without sliding windows runs document and questions in one forward"
    two_step = Engine(model, EngineOptions(cascade=False))
    assert not two_step.features.one_forward
    labels = LabelSet.build([[(5, 7)], [(5, 8)], [(9,)]])
    items = [PackedItem([400, 401, 402], labels), PackedItem([500, 501], labels)]
    base = fused.snapshot(*fused.prefill([11, 23, 45]))
    got, prefix = fused.run([67, 89, 101, 300], items, base)
    assert prefix.length == 7 and all(k.shape[-2] == 7 for k, _ in prefix.layers)
    want = two_step.score_suffixes(*two_step.prefill([67, 89, 101, 300], base), items)
    assert max(abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True)) < 1e-7
    assert not Engine(tiny_model("gemma3", len(tokenizer))).features.one_forward  # sliding windows: two forwards
