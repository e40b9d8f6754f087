"""The simulated user (`typedlm.offline.simulation`) on synthetic readouts with a known truth: three sets of yes/no
answers, each read over-confidently by its own amount, so that a default fitted on the other sets is off on each and
gold answers posted back must bring the held-out ECE down."""

from __future__ import annotations

import numpy as np

from typedlm.calibrate.calibration import signature
from typedlm.core.questions import NoulQuestion
from typedlm.offline.readouts import Readout
from typedlm.offline.simulation import ShippedVariant, defaults, simulate, verdicts

QUESTION = NoulQuestion("Is it positive?")


def readouts(name: str, n: int, sharpness: float, seed: int) -> list[Readout]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        p_yes = 1 / (1 + np.exp(-rng.normal(0, 1.5)))
        gold = 0 if rng.random() < p_yes else 1
        logit = np.log(p_yes / (1 - p_yes)) * sharpness
        shown = 1 / (1 + np.exp(-logit))
        masses = [[0.9 * shown, 0.9 * (1 - shown)]]
        rows.append(Readout(name, f"{name}-{i}", "q", "noul", signature(QUESTION), masses, masses, gold))
    return rows


def test_the_variant_is_read_from_a_shipped_files_words():
    assert ShippedVariant.parse("names: raw, temperature") == ShippedVariant("names", "raw", ("bias",))
    parsed = ShippedVariant.parse("raw, features, yes bias, prior weight")
    assert parsed.reading == "letters" and parsed.use[-2:] == ("yes_bias", "prior_weight")


def test_posted_labels_bring_an_off_default_to_its_set_and_k0_is_the_default():
    sets = {
        name: {"train": readouts(name, 200, s, seed), "held_out": readouts(name, 400, s, seed + 100)}
        for seed, (name, s) in enumerate((("mild", 1.0), ("sharp", 3.0), ("sharper", 5.0)))
    }
    questions = {name: {(r.example, r.question): QUESTION for split in splits.values() for r in split}
                 for name, splits in sets.items()}  # fmt: skip
    variants = {"noul": ShippedVariant("letters", "raw", ("bias",))}
    report = simulate(sets, questions, variants, "1", ks=(0, 50, 200), seeds=2)
    fitted = defaults(sets, variants)
    for name, entry in report.items():
        default = [max(p.probabilities) for p in fitted[name]["held_out"]]
        assert entry["K"][0]["n"] == len(default) == 400
        if name != "sharp":  # the default fitted on the other two is off for the outer sets (sharp is between)
            assert entry["K"][200]["ece"] < entry["K"][0]["ece"] - 0.02, name
        assert entry["K"][200]["ece"] <= entry["K"][200]["floor90"] + 0.03, name
        assert set(entry["stream"]) == {"batch", "predicted temperature"}
    assert all(v["accuracy"] for v in verdicts(report).values())  # a temperature never moves a top answer
