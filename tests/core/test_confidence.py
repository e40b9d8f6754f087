"""Confidence matches the reference formulas of the independent conformance suite `jevcompat`."""

from __future__ import annotations

import random

import pytest
from jevcompat import validate

from typedlm.core.confidence import choice_confidence, normalise, score_confidence


def random_distributions(seed: int = 0, count: int = 200):
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(2, 12)
        weights = [rng.random() ** rng.choice([1, 4, 12]) for _ in range(n)]
        total = sum(weights)
        yield [w / total for w in weights]


@pytest.mark.parametrize("probs", list(random_distributions()))
def test_formulas_match_the_reference(probs):
    assert choice_confidence(probs) == pytest.approx(validate.choice_confidence(probs), abs=1e-12)
    assert score_confidence(probs) == pytest.approx(validate.score_confidence(probs), abs=1e-12)


def test_extremes():
    assert choice_confidence([0.5, 0.5]) == 0
    assert choice_confidence([1.0, 0.0, 0.0]) == 1
    assert score_confidence([0.0, 1.0, 0.0]) == 1
    assert score_confidence([1 / 3] * 3) == pytest.approx(validate.score_confidence([1 / 3] * 3))


def test_normalise_reports_raw_mass_and_handles_zero():
    assert normalise([0.2, 0.6]) == (pytest.approx([0.25, 0.75]), pytest.approx(0.8))
    assert normalise([0.0, 0.0]) == ([0.5, 0.5], 0.0)
