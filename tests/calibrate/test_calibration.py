"""Calibration maths, fitting on data with known answers, and the calibration file's checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from typedlm.calibrate.calibration import (
    FLOOR,
    CalibrationFile,
    combine,
    contextual,
    normalised,
    platt,
    tempered,
)
from typedlm.core.errors import ModelError
from typedlm.offline.fitting import fit_platt, fit_scaling, fit_temperature


def test_contextual_divides_out_the_prior():
    # the model says 0.6/0.3/0.1 here and 0.5/0.25/0.25 with nothing to read: the evidence is (1.2, 1.2, 0.4)
    got = contextual([0.3, 0.15, 0.05], [0.2, 0.1, 0.1])
    assert got == pytest.approx(np.array([1.2, 1.2, 0.4]) / 2.8)
    assert contextual([0.2, 0.8], [0.2, 0.8]) == pytest.approx([0.5, 0.5])  # pure prior → uniform


def test_contextual_is_the_array_formula_to_the_last_bit():
    rng = np.random.default_rng(0)
    for n in (2, 3, 6, 26):
        for _ in range(200):
            masses, prior = (rng.choice([0.0, 1e-300, 1e-13, 1e-6, 0.5, 1.0], n) * rng.random(n) for _ in range(2))
            want = normalised(np.asarray(normalised(masses)) / np.maximum(normalised(prior), FLOOR))  # as arrays
            got = contextual(masses.tolist(), prior.tolist())
            assert all(type(p) is float for p in got)  # plain floats, no numpy scalars
            assert np.asarray(got).tobytes() == np.asarray(want, dtype=np.float64).tobytes()


def test_combining_one_read_returns_it():
    read = normalised([0.2, 0.5, 0.3])
    mean, stderr, agreement = combine([read])
    assert mean == read and mean is not read and (stderr, agreement) == (0.0, 1.0)
    assert np.asarray(mean).tobytes() == np.stack([read]).mean(axis=0).tobytes()


def test_platt_and_temperature_by_hand():
    p = np.array([0.8, 0.2])  # yes, no: log-odds log 4
    assert platt(p, 1.0, 0.0) == pytest.approx(p)
    assert platt(p, 0.5, 0.0)[0] == pytest.approx(2 / 3)  # σ(log 2)
    assert platt(p, 0.0, math.log(3))[0] == pytest.approx(0.75)
    assert tempered(np.array([0.5, 0.25, 0.25]), 1.0) == pytest.approx([0.5, 0.25, 0.25])
    assert tempered(np.array([0.5, 0.25, 0.25]), 0.5) == pytest.approx(np.array([4, 1, 1]) / 6)
    assert tempered(np.array([0.7, 0.2, 0.1]), 1e3) == pytest.approx([1 / 3] * 3, abs=1e-3)
    assert normalised([0, 0]) == pytest.approx([0.5, 0.5])


def test_fitting_recovers_known_parameters():
    rng = np.random.default_rng(0)
    # noul: the truth is σ(0.5·z − 1) of the model's log-odds z
    z = rng.normal(0, 2, 20000)
    p_model = 1 / (1 + np.exp(-z))
    truth = 1 / (1 + np.exp(-(0.5 * z - 1)))
    gold = rng.random(len(z)) < truth
    a, b = fit_platt([np.array([p, 1 - p]) for p in p_model], gold)
    assert a == pytest.approx(0.5, abs=0.05) and b == pytest.approx(-1.0, abs=0.05)
    # choice: the model is twice as sharp as the truth (T = 2 undoes it)
    logits = rng.normal(0, 1.5, (5000, 4))
    truth = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    sharp = np.exp(2 * logits) / np.exp(2 * logits).sum(1, keepdims=True)
    gold = [int(rng.choice(4, p=row)) for row in truth]
    assert fit_temperature(list(sharp), gold) == pytest.approx(2.0, rel=0.1)


def test_combine_reports_stderr_and_agreement():
    reads = [np.array([0.7, 0.3]), np.array([0.4, 0.6]), np.array([0.4, 0.6]), np.array([0.9, 0.1])]
    mean, stderr, agreement = combine(reads)
    assert mean == pytest.approx([0.6, 0.4])
    assert stderr == pytest.approx(np.std([0.7, 0.4, 0.4, 0.9], ddof=1) / 2)
    assert agreement == pytest.approx(0.5)  # reads 1 and 4 pick option 0, as the mean does
    single = combine([np.array([0.2, 0.8])])
    assert single[1] == 0.0 and single[2] == 1.0


def fitted(**overrides) -> CalibrationFile:
    values = dict(
        model="m",
        fingerprint="abc",
        prompt_version="1",
        base="raw",
        params={"noul": {"a": 0.5, "b": 0.0}, "choice": {"temperature": 2.0}},
        data={"sets": ["x"]},
    )
    return CalibrationFile(**{**values, **overrides})


def test_calibration_file_round_trip_and_checks(tmp_path):
    path = tmp_path / "cal.json"
    fitted().save(path)
    loaded = CalibrationFile.load(path)
    assert loaded == fitted()
    loaded.check("abc", "1")
    with pytest.raises(ModelError, match="another model"):
        loaded.check("def", "1")
    with pytest.raises(ModelError, match="prompt version"):
        loaded.check("abc", "2")
    assert loaded.reader("noul")([0.8, 0.2], None)[0] == pytest.approx(2 / 3)
    assert loaded.reader("score")([0.5, 0.5], None) == pytest.approx([0.5, 0.5])  # no params
    for bad in ("not json", '{"format": "other"}', '{"format": "typedlm-calibration/1", "base": "raw"}'):
        path.write_text(bad)
        with pytest.raises(ModelError):
            CalibrationFile.load(path)


def test_per_question_scaling_learns_how_often_each_answer_is_right():
    rng = np.random.default_rng(1)
    # an uninformative model (always 0.5/0.3/0.2) on a question whose answer is option 2 in 70% of cases
    probs = [np.array([0.5, 0.3, 0.2])] * 3000
    gold = rng.choice(3, size=3000, p=[0.1, 0.2, 0.7])
    temperature, bias = fit_scaling(probs, gold)
    got = tempered(probs[0], temperature, bias)
    assert got == pytest.approx([0.1, 0.2, 0.7], abs=0.03)


def test_a_files_own_question_parameters_win_over_its_types():
    from typedlm.calibrate.calibration import signature
    from typedlm.core.questions import ChoiceQuestion

    known = ChoiceQuestion((("a", None), ("b", None)), "Known?")
    unknown = ChoiceQuestion((("a", None), ("b", None)), "Unknown?")
    questions = {signature(known): {"kind": "choice", "n": 50, "temperature": 1.0, "bias": [0.0, math.log(3)]}}
    file = fitted(questions=questions, params={"choice": {"temperature": 1.0}})
    assert file.reader("choice", signature(known))([0.5, 0.5], None) == pytest.approx([0.25, 0.75])
    assert file.reader("choice", signature(unknown))([0.5, 0.5], None) == pytest.approx([0.5, 0.5])
    assert signature(known) != signature(unknown) and len(signature(known)) == 16


def test_platt_never_reverses_the_models_evidence():
    # gold is the opposite of what the model says: the best monotone fit is a flat prior, not a flip
    probs = [np.array([0.9, 0.1]), np.array([0.2, 0.8])] * 50
    gold = [False, True] * 50
    a, b = fit_platt(probs, gold)
    assert a == pytest.approx(0.0, abs=1e-6) and 1 / (1 + math.exp(-b)) == pytest.approx(0.5, abs=1e-3)


# ---------------------------------------------------------------- the feature calibrator


def test_feature_scaling_by_hand():
    from typedlm.calibrate.calibration import CALIBRATOR_FEATURES, calibrator_features, feature_scaled

    probs = [0.5, 0.25, 0.25]
    phi = calibrator_features(probs, raw_mass=0.5, disagreement=1 / 3)
    entropy = -(0.5 * math.log(0.5) + 0.5 * math.log(0.25)) / math.log(3)
    assert phi == pytest.approx([1.0, math.log(0.5), entropy, math.log(3), 1 / 3])
    assert len(phi) == len(CALIBRATOR_FEATURES)
    zero = {"weights": [0.0] * len(phi)}
    assert feature_scaled("choice", probs, zero, phi) == pytest.approx(probs)  # T = 1
    halve = {"weights": [-math.log(2), 0, 0, 0, 0]}  # T = 1/2: squares, renormalised
    assert feature_scaled("choice", probs, halve, phi) == pytest.approx(np.array([4, 1, 1]) / 6)
    by_mass = {"weights": [0, -1.0, 0, 0, 0]}  # log T = -log m: T = 2 at raw mass 0.5
    assert feature_scaled("score", probs, by_mass, phi) == pytest.approx(tempered(probs, 2.0))
    yes = {"weights": [0.0] * 5, "bias": math.log(3)}  # odds 1:1 → 3:1
    assert feature_scaled("noul", [0.5, 0.5], yes, calibrator_features([0.5, 0.5], 1.0, 0.0)) == pytest.approx(
        [0.75, 0.25]
    )


def test_fitting_the_calibrator_recovers_a_temperature_that_depends_on_raw_mass():
    from typedlm.calibrate.calibration import calibrator_features
    from typedlm.offline.fitting import fit_calibrator

    # answers whose base probabilities are overconfident by T = 1 / raw mass: a model that is sure when the
    # answer format lands (mass near 1) and guesses when it does not
    rng = np.random.default_rng(0)
    probs, features, gold = [], [], []
    for _ in range(3000):
        mass = float(rng.uniform(0.2, 1.0))
        true = rng.dirichlet(np.ones(4))
        base = tempered(true, mass)  # sharper than the truth by 1 / mass
        probs.append(base)
        features.append(calibrator_features(base, mass, 0.0))
        gold.append(int(rng.choice(4, p=true)))
    params = fit_calibrator("choice", probs, features, gold)
    assert params["weights"][1] == pytest.approx(-1.0, abs=0.25), params  # log T = -log m
    assert "bias" not in params


def test_a_prior_weight_divides_out_that_share_of_the_content_free_prior():
    from typedlm.calibrate.calibration import calibrator_features, contextual, feature_scaled

    probs, prior = [0.6, 0.3, 0.1], [0.7, 0.2, 0.1]
    phi = calibrator_features(probs, 1.0, 0.0)
    one = {"weights": [0.0] * len(phi), "prior_weight": 1.0}  # all of it, at T = 1: contextual calibration
    assert feature_scaled("choice", probs, one, phi, prior) == pytest.approx(contextual(probs, prior))
    half = {"weights": [math.log(2), 0, 0, 0, 0], "prior_weight": 0.5}  # p ∝ (p / q^0.5)^(1/2), by hand
    want = np.sqrt(np.array(probs) / np.sqrt(prior))
    assert feature_scaled("choice", probs, half, phi, prior) == pytest.approx(want / want.sum())
    assert np.argmax(feature_scaled("choice", probs, one, phi, prior)) == 1  # unlike a temperature, it may move
    with pytest.raises(AssertionError, match="content-free prior"):
        feature_scaled("choice", probs, one, phi)
    file = CalibrationFile("m", "f" * 16, "1", "raw", {}, calibrator={"noul": {"weights": [0.0] * 5}})
    assert not file.needs_prior
    file.calibrator["noul"]["prior_weight"] = 0.4
    assert file.needs_prior


def test_fitting_the_calibrator_recovers_how_much_of_the_prior_is_bias():
    from typedlm.calibrate.calibration import calibrator_features
    from typedlm.offline.fitting import fit_calibrator

    # a reader whose answers carry its label prior q to the power 0.6 on top of the truth: p ∝ truth · q^0.6
    rng = np.random.default_rng(1)
    probs, priors, features, gold = [], [], [], []
    for _ in range(4000):
        true, q = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3))
        base = true * q**0.6 / (true * q**0.6).sum()
        probs.append(base.tolist())
        priors.append(q.tolist())
        features.append(calibrator_features(base, 1.0, 0.0))
        gold.append(int(rng.choice(3, p=true)))
    params = fit_calibrator("choice", probs, features, gold, ("bias", "prior_weight"), priors=priors)
    assert params["prior_weight"] == pytest.approx(0.6, abs=0.1), params
    assert params["weights"][0] == pytest.approx(0.0, abs=0.1), "no temperature beyond the prior"
    assert "prior_weight" not in fit_calibrator("choice", probs, features, gold, ("bias",))


def test_a_file_with_a_calibrator_round_trips_and_older_files_still_load(tmp_path):
    import json

    file = CalibrationFile(
        "m", "f" * 16, "1", "contextual", {}, calibrator={"noul": {"weights": [0.1] * 5, "bias": 0.2}}
    )
    file.save(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["format"] == "typedlm-calibration/2"
    assert CalibrationFile.load(tmp_path / "c.json") == file
    old = json.loads((tmp_path / "c.json").read_text())
    old["format"] = "typedlm-calibration/1"
    del old["calibrator"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert CalibrationFile.load(tmp_path / "old.json").calibrator == {}
    assert file.uses_calibrator("noul", None) and not file.uses_calibrator("choice", None)
    with_own = CalibrationFile("m", "f" * 16, "1", "raw", {}, questions={"abc": {"kind": "noul", "a": 1, "b": 0}},
                               calibrator=file.calibrator)  # fmt: skip
    assert not with_own.uses_calibrator("noul", "abc"), "a question's own parameters come first"
