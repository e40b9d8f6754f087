"""The readout simulation on synthetic readouts whose features tell the answer and whose label masses do not."""

from __future__ import annotations

import numpy as np

from typedlm.calibrate.calibration import signature
from typedlm.calibrate.projection import encode
from typedlm.core.questions import NoulQuestion
from typedlm.offline.readout_simulation import margin_score, simulate, validation_splits, verdicts
from typedlm.offline.readouts import Readout
from typedlm.offline.simulation import ShippedVariant

QUESTION = NoulQuestion("Is it about a payment?")


def readouts(name: str, n: int, seed: int) -> list[Readout]:
    rng = np.random.default_rng(seed)
    direction = np.random.default_rng(0).standard_normal(16)
    rows = []
    for i in range(n):
        gold = int(rng.integers(0, 2))
        features = rng.standard_normal(16) + (1.5 if gold == 0 else -1.5) * direction / np.linalg.norm(direction)
        shown = 0.5 + rng.normal(0, 0.05)  # the label masses know nothing
        masses = [[0.9 * shown, 0.9 * (1 - shown)]]
        rows.append(
            Readout(
                name, f"{name}-{i}", "q", "noul", signature(QUESTION), masses, masses, gold, features=encode(features)
            )
        )
    return rows


def test_a_readout_learns_what_the_features_hold_and_validation_splits_keep_held_out_apart():
    sets = {name: {"train": readouts(name, 200, seed), "held_out": readouts(name, 200, seed + 10)}
            for seed, name in enumerate(("one", "two"))}  # fmt: skip
    questions = {name: {(r.example, r.question): QUESTION for split in splits.values() for r in split}
                 for name, splits in sets.items()}  # fmt: skip
    variants = {"noul": ShippedVariant("letters", "raw", ("bias",))}
    report = simulate(sets, questions, variants, "1", ks=(0, 100), seeds=2)
    for entry in report.values():
        assert entry["features"] and entry["n"] == 200
        assert entry["K"][0]["readout"] == entry["K"][0]["calibrated"] and entry["K"][0]["learned_share"] == 0
        assert entry["K"][100]["readout"]["accuracy"] > entry["K"][100]["calibrated"]["accuracy"] + 0.2
    assert all(v["never_worse"] for v in verdicts(report, k=100).values())
    assert margin_score(report, (100,))["mean_gain"] > 0.2
    split = validation_splits(sets)
    for name, parts in split.items():
        train, scored = {r.example for r in parts["train"]}, {r.example for r in parts["held_out"]}
        assert not train & scored and len(scored) == 80 and train | scored == {r.example for r in sets[name]["train"]}
