"""The fake language model (`typedlm.runtime.fake`) behind a real decider: its answers are the module's rule,
computed here again by brute force from each question's whole token sequence; a document repeating the "yes" label's
token leans yes; answers do not depend on the other questions or their order, nor on the prefix cache; the server's
app answers with them."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from fastapi.testclient import TestClient

from typedlm.core.errors import LimitExceeded
from typedlm.core.questions import ChoiceQuestion, NoulQuestion, ScoreQuestion, parse_questions
from typedlm.runtime.fake import FakeEngine, FakeLM, FakePrefix
from typedlm.runtime.models import model_fingerprint
from typedlm.runtime.packing import PackedItem
from typedlm.server import ServerSettings, create_app
from typedlm.text.labels import LabelSet

from ..conftest import decider_on_fake

STATE = "The parcel arrived broken. Yes, I want my money back, and yes, today."
QUESTIONS = {
    "refund": NoulQuestion("Does the customer want a refund?"),
    "topic": ChoiceQuestion(tuple((f"topic {i}", None) for i in range(30)), "Which topic?"),  # two-letter labels
    "urgency": ScoreQuestion(("low", "medium", "high"), "How urgent?"),
}


def by_hand(context: list[int], vocab_size: int, labels: LabelSet) -> list[float]:
    """Each answer group's mass after `context`: p(v) = e^(c_v) / (V - n + Σ_u e^(c_u)) over the context's counts,
    counted again for every token read; a form's tokens multiplied, a group's forms added."""

    def p(ids: list[int], v: int) -> float:
        counts = Counter(ids)
        return math.exp(counts[v]) / (vocab_size - len(counts) + sum(math.exp(c) for c in counts.values()))

    return [
        sum(math.prod(p(context + list(form[:s]), token) for s, token in enumerate(form)) for form in forms)
        for forms in labels.groups
    ]


def hand_masses(decider, state, questions: dict) -> dict[str, list[float]]:
    """Every question's masses by hand, from its whole sequence as the decider lays it out (one read each)."""
    prompt = decider.layout.tokenize(state, list(questions.values()))
    vocab_size = decider.engine.model.config.vocab_size
    return {
        qid: by_hand(prompt.prefix_ids + suffix, vocab_size, decider.labeler.for_question(question))
        for (qid, question), suffix in zip(questions.items(), prompt.suffix_ids, strict=True)
    }


def test_masses_are_the_rule_computed_by_hand_from_the_whole_sequence(fake_lm_decider):
    assert fake_lm_decider.labeler.for_question(QUESTIONS["topic"]).inner_nodes, "some labels take two tokens"
    reading = fake_lm_decider.read(STATE, QUESTIONS)
    expected = hand_masses(fake_lm_decider, STATE, QUESTIONS)
    for qid, masses in expected.items():
        (read,) = reading.reads[qid].masses
        assert read == pytest.approx(masses, rel=1e-12, abs=0), qid
    answer = fake_lm_decider.decide(STATE, QUESTIONS).answers["refund"]  # raw calibration: the masses normalised
    yes, no = expected["refund"]
    assert answer.p_yes == pytest.approx(yes / (yes + no), rel=1e-12)


def test_the_rule_on_a_five_token_vocabulary_by_hand():
    """Prefix 1 1 2, suffix 3; answer 0 is "1" or "4 4", answer 1 is "2". After 1 1 2 3: counts {1: 2, 2: 1, 3: 1},
    4 unseen, Z = 1 + 1 (ids 0 and 4) + e² + e + e; after 1 1 2 3 4: Z' = 1 + e² + 3e and p(4) = e / Z'."""
    e = math.e
    z, z_after_4 = 2 + e**2 + 2 * e, 1 + e**2 + 3 * e
    item = PackedItem([3], LabelSet.build([[(1,), (4, 4)], [(2,)]]))
    (masses,), prefix = FakeEngine(FakeLM(5)).run([1, 1, 2], [item])
    assert masses == pytest.approx([e**2 / z + (1 / z) * (e / z_after_4), e / z], rel=1e-15)
    assert prefix == FakePrefix((1, 1, 2))


