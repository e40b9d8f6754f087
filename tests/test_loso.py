"""Leave-one-set-out: the calibrator is fitted without the set it is scored on, and it fixes what it can learn."""

from __future__ import annotations

import numpy as np

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
