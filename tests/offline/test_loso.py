"""Leave-one-set-out: the calibrator is fitted without the set it is scored on, and it fixes what it can learn."""

from __future__ import annotations

import numpy as np
import pytest

from typedlm.offline.loso import leave_one_set_out
from typedlm.offline.readouts import Readout


def _readouts(name: str, n: int, seed: int, overconfidence: float) -> list[Readout]:
    """Choice answers whose masses are sharper than the truth by `overconfidence` (as a power); priors uniform."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        true = rng.dirichlet(np.ones(4) * 0.7)
        masses = (true**overconfidence / (true**overconfidence).sum() * 0.9).tolist()
        gold = int(rng.choice(4, p=true))
        out.append(Readout(name, str(i), "q", "choice", "sig", [masses], [[0.25] * 4], gold))
    return out


def test_the_calibrator_learned_on_other_sets_fixes_a_shared_overconfidence():
    sets = {
        name: {"train": _readouts(name, 1500, seed, 3.0), "held_out": _readouts(name, 1500, seed + 100, 3.0)}
        for seed, name in enumerate(("a", "b", "c"))
    }
    report = leave_one_set_out(sets, "contextual", reads=1)
    for name in sets:
        rows = report[name]["rows"]
        raw, left_out = rows["raw"]["overall"], rows["calibrated, set left out"]["overall"]
        assert left_out["ece"] < raw["ece"] / 2 and left_out["ece"] < 0.05, (name, raw["ece"], left_out["ece"])
        assert left_out["accuracy"] == raw["accuracy"], "a temperature never changes a choice's top answer"
        # each left-out calibrator was fitted on the two other sets only: it differs from the in-set one
        calibrators = report[name]["calibrators"]
        assert calibrators["set left out"]["choice"] != calibrators["in-set"]["choice"]


def test_weighing_sets_equally_keeps_a_large_set_from_setting_the_temperature_alone():
    from typedlm.offline.loso import answers_of, set_weights

    small = _readouts("small", 200, 1, 1.0)  # honest
    large = _readouts("large", 2000, 2, 4.0)  # overconfident, ten times the answers
    sets = {name: {"train": rows, "held_out": rows} for name, rows in (("small", small), ("large", large))}
    weights = set_weights({name: answers_of(s["train"], "raw") for name, s in sets.items()})
    assert sum(weights["small"]) == pytest.approx(1.0) and sum(weights["large"]) == pytest.approx(1.0)
    fitted = {
        balanced: leave_one_set_out({**sets, "third": sets["small"]}, "raw", use=("bias",), balanced=balanced)
        for balanced in (False, True)
    }
    # fitted without "third" (the small honest set's twin): the large set's share of the fit is 10/11 answers
    # unweighed and 1/2 of the weight weighed equally, so its temperature moves less when weighed equally
    log_t = {b: fitted[b]["third"]["calibrators"]["set left out"]["choice"]["weights"][0] for b in fitted}
    assert log_t[True] < log_t[False]


def test_each_set_reports_its_own_fit_and_the_floor_of_a_perfectly_calibrated_model():
    sets = {
        name: {"train": _readouts(name, 600, seed, 2.0), "held_out": _readouts(name, 300, seed + 100, 2.0)}
        for seed, name in enumerate(("a", "b"))
    }
    report = leave_one_set_out(sets, "raw", use=("bias",))
    for entry in report.values():
        own = entry["calibrators"]["own set"]["choice"]["weights"][0]
        assert own > 0.2, "sharper than the truth by a power of 2: its own temperature is well above 1"
        assert entry["rows"]["calibrated, own set"]["overall"]["ece"] < entry["rows"]["raw"]["overall"]["ece"]
        floor = entry["ece_floor"]
        # 300 answers over 15 bins: even an exactly right model measures an ECE of a few hundredths
        assert 0.01 < floor["mean"] < floor["p90"] < 0.15
        assert 0.0 <= floor["share_at_most_0.05"] <= 1.0


def _yes_no(name: str, n: int, seed: int, yes_rate: float) -> list[Readout]:
    """Yes/no answers of a model that knows a little (its P(yes) leans to the truth), on a set where `yes_rate` of
    the answers are yes."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        gold_yes = rng.random() < yes_rate
        p_yes = float(np.clip(rng.normal(0.6 if gold_yes else 0.4, 0.15), 0.02, 0.98))
        out.append(
            Readout(
                name,
                str(i),
                "q",
                "noul",
                "sig",
                [[0.9 * p_yes, 0.9 * (1 - p_yes)]],
                [[0.45, 0.45]],
                0 if gold_yes else 1,
            )
        )
    return out


def _pairs(name: str, n: int, seed: int) -> list[Readout]:
    """Each question with its negation, read by a model whose answers to the two are exact mirror images."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p_yes = float(rng.uniform(0.05, 0.95))
        for qid, p, gold in (("q", p_yes, 0), ("q.not", 1 - p_yes, 1)):
            out.append(
                Readout(name, f"{i}.coherence", qid, "noul", "sig", [[0.9 * p, 0.9 * (1 - p)]], [[0.45, 0.45]], gold)
            )
    return out


def test_negation_gap_of_the_left_out_calibrators():
    from typedlm.offline.loso import left_out_negation

    # every set answers yes more often than no: a bias on yes fitted on the others learns their base rate
    sets = {
        name: {"train": _yes_no(name, 400, seed, 0.8), "held_out": _yes_no(name, 100, seed + 50, 0.8)}
        for seed, name in enumerate(("a", "b", "c"))
    }
    derived = {name: _pairs(name, 200, seed + 100) for seed, name in enumerate(sets)}
    gaps = {}
    for label, use in (("temperature", ("bias",)), ("yes bias", ("bias", "yes_bias"))):
        result = leave_one_set_out(sets, "raw", use=use, scored="train")
        gaps[label] = left_out_negation(derived, result, "raw")
        assert set(gaps[label]) == set(sets)
    # a temperature keeps mirror-image answers summing to 1 exactly; a bias moves both up, whatever the question
    assert max(gaps["temperature"].values()) < 1e-9
    assert min(gaps["yes bias"].values()) > 0.05
    # a set with no derived pairs (or none of its own readouts) is left out, not scored as 0
    assert "d" not in left_out_negation({**derived, "d": []}, result, "raw")