def test_a_document_repeating_the_yes_labels_token_leans_yes(fake_lm_decider):
    (yes_token,) = fake_lm_decider.labeler.encode("yes")
    (no_token,) = fake_lm_decider.labeler.encode("no")
    question = {"q": NoulQuestion("Is it so?")}
    leaning = {}
    for word, token in (("yes", yes_token), ("no", no_token)):
        state = "\n".join([word] * 6)
        prompt = fake_lm_decider.layout.tokenize(state, list(question.values()))
        assert prompt.prefix_ids.count(token) >= 6, "the document holds the label's own token"
        leaning[word] = fake_lm_decider.decide(state, question).answers["q"].p_yes
    assert leaning["yes"] > 0.5 > leaning["no"]


def test_answers_do_not_depend_on_the_other_questions_or_their_order(fake_lm_decider):
    def answers(qids):
        response = fake_lm_decider.decide(STATE, {qid: QUESTIONS[qid] for qid in qids})
        return response.to_wire()["answers"]

    whole = answers(["refund", "topic", "urgency"])
    for qids in (["urgency", "topic", "refund"], ["topic", "refund"], ["urgency"], ["refund"]):
        assert answers(qids) == {qid: whole[qid] for qid in qids}, qids  # bit for bit


def test_the_prefix_cache_gives_the_same_answers_bit_for_bit(tokenizer):
    cached = decider_on_fake(tokenizer)
    first = cached.decide(STATE, QUESTIONS)
    again = cached.decide(STATE, QUESTIONS)
    assert cached.stats()["prefix_cache"]["hits"] == 1
    assert again.usage.cached_tokens > first.usage.cached_tokens
    uncached = decider_on_fake(tokenizer, prefix_cache_bytes=0).decide(STATE, QUESTIONS)
    assert first.to_wire()["answers"] == again.to_wire()["answers"] == uncached.to_wire()["answers"]


def test_the_servers_app_answers_with_the_rules_probability(tokenizer):
    decider = decider_on_fake(tokenizer)
    body = {
        "state": STATE,
        "questions": {"refund": {"type": "noul", "instructions": "Does the customer want a refund?"}},
    }
    yes, no = hand_masses(decider, STATE, parse_questions(body["questions"]))["refund"]
    with TestClient(create_app(decider, ServerSettings())) as client:
        resp = client.post("/v1/systemone", json=body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()["answers"]["refund"]
    assert answer["noul"] == pytest.approx(yes / (yes + no), rel=1e-12)
    assert answer["x_raw_mass"] == pytest.approx(yes + no, rel=1e-12)
    assert resp.json()["model"] == decider.name


def test_the_fake_is_described_fingerprinted_and_limited_by_its_settings(tokenizer):
    decider = decider_on_fake(tokenizer, max_positions=64)
    assert decider.describe().context == 64 and decider.describe().device == "cpu"
    assert decider.max_batch == 1, "one document per forward"
    with pytest.raises(LimitExceeded, match="at most 64"):
        decider.decide("word " * 100, {"q": NoulQuestion("Long?")})
    fingerprints = {model_fingerprint(FakeLM(v, p)) for v, p in ((100, 64), (101, 64), (100, 65))}
    assert len(fingerprints) == 3 and model_fingerprint(FakeLM(100, 64)) in fingerprints


def test_a_prefix_is_its_token_ids_and_the_engine_extends_it():
    engine = FakeEngine(FakeLM(50))
    cache, length = engine.prefill([1, 2, 3])
    prefix = engine.snapshot(cache, length)
    assert prefix == FakePrefix((1, 2, 3)) and prefix.truncated(2) == FakePrefix((1, 2))
    assert prefix.compact() is prefix and prefix.nbytes == prefix.held_bytes() > 0
    extended, length = engine.prefill([4], base=prefix)
    assert extended.ids == (1, 2, 3, 4) and length == 4
    in_flight = engine.launch_many([([4], [], prefix), ([], [], None)], keep_prefix=False)
    assert in_flight.prefixes == [None, None] and in_flight.wait() == [[], []]
