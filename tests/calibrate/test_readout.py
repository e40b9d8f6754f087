"""The learned readout: its MAP fit against a general-purpose optimiser, its cross-validated choice, its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from typedlm.calibrate.learning import Learner, Sample
from typedlm.calibrate.readout import MIN_READOUT_LABELS, Readouts, readout_keys
from typedlm.calibrate.readout_fit import ReadoutFit, Whitening, choose, fit_weights

KEYS = {"exact": "e1", "family": "f1", "kind": "noul"}


def _task(n: int, answers: int, signal: float, seed: int, dims: int = 32):
    """Labels whose calibrated answer knows nothing (uniform) and whose features hold `signal` about the gold."""
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, answers, n)
    centres = rng.standard_normal((answers, dims))
    features = rng.standard_normal((n, dims)) + signal * centres[gold]
    offsets = np.full((n, answers), np.log(1 / answers))
    return offsets, features, gold


def test_the_fit_is_the_map_a_general_optimiser_finds():
    optimize = pytest.importorskip("scipy.optimize")
    offsets, features, gold = _task(80, 3, 0.8, seed=1)
    offsets = offsets + np.random.default_rng(2).normal(0, 0.5, offsets.shape)  # calibrated answers that lean
    x = Whitening.of(features, 8)(features)
    shrink = 4.0
    got = fit_weights(offsets, x, gold, shrink)

    def objective(flat):
        w = flat.reshape(3, x.shape[1])
        logits = offsets + x @ w.T
        logits = logits - logits.max(axis=1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        return -log_p[np.arange(len(gold)), gold].sum() + shrink / 2 * (w**2).sum()

    want = optimize.minimize(objective, np.zeros(3 * x.shape[1]), method="L-BFGS-B", options={"gtol": 1e-10}).x
    assert objective(got.ravel()) <= objective(want) + 1e-6
    assert np.allclose(got, want.reshape(got.shape) - want.reshape(got.shape).mean(0), atol=1e-3)


def test_a_readout_is_chosen_where_the_features_tell_the_answer_and_held_out_accuracy_rises():
    offsets, features, gold = _task(240, 4, 0.6, seed=3)
    chosen = choose(offsets[:120], features[:120], gold[:120])
    assert chosen is not None
    fitted = ReadoutFit.fit(offsets[:120], features[:120], gold[:120], *chosen)
    accuracy = np.mean(fitted.apply_rows(offsets[120:], features[120:]).argmax(1) == gold[120:])
    assert accuracy > 0.6  # chance: 0.25


def test_noise_features_earn_no_readout_on_most_tasks():
    chosen = [choose(*_task(60, 2, 0.0, seed=seed)) for seed in range(10)]
    assert sum(c is not None for c in chosen) <= 2


def _known_task(rng: np.random.Generator, base: float, signal: float, n: int = 60, answers: int = 4, dims: int = 64):
    """Labels drawn from known true probabilities (softmax of N(0, 1.5²) logits), the calibrated answer their
    softmax at temperature `base` (0.6: over-confident), features noise but for a shift of `signal` along a unit
    direction per answer in their first 4 dimensions (scripts/readout_gate_simulation.py at full size)."""
    true = rng.normal(0.0, 1.5, (n, answers))
    probs = np.exp(true) / np.exp(true).sum(axis=1, keepdims=True)
    gold = np.minimum((rng.random(n)[:, None] > probs.cumsum(axis=1)).sum(axis=1), answers - 1)
    offsets = true / base - np.log(np.exp(true / base).sum(axis=1, keepdims=True))
    features = rng.standard_normal((n, dims))
    directions = rng.standard_normal((answers, 4))
    features[:, :4] += signal * directions[gold] / np.linalg.norm(directions[gold], axis=1, keepdims=True)
    return offsets, features, gold


@pytest.mark.parametrize("base", [0.6, 1.6, 1.0])
def test_noise_features_pass_the_gate_in_at_most_a_few_draws_whatever_the_base(base):
    """A base wrong in its confidence is mended by a temperature, which the gate gives calibration alone too: noise
    features earn no readout from it, nor from the best of many variants. 40 draws: a gate that passes noise in 5%
    of draws passes more than 5 of them with probability 1.4% (binomial), one that passes it in 15% passes at most 5
    with probability 43% (the gate before passed 24, 14 and 6 of these draws)."""
    passed = sum(choose(*_known_task(np.random.default_rng([5, d]), base, 0.0)) is not None for d in range(40))
    assert passed <= 5, passed


def test_features_that_carry_the_answer_pass_the_gate_in_most_draws():
    passed = sum(
        choose(*_known_task(np.random.default_rng([6, d]), base, 3.0)) is not None
        for base in (0.6, 1.6, 1.0)
        for d in range(10)
    )
    assert passed >= 20, passed


def test_readouts_learn_where_answers_mean_the_same_and_stay_bounded():
    assert readout_keys(KEYS, "noul", 2) == [("family", "f1"), ("kind", "noul")]
    assert readout_keys({**KEYS, "kind": "choice"}, "choice", 5) == [("exact", "e1")]
    assert readout_keys({**KEYS, "kind": "choice"}, "choice", 65) == []  # too many answers for weights of each
    _, features, gold = _task(200, 2, 0.8, seed=4)
    learner, readouts = Learner(), Readouts(max_bytes=60_000)
    labeled = [(i, KEYS, Sample((0.5, 0.5), 0.5, 0.0, int(g)), f) for i, (g, f) in enumerate(zip(gold, features))]
    learner.add((k, s) for _, k, s, _ in labeled)
    readouts.add([learner], labeled[: MIN_READOUT_LABELS - 1])
    assert readouts.fit_for(KEYS, "noul", 2) is None  # too few labels
    readouts.add([learner], [(-1, KEYS, Sample((0.5, 0.5), 0.5, 0.0, 0), None)])  # no features: passed over
    readouts.add([learner], labeled[MIN_READOUT_LABELS - 1 :])
    assert readouts.held_bytes <= 60_000 and len(readouts.levels[("family", "f1")].samples) < 200
    assert len(readouts.levels[("kind", "noul")].samples) < 200
    fitted = readouts.fit_for(KEYS, "noul", 2)
    assert fitted is not None
    probs, used = readouts.apply(KEYS, "noul", [0.5, 0.5], features[0])
    assert used is fitted and abs(sum(probs) - 1) < 1e-9 and probs != [0.5, 0.5]
    assert readouts.apply(KEYS, "noul", [0.5, 0.5], None) == ([0.5, 0.5], None)
