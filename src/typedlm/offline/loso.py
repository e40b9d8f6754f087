"""Leave-one-set-out: how a calibration fitted on some labeled sets does on a set it has never seen.

For each set S: the feature calibrator (`calibration.feature_scaled`) is fitted on the train splits of every
other set and scored on the held-out split of S: what a user's new question gets. Beside it, on the same
held-out answers: raw, contextual, and the calibrator fitted on every train split including S's (in-set).
Two references show what "honest" can mean on a held-out split of a few hundred answers: the calibrator fitted on
S's own train split only (own set: the same kind of questions, labeled, which a user's new question never has), and
the ECE a perfectly calibrated model would measure with the left-out calibrator's confidences (`metrics.ece_floor`).
Everything is computed from recorded readouts (`readouts`), so no model runs here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from typedlm.calibrate.calibration import CALIBRATOR_FEATURES, calibrator_features, feature_scaled
from typedlm.core.names import CalibrationMethod, Kind
from typedlm.offline.coherence import coherence
from typedlm.offline.fitting import fit_calibrators
from typedlm.offline.metrics import Prediction, ece_floor, summarize
from typedlm.offline.readouts import Readout


class Answer(NamedTuple):
    """One recorded answer as a calibrator sees it."""

    kind: str
    probs: list[float]  # base probabilities
    mass: float  # raw mass
    disagreement: float  # share of order reads that disagree with the combined top answer
    gold: int
    prior: list[float] | None = None  # the content-free prior, combined like the base (for a prior weight)


def answers_of(readouts: Sequence[Readout], method: str | Mapping[str, str], reads: int | None = None) -> list[Answer]:
    """Each readout's base probabilities under `method` (one, or one per kind) from its first `reads` reads, with
    its features' inputs and its content-free prior."""
    return [
        Answer(r.kind, *r.base(method if isinstance(method, str) else method[r.kind], reads), r.gold, r.prior(reads))
        for r in readouts
    ]


def calibrated(answers: Sequence[Answer], calibrators: Mapping[str, dict[str, Any]]) -> list[Prediction]:
    """Predictions of answers through the calibrators (an answer of a kind without one keeps its base)."""
    out = []
    for a in answers:
        probs, params = a.probs, calibrators.get(a.kind)
        if params is not None:
            probs = feature_scaled(a.kind, probs, params, calibrator_features(probs, a.mass, a.disagreement), a.prior)
        out.append(Prediction(a.kind, tuple(probs), a.gold, a.mass))
    return out


def set_weights(answers: Mapping[str, Sequence[Answer]]) -> dict[str, list[float]]:
    """Per set, a weight per answer: 1 / (the set's answers of that kind), so every set that asks a kind weighs
    the same in that kind's fit (a set with ten times the answers would otherwise set the temperature alone)."""
    weights = {}
    for name, rows in answers.items():
        counts = Counter(a[0] for a in rows)
        weights[name] = [1.0 / counts[a[0]] for a in rows]
    return weights


def leave_one_set_out(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    base: str | Mapping[str, str] = CalibrationMethod.CONTEXTUAL,
    reads: int | None = 1,
    use: Sequence[str] | Mapping[str, Sequence[str]] = CALIBRATOR_FEATURES,
    scored: str = "held_out",
    balanced: bool = False,
) -> dict[str, dict[str, Any]]:
    """Per set: summaries (see `metrics.summarize`) on its `scored` split of raw, contextual, the calibrator fitted
    on every train split (in-set), on its own train split only (own set) and on the other sets' train splits (set
    left out), and the ECE floor of the last (`metrics.ece_floor`).
    `readouts[set]["train" | "held_out"]`; `use`: the calibrator's features. Variants are chosen with
    `scored="train"` (the left-out set's train split is still unseen by its calibrator) and reported on held_out.
    `base` and `use` may be given per kind (kind → method, kind → features): each kind then has its own variant.
    `balanced`: every set weighs the same in a fit, however many answers of a kind it has (`set_weights`)."""
    bases = None if isinstance(base, str) else base
    train = {name: answers_of(splits["train"], base, reads) for name, splits in readouts.items()}
    weights = set_weights(train) if balanced else {name: [1.0] * len(answers) for name, answers in train.items()}
    everything = fit_calibrators(
        [a for answers in train.values() for a in answers], use, bases, [w for ws in weights.values() for w in ws]
    )
    report = {}
    for name, splits in readouts.items():
        held_out = splits[scored]
        others = fit_calibrators(
            [a for other, answers in train.items() if other != name for a in answers],
            use,
            bases,
            [w for other, ws in weights.items() if other != name for w in ws],
        )
        base_answers = answers_of(held_out, base, reads)
        rows = {
            method: summarize(calibrated(answers_of(held_out, method, reads), {}))
            for method in (CalibrationMethod.RAW, CalibrationMethod.CONTEXTUAL)
        }
        rows["calibrated, in-set"] = summarize(calibrated(base_answers, everything))
        own = fit_calibrators(train[name], use, bases)
        rows["calibrated, own set"] = summarize(calibrated(base_answers, own))
        left_out = calibrated(base_answers, others)
        rows["calibrated, set left out"] = summarize(left_out)
        report[name] = {
            "rows": rows,
            "ece_floor": ece_floor(left_out),
            "calibrators": {"in-set": everything, "set left out": others, "own set": own},
        }
    return report


def yes_probabilities(
    readouts: Sequence[Readout],
    base: str | Mapping[str, str],
    calibrators: Mapping[str, dict[str, Any]],
    reads: int | None = 1,
) -> dict[tuple[str, str], float]:
    """P(yes) of every yes/no readout on `base` through `calibrators` (none: the base itself), keyed by (example
    id, question id), as `coherence.coherence` takes them."""
    predictions = calibrated(answers_of(readouts, base, reads), calibrators)
    return {(r.example, r.question): p.probabilities[0] for r, p in zip(readouts, predictions, strict=True)}


def left_out_negation(
    derived: Mapping[str, Sequence[Readout]],
    result: Mapping[str, Mapping[str, Any]],
    base: str | Mapping[str, str],
    reads: int | None = 1,
) -> dict[str, float]:
    """Per set with negation pairs among `derived` (readouts of `coherence.negations` of its train split): the mean
    |P(q) + P(not q) − 1| with the calibrator fitted without that set (`result`: `leave_one_set_out`'s)."""
    gaps = {}
    for name, rows in derived.items():
        rows = [r for r in rows if r.kind == Kind.NOUL]
        if name not in result or not rows:
            continue
        scores = coherence(yes_probabilities(rows, base, result[name]["calibrators"]["set left out"], reads))
        if "negation" in scores:
            gaps[name] = scores["negation"]["mean_gap"]
    return gaps
