"""The guarantees (`typedlm.calibrate.guarantees`, `out_of_fold`, `decisions`), checked against their theory by
simulation: the spread of realised coverage over many draws of labels, the rate at which a certificate is wrong, the
online variant's long-run miss rate on a stream that drifts; and the out-of-fold scores recomputed by brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta, binom

from typedlm.calibrate.decisions import Decisions, settled_labels
from typedlm.calibrate.guarantees import (
    answer_set,
    binomial_tail,
    certify,
    clopper_pearson_lower,
    cv_plus_floor,
    cv_plus_set,
    labels_needed,
    online_run,
    quantile_rank,
    split_misses,
    split_quantile,
)
from typedlm.calibrate.learning import Learner, Sample, question_keys
from typedlm.calibrate.out_of_fold import FOLDS, OutOfFold, Served
from typedlm.calibrate.readout import Readouts
from typedlm.core.questions import ChoiceQuestion, NoulQuestion

from .test_learning import overconfident


@pytest.mark.parametrize(("n", "k", "p"), [(10, 9, 0.9), (100, 95, 0.9), (4000, 3700, 0.9), (50, 0, 0.3), (7, 8, 0.5)])
def test_the_binomial_tail_is_scipys(n, k, p):
    assert binomial_tail(n, k, p) == pytest.approx(binom.sf(k - 1, n, p), rel=1e-9, abs=1e-300)


def test_too_few_labels_give_every_answer():
    assert labels_needed(0.1) == 9 and quantile_rank(8, 0.1) is None and quantile_rank(9, 0.1) == 9
    assert split_quantile(np.linspace(0, 1, 8), 0.1) is None
    assert answer_set([0.7, 0.2, 0.1], None) == [0, 1, 2]
    assert answer_set([0.7, 0.2, 0.1], 0.85) == [0, 1] and answer_set([0.7, 0.2, 0.1], 0.2) == []


@pytest.mark.parametrize(("n", "alpha"), [(20, 0.1), (100, 0.1), (60, 0.2)])
def test_split_conformal_coverage_follows_the_beta_law_over_draws_of_labels(n, alpha):
    """Exchangeable scores: the coverage given n labels (the share of new scores within the quantile) is
    Beta(k, n + 1 - k) over draws of the labels; its mean, spread and lower tail match that law."""
    rng = np.random.default_rng(0)
    coverages = np.asarray([(rng.random(4000) <= split_quantile(rng.random(n), alpha)).mean() for _ in range(2000)])
    k = quantile_rank(n, alpha)
    law = beta(k, n + 1 - k)
    assert coverages.mean() == pytest.approx(law.mean(), abs=0.004)
    assert coverages.std() == pytest.approx(math.sqrt(law.var() + law.mean() * (1 - law.mean()) / 4000), rel=0.08)
    assert (coverages < law.ppf(0.1)).mean() == pytest.approx(0.1, abs=0.03)


def test_a_certificate_is_wrong_at_most_delta_of_the_time():
    """Answers whose accuracy rises with confidence: over many draws of 200 labels the certified threshold's true
    accuracy (computed from the known law) falls below the target in at most δ of the draws, and a certificate is
    found in most."""
    rng = np.random.default_rng(1)
    target, delta, wrong, found = 0.85, 0.1, 0, 0
    draws = 400
    for _ in range(draws):
        confidence = rng.uniform(0.5, 1.0, 200)
        correct = rng.random(200) < confidence  # calibrated: accuracy at c is c
        certificate = certify(confidence, correct, target, delta)
        if certificate is not None:
            found += 1
            tau = certificate.confidence
            wrong += (tau + 1.0) / 2 < target  # the true accuracy of answers ≥ τ: the mean of U(τ, 1)
    assert found > draws / 2
    assert wrong / draws <= delta + 2 * math.sqrt(delta * (1 - delta) / draws)


def test_no_label_confident_enough_certifies_nothing():
    assert certify(np.full(50, 0.6), np.ones(50, bool), 0.95).labels == 50  # all 50 right: 0.95^50 < 0.1
    assert certify(np.full(20, 0.6), np.ones(20, bool), 0.95) is None  # 0.95^20 > 0.1: never testable
    assert certify(np.full(50, 0.6), np.zeros(50, bool), 0.9) is None


def test_the_online_variant_holds_its_miss_rate_after_a_drift_where_split_conformal_does_not():
    """Scores from an easy task then a hard one: split conformal, calibrated on the easy part, misses far more
    than α after the switch; adaptive conformal inference comes back to within 0.02 of α."""
    rng = np.random.default_rng(2)
    alpha = 0.1
    scores = np.concatenate([rng.beta(1, 8, 400), rng.beta(3, 2, 800)]).tolist()
    _, online = online_run(scores, alpha)
    split = split_misses(scores, alpha)
    assert split[400:].mean() > alpha + 0.1
    assert abs(online[400:].mean() - alpha) <= 0.02


def _labels(n: int, seed: int = 0):
    question = ChoiceQuestion((("a", None), ("b", None), ("c", None)), "Which?")
    keys = question_keys(question, "1")
    return keys, overconfident(n, answers=3, temperature=3.0, seed=seed)


def test_out_of_fold_scores_are_those_of_a_fold_model_that_never_saw_the_label():
    """Brute force: for each fold, a fresh learner and fresh readouts fitted on every label outside it score the
    fold's labels as `OutOfFold` does, readout included; the in-sample scores (a model fitted on every label) are
    not what it reports; and a new answer is the mean of the five fold models."""
    keys, samples = _labels(60)
    rng = np.random.default_rng(11)
    features = rng.standard_normal((60, 16)) + 1.5 * np.eye(16)[[s.gold for s in samples]]  # they tell the answer
    folds = OutOfFold()
    folds.add((i, keys, s, features[i], True) for i, s in enumerate(samples))
    scored = folds.scored("exact", keys["exact"])
    assert (scored.folds == np.arange(60) % FOLDS).all()
    alone_models = []
    for fold in range(FOLDS):
        alone, readouts = Learner(), Readouts()
        outside = [(i, s) for i, s in enumerate(samples) if i % FOLDS != fold]
        alone.add((keys, s) for _, s in outside)
        readouts.add([alone], [(i, keys, s, features[i]) for i, s in outside])
        alone_models.append((alone, readouts))
        for i in range(fold, len(samples), FOLDS):
            probs, _ = alone.calibrate(keys, samples[i].probs, samples[i].mass, samples[i].disagreement)
            probs, _ = readouts.apply(keys, "choice", probs, features[i].astype(np.float16).astype(np.float64))
            assert scored.scores[i] == pytest.approx(1 - probs[samples[i].gold], abs=1e-6)
    assert any(readouts.fit_for(keys, "choice", 3) is not None for _, readouts in alone_models)  # readouts in play
    everything = Learner()
    everything.add((keys, s) for s in samples)
    in_sample = [1 - everything.calibrate(keys, s.probs, s.mass, s.disagreement)[0][s.gold] for s in samples]
    assert not np.allclose(scored.scores, in_sample, atol=1e-6)
    new = Sample((0.5, 0.3, 0.2), 0.9, 0.0, 0)
    served = folds.answer(keys, "choice", new.probs, new.mass, 0.0, features[0])
    assert served.by_fold.shape == (FOLDS, 3) and served.used.level == "exact" and served.used.labels == 60
    for fold, (alone, readouts) in enumerate(alone_models):
        probs, _ = alone.calibrate(keys, new.probs, new.mass, 0.0)
        probs, _ = readouts.apply(keys, "choice", probs, features[0])
        assert served.by_fold[fold] == pytest.approx(probs, abs=1e-9)
    assert served.probs == pytest.approx(served.by_fold.mean(axis=0).tolist())


def test_chosen_labels_are_learned_but_never_scored():
    keys, samples = _labels(30)
    folds = OutOfFold()
    folds.add((i, keys, s, None, i % 3 != 0) for i, s in enumerate(samples))
    assert len(folds.scored("exact", keys["exact"])) == 20
    assert sum(len(learner.snapshot) > 0 for learner in folds.learners) == FOLDS  # every fold learned labels
    assert folds.used(keys).labels == 30  # the chosen ones count as learned


def test_cv_plus_is_split_conformal_where_every_fold_model_is_the_same_and_counts_as_defined():
    rng = np.random.default_rng(5)
    for _ in range(200):
        n, answers, alpha = int(rng.integers(9, 60)), int(rng.integers(2, 6)), float(rng.choice([0.1, 0.2]))
        scores, folds = rng.random(n), np.arange(n) % FOLDS
        by_fold = tuple(np.sort(scores[folds == f]) for f in range(FOLDS))
        probs = rng.dirichlet(np.ones(answers))
        rank = quantile_rank(n, alpha)
        assert cv_plus_set(np.tile(probs, (FOLDS, 1)), by_fold, rank) == answer_set(
            probs.tolist(), split_quantile(scores, alpha)
        )
        different = rng.dirichlet(np.ones(answers), FOLDS)  # [K, n]: each fold model its own answer
        want = [y for y in range(answers) if sum(scores[i] < 1 - different[folds[i], y] for i in range(n)) < rank]
        assert cv_plus_set(different, by_fold, rank) == want
    assert cv_plus_set(np.full((FOLDS, 3), 1 / 3), (np.zeros(0),) * FOLDS, None) == [0, 1, 2]
    assert cv_plus_floor(100, 0.1, 5) == pytest.approx(0.8 - 2 * 0.8 / 21)


def test_the_clopper_pearson_bound_is_scipys_and_a_certificate_clears_its_target():
    for n, right in ((20, 20), (131, 129), (400, 370), (50, 0)):
        want = beta.ppf(0.1, right, n - right + 1) if right else 0.0
        assert clopper_pearson_lower(n, right, 0.1) == pytest.approx(want, abs=1e-9)
    rng = np.random.default_rng(6)
    confidence = rng.uniform(0.5, 1.0, 300)
    certificate = certify(confidence, rng.random(300) < confidence, 0.85)
    assert certificate is not None and certificate.lower_bound >= 0.85


def test_sets_come_from_the_most_specific_settled_level_else_the_most_labeled():
    """A family asked with two option sets: with few labels per question the family speaks; a question with
    enough of its own speaks for itself; the top answer shown is always in the set."""
    noul = [question_keys(NoulQuestion("Is it urgent?", true=f"version {v}"), "1") for v in range(2)]
    rng = np.random.default_rng(3)
    folds = OutOfFold()
    items = []
    for i in range(80):
        keys = noul[0] if i < 60 else noul[1]
        p = float(rng.uniform(0.05, 0.95))
        items.append((i, keys, Sample((p, 1 - p), 0.9, 0.0, int(rng.random() > p)), None, True))
    folds.add(items)
    decisions = Decisions(folds)
    assert settled_labels(0.1) <= 60
    mine = decisions.answer_set(noul[0], folds.answer(noul[0], "noul", [0.5, 0.5], 0.9, 0.0), 0.9)
    assert (mine.level, mine.labels, mine.guarantee) == ("exact", 60, "cv+")
    assert mine.proven == pytest.approx(cv_plus_floor(60, 0.1, FOLDS))
    other = decisions.answer_set(noul[1], folds.answer(noul[1], "noul", [0.5, 0.5], 0.9, 0.0), 0.9)
    assert (other.level, other.labels) == ("family", 80)
    unseen = question_keys(ChoiceQuestion((("a", None), ("b", None)), "Another?"), "1")  # no choice labels
    none = decisions.answer_set(unseen, Served.alone([0.9, 0.1]), 0.9)
    assert (none.answers, none.guarantee, none.level) == ([0, 1], "none", "default")
    wire = mine.to_wire((True, False))
    assert wire["coverage"] == 0.9 and wire["guaranteed"] is True and set(wire["answers"]) <= {True, False}
    for p in np.linspace(0.01, 0.99, 40):  # at a coverage this low the quantile alone may hold no answer
        served = folds.answer(noul[0], "noul", [p, 1 - p], 0.9, 0.0)
        top = int(np.argmax(served.probs))
        assert top in decisions.answer_set(noul[0], served, 0.5).answers


def test_through_the_feedback_calibrator_sets_hold_the_answer_shown_and_cover_where_the_truth_is_known():
    """The served path on a task whose true probabilities are known (`offline.handover_check`): every set holds the
    answer shown and every certificate names it (asserted inside), and over independent draws of labels the sets
    cover near 1 − α with the theory's spread, a readout in force or not."""
    from typedlm.offline.handover_check import Task, check

    for task in (Task(2), Task(4, readout=True)):
        report = check(task, draws=12, labels=100, answers_per_draw=120, seed=3)
        assert abs(report["coverage_mean"] - 0.9) <= 0.03, report
        assert report["coverage_sd"] <= 0.06 and report["switched_draws"] == 0, report
