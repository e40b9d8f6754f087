"""What a learned readout adds to calibration alone, checked by a simulated user on readouts recorded with features
(no model run).

For each labeled set S, as a new user's task (as `offline.simulation`: the default fitted leave-one-set-out):
1. S's train answers in a seeded random order; the first K are posted to the model a server serves from labels
   (`typedlm.calibrate.out_of_fold`: five fold models, each a learner and its readouts from the labels' features,
   `typedlm.calibrate.readout`);
2. every held-out answer through the fold models' learners alone, and through them with the readouts in force for
   its question (where one has earned its place in a fold: otherwise the same answer), each the fold models' mean;
3. measured, for both: accuracy, log loss, ECE and its noise floor (p90), and the share of held-out answers a learned
   readout answered (in any fold). Averaged over `SEEDS` orders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from typedlm.calibrate.out_of_fold import FOLDS, OutOfFold
from typedlm.calibrate.projection import decode
from typedlm.calibrate.readout import Readouts
from typedlm.calibrate.readout_fit import MARGIN_Z
from typedlm.core.questions import Question
from typedlm.offline.metrics import Prediction
from typedlm.offline.readouts import Readout
from typedlm.offline.simulation import ShippedVariant, defaults, labeled_sets, mean_of, stream_orders, summary_of

KS = (0, 25, 50, 100, 200, 400)
SEEDS = 5
GAIN = 0.03  # the target: accuracy at K = 200 at least this far above calibration alone's...
SLACK = 0.01  # ...and never more than this below it
VALIDATION_SHARE = 0.4  # of a set's train examples, scored when the readout's settings are chosen (`validation_splits`)
MARGINS = (0.5, 1.0, 1.64, 2.33)  # the margins compared there


def _features(rows: Sequence[Readout]) -> list[np.ndarray | None]:
    return [None if r.features is None else decode(r.features) for r in rows]


def simulate(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    questions: Mapping[str, Mapping[tuple[str, str], Question]],
    variants: Mapping[str, ShippedVariant],
    prompt_version: str,
    ks: Sequence[int] = KS,
    seeds: int = SEEDS,
    margin_z: float = MARGIN_Z,
) -> dict[str, Any]:
    """{set: {"n": held-out answers, "features": whether they were recorded, "K": {k: {"calibrated": summary,
    "readout": summary, "learned_share": ...}}}}."""
    bases = {kind: v.base for kind, v in variants.items()}
    fitted = defaults(readouts, variants, True, 1)
    report: dict[str, Any] = {}
    for name, (keys, train, held) in labeled_sets(readouts, questions, fitted, bases, prompt_version):
        train_features, held_features = (_features(readouts[name][split]) for split in ("train", "held_out"))
        curve = {}
        for k in ks:
            calibrated_runs, readout_runs, shares = [], [], []
            for order in stream_orders(len(train), k, seeds):
                folds = OutOfFold(readouts=Readouts(FOLDS, margin_z=margin_z))
                folds.add(
                    (position, keys["train"][i], train[i], train_features[i], True) for position, i in enumerate(order)
                )
                folds.settle()
                alone, corrected, used = [], [], 0
                for r, key, s, features in zip(readouts[name]["held_out"], keys["held_out"], held, held_features):
                    probs = folds.answer(key, r.kind, s.probs, s.mass, s.disagreement).probs
                    served = folds.answer(key, r.kind, s.probs, s.mass, s.disagreement, features)
                    used += served.readouts > 0
                    alone.append(Prediction(r.kind, tuple(probs), s.gold, s.mass))
                    corrected.append(Prediction(r.kind, tuple(served.probs), s.gold, s.mass))
                calibrated_runs.append(summary_of(alone))
                readout_runs.append(summary_of(corrected))
                shares.append(used / len(held))
            curve[k] = {
                "calibrated": mean_of(calibrated_runs),
                "readout": mean_of(readout_runs),
                "learned_share": float(np.mean(shares)),
            }
        report[name] = {"n": len(held), "features": all(f is not None for f in train_features), "K": curve}
    return report


def validation_splits(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]], share: float = VALIDATION_SHARE
) -> dict[str, dict[str, list[Readout]]]:
    """Each set's train split cut in two by example, at random (seeded: a file's examples may come sorted by class):
    `1 − share` of them the stream, the rest scored as "held_out"; for choosing the readout's settings without
    looking at held-out data."""
    out = {}
    for name, splits in readouts.items():
        examples = list(dict.fromkeys(r.example for r in splits["train"]))
        order = np.random.default_rng(0).permutation(len(examples))
        scored = {examples[i] for i in order[round(len(examples) * (1 - share)) :]}
        train = [r for r in splits["train"] if r.example not in scored]
        out[name] = {"train": train, "held_out": [r for r in splits["train"] if r.example in scored]}
    return out


def margin_score(report: Mapping[str, Any], ks: Sequence[int]) -> dict[str, float]:
    """A margin's record on a report: the mean accuracy gain over sets and `ks`, and the worst cell's."""
    gaps = [
        entry["K"][k]["readout"]["accuracy"] - entry["K"][k]["calibrated"]["accuracy"]
        for entry in report.values()
        for k in ks
    ]
    return {"mean_gain": float(np.mean(gaps)), "worst": float(min(gaps))}


def verdicts(report: Mapping[str, Any], k: int = 200) -> dict[str, dict[str, bool]]:
    """Per set: accuracy at K = `k` at least `GAIN` above calibration alone's ("gain"), and never more than `SLACK`
    below it at any K ("never_worse")."""
    out = {}
    for name, entry in report.items():
        curve = entry["K"]
        gaps = [c["readout"]["accuracy"] - c["calibrated"]["accuracy"] for c in curve.values()]
        at_k = curve.get(k) or curve.get(str(k))
        out[name] = {
            "gain": at_k is not None and at_k["readout"]["accuracy"] - at_k["calibrated"]["accuracy"] >= GAIN,
            "never_worse": min(gaps) >= -SLACK,
        }
    return out
