"""The learner (`typedlm.calibrate.learning`): calibration fitted from gold answers, per level, shrunk to its parent.

Synthetic labels with a known truth: answers whose default probabilities are sharpened versions of the true ones
(true p^(1/T) for a known T), so a fitted temperature must come back near T, and log loss must fall."""

from __future__ import annotations

import math

import numpy as np
import pytest

from typedlm.calibrate.learning import LEVELS, Learner, Sample, question_keys
from typedlm.core.questions import ChoiceQuestion, NoulQuestion


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def overconfident(n_labels: int, answers: int = 2, temperature: float = 3.0, seed: int = 0) -> list[Sample]:
    """Labels drawn from true probabilities; the default reports them sharpened by `temperature`."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_labels):
        true = _softmax(rng.normal(0.0, 1.0, answers))
        shown = _softmax(np.log(true) * temperature)
        samples.append(Sample(tuple(shown.tolist()), 0.9, 0.0, int(rng.choice(answers, p=true))))
    return samples


def mean_log_loss(samples, probs_of) -> float:
    return float(np.mean([-math.log(probs_of(s)[s.gold]) for s in samples]))


KEYS = question_keys(NoulQuestion("Is it about billing?"), "1")


def test_a_question_without_labels_passes_its_probabilities_through():
    learner = Learner()
    probs, used = learner.calibrate(KEYS, [0.9, 0.1], 0.8, 0.0)
    assert probs == [0.9, 0.1] and used is None


def test_an_overconfident_default_is_softened_and_log_loss_falls():
    train, test = overconfident(400, seed=1), overconfident(400, seed=2)
    learner = Learner()
    learner.add((KEYS, s) for s in train)
    before = mean_log_loss(test, lambda s: s.probs)
    after = mean_log_loss(test, lambda s: learner.calibrate(KEYS, s.probs, s.mass, s.disagreement)[0])
    assert after < before - 0.05
    # the most specific level answers, with every label counted
    _, used = learner.calibrate(KEYS, test[0].probs, test[0].mass, 0.0)
    assert used is not None and used.level == "exact" and used.labels == 400
    # a sharpened 0.95 comes back far less sure (true temperature 3: 0.95 shown is about 0.73 true)
    softened, _ = learner.calibrate(KEYS, [0.95, 0.05], 0.9, 0.0)
    assert 0.6 < softened[0] < 0.85


def test_few_labels_move_a_level_a_little_many_move_it_a_lot():
    moved = []
    for n in (3, 100):
        learner = Learner()
        learner.add((KEYS, s) for s in overconfident(n, seed=3))
        moved.append(0.95 - learner.calibrate(KEYS, [0.95, 0.05], 0.9, 0.0)[0][0])
    assert abs(moved[0]) < moved[1] / 4  # 3 labels may lean either way, a little


def test_adding_labels_one_at_a_time_matches_adding_them_at_once():
    samples = overconfident(60, seed=4)
    at_once, one_by_one = Learner(), Learner()
    at_once.add((KEYS, s) for s in samples)
    for s in samples:
        one_by_one.add([(KEYS, s)])
    a = at_once.calibrate(KEYS, [0.8, 0.2], 0.9, 0.0)[0]
    b = one_by_one.calibrate(KEYS, [0.8, 0.2], 0.9, 0.0)[0]
    assert a == pytest.approx(b, abs=0.02)  # warm starts and variant choices at doublings may differ a little


def test_a_family_learns_for_questions_of_it_never_labeled():
    family = "Which team should handle this?"
    seen = ChoiceQuestion((("billing", None), ("tech", None), ("sales", None)), family)
    unseen = ChoiceQuestion((("billing", None), ("legal", None), ("hr", None)), family)
    learner = Learner()
    learner.add((question_keys(seen, "1"), s) for s in overconfident(200, answers=3, seed=5))
    probs, used = learner.calibrate(question_keys(unseen, "1"), [0.9, 0.05, 0.05], 0.9, 0.0)
    assert used is not None and used.level == "family" and used.labels == 200
    assert probs[0] < 0.85
    other_kind = question_keys(NoulQuestion("Is it urgent?"), "1")
    assert learner.calibrate(other_kind, [0.9, 0.1], 0.9, 0.0) == ([0.9, 0.1], None)


def test_a_bias_toward_one_answer_is_learned_for_a_yes_no_question():
    rng = np.random.default_rng(6)
    samples = []
    for _ in range(300):  # the default says yes with 0.7 whatever the truth; the truth is yes 30% of the time
        samples.append(Sample((0.7, 0.3), 0.9, 0.0, 0 if rng.random() < 0.3 else 1))
    learner = Learner()
    learner.add((KEYS, s) for s in samples)
    probs, _ = learner.calibrate(KEYS, [0.7, 0.3], 0.9, 0.0)
    assert probs[0] == pytest.approx(0.3, abs=0.07)


def test_levels_are_named_most_specific_first():
    assert LEVELS == ("exact", "family", "kind")


def test_a_learner_holds_its_latest_samples_within_its_budget_and_keeps_what_it_learned():
    budget = 40_000  # bytes: a few hundred two-answer samples
    old = question_keys(NoulQuestion("Is it spam?"), "1")
    learner = Learner(max_bytes=budget)
    learner.add((old, s) for s in overconfident(200, seed=8))
    learned = {level: learner.snapshot[(level, old[level])] for level in ("exact", "family")}
    for start in range(0, 3000, 100):  # then many labels of another question
        learner.add((KEYS, s) for s in overconfident(100, seed=9 + start))
    assert learner.count == 3200 and learner.held < 3200
    assert learner.held * 8 * (2 + 4) <= budget and learner.nbytes <= 2 * budget
    # the first question's samples are let go, its levels too; their fits stay (its kind, shared, learns on)
    for level, fitted in learned.items():
        assert (level, old[level]) not in learner.levels and learner.snapshot[(level, old[level])] is fitted
    assert learner.calibrate(old, [0.95, 0.05], 0.9, 0.0)[1].level == "exact"
    # every level holds only samples still held, and the newest are held
    held = set(learner.where)
    assert all(set(level.samples) <= held for level in learner.levels.values())
    assert max(held) == learner.count - 1 and min(held) == learner.first
    # what it holds is what it was given: each held row is the sample added at that index
    later = [s for start in range(0, 3000, 100) for s in overconfident(100, seed=9 + start)]
    for index in (learner.first, learner.count - 1):
        size, row = learner.where[index]
        assert learner.columns[size].probs[row].tolist() == list(later[index - 200].probs)
        assert learner.columns[size].gold[row] == later[index - 200].gold
