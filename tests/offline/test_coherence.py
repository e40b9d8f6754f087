"""Derived coherence questions and their scores (no model: P(yes) given by hand)."""

from __future__ import annotations

import pytest

from typedlm.core.questions import parse_questions
from typedlm.offline.coherence import ALWAYS_TRUE, baseline, coherence, derive, negations
from typedlm.offline.evaldata import Example, validate

REVIEW = Example(
    "r1",
    "test",
    "Loved it.",
    {"positive": {"type": "noul", "instructions": "Is it positive?", "criteria": {"true": "liked", "false": "not"}}},
    {"positive": True},
)
TOPIC = Example(
    "t1",
    "test",
    "Stocks fell.",
    {
        "topic": {"type": "choice", "instructions": "Which topic?", "criteria": {"business": "money", "sport": ""}},
        "level": {"type": "score", "criteria": ["low", "high"]},
    },
    {"topic": "business", "level": 1},
)


def test_derive_builds_valid_labeled_yes_no_questions():
    derived = derive([REVIEW, TOPIC, Example("s", "test", "x", {"level": {"type": "score"}}, {"level": 0})])
    assert [e.id for e in derived] == ["r1.coherence", "t1.coherence"]  # a score-only example has nothing to derive
    for example in derived:
        validate(example)
        assert all(q.kind == "noul" for q in parse_questions(example.questions).values())
    review, topic = derived
    assert review.gold == {"positive": True, "positive.not": False, "positive.and_true": True}
    negated = review.questions["positive.not"]
    assert negated["criteria"] == {"true": "not", "false": "liked"}  # swapped
    assert ALWAYS_TRUE in review.questions["positive.and_true"]["instructions"]
    assert topic.gold == {"topic.is.business": True, "topic.is.sport": False}
    assert "money" in topic.questions["topic.is.business"]["instructions"]


def test_negations_keep_only_yes_no_questions_and_their_negations():
    derived = negations([REVIEW, TOPIC])
    assert [e.id for e in derived] == ["r1.coherence"]  # a choice question is no negation pair: nothing derived
    (review,) = derived
    validate(review)
    assert review.gold == {"positive": True, "positive.not": False}
    assert review.questions["positive.not"] == derive([REVIEW])[0].questions["positive.not"]


def test_scores_of_coherent_and_incoherent_answers():
    coherent = {
        ("r", "q"): 0.7,
        ("r", "q.not"): 0.3,
        ("r", "q.and_true"): 0.6,
        ("t", "c.is.a"): 0.5,
        ("t", "c.is.b"): 0.25,
        ("t", "c.is.c"): 0.25,
    }
    scores = coherence(coherent)
    assert {k: v["mean_gap"] for k, v in scores.items()} == pytest.approx(
        {"negation": 0.0, "partition": 0.0, "conjunction": 0.0}
    )
    incoherent = {**coherent, ("r", "q.not"): 0.6, ("r", "q.and_true"): 0.9, ("t", "c.is.c"): 0.75}
    scores = coherence(incoherent)
    assert scores["negation"]["mean_gap"] == pytest.approx(0.3)
    assert scores["conjunction"]["mean_gap"] == pytest.approx(0.2)
    assert scores["partition"]["mean_gap"] == pytest.approx(0.5)
    assert all(v["violations"] == 1.0 for v in scores.values())


def test_half_everywhere_baseline_misses_partitions_by_half_their_size_minus_one():
    keys = [("t", f"c.is.{i}") for i in range(5)] + [("r", "q"), ("r", "q.not")]
    scores = baseline(keys)
    assert scores["partition"]["mean_gap"] == pytest.approx(1.5)
    assert scores["negation"]["mean_gap"] == 0.0
    assert "conjunction" not in scores
