"""A user simulated on recorded readouts: what feedback (gold answers posted back) does for a task the shipped
default has never seen, leave-one-set-out, with no model run.

For each labeled set S, as a new user's task:
1. the default: the shipped file's variant (`ShippedVariant`, its base and features per kind) fitted on every other
   set's train split, as `offline.shipped` fits it; what the user gets before any label (K = 0);
2. the user's stream: S's train answers in a seeded random order (traffic does not arrive sorted by class); the
   first K are posted as feedback to the model a server serves from labels (`typedlm.calibrate.out_of_fold`: five
   fold models, each the server's `Learner` fitted without one fold, on the default's probabilities, keyed by the
   question as the server keys it);
3. S's held-out answers scored through it (the fold models' mean, as served): accuracy, log loss, ECE, and the ECE
   floor (the 90th percentile of what a perfectly calibrated model with those confidences would measure on that many
   answers).
Averaged over `SEEDS` orders. Beside it, two label-free references on the same held-out answers (`stream`): batch
calibration (the mean probability of each answer over the family's unlabeled stream divided out) and a temperature
predicted from the stream's statistics, fitted leave-one-set-out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from typedlm.calibrate.calibration import CALIBRATOR_FEATURES
from typedlm.calibrate.learning import Sample, question_keys
from typedlm.calibrate.out_of_fold import OutOfFold
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import Question
from typedlm.offline.fitting import fit_calibrators, fit_temperature
from typedlm.offline.loso import answers_of, calibrated, set_weights
from typedlm.offline.metrics import Prediction, ece_floor, summarize
from typedlm.offline.readouts import Readout

KS = (0, 10, 25, 50, 100, 200)
SEEDS = 5
TARGET_MARGIN = 0.02  # K = 50: ECE ≤ floor90 + this on every set
ACCURACY_SLACK = 0.01  # K = 50: accuracy ≥ raw − this on every set

_USES = {
    "temperature": ("bias",),
    "features": CALIBRATOR_FEATURES,
    "temperature, yes bias": ("bias", "yes_bias"),
    "features, yes bias": (*CALIBRATOR_FEATURES, "yes_bias"),
}


@dataclass(frozen=True)
class ShippedVariant:
    """A kind's calibration as a shipped file names it ("names: raw, features, yes bias"): how its choices are read,
    its base method and the calibrator's features."""

    reading: str
    base: str
    use: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> ShippedVariant:
        reading, _, rest = text.rpartition(": ")
        base, _, label = rest.partition(", ")
        prior = label.endswith(", prior weight")
        use = _USES[label.removesuffix(", prior weight")]
        return cls(reading or "letters", base, (*use, *("prior_weight",) * prior))


def summary_of(predictions: Sequence[Prediction]) -> dict[str, float]:
    overall = summarize(predictions)["overall"]
    return {
        "n": len(predictions),
        "accuracy": overall["accuracy"],
        "nll": overall["nll"],
        "ece": overall["ece"],
        "floor90": ece_floor(predictions)["p90"],
    }


def mean_of(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {key: float(np.mean([row[key] for row in rows])) for key in rows[0]}


def defaults(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    variants: Mapping[str, ShippedVariant],
    balanced: bool = True,
    reads: int = 1,
) -> dict[str, dict[str, list[Prediction]]]:
    """Per set, per split: its answers through the default fitted on every other set's train split."""
    bases = {kind: v.base for kind, v in variants.items()}
    uses = {kind: v.use for kind, v in variants.items()}
    train = {name: answers_of(splits["train"], bases, reads) for name, splits in readouts.items()}
    weights = set_weights(train) if balanced else {name: [1.0] * len(a) for name, a in train.items()}
    out = {}
    for name, splits in readouts.items():
        others = [a for other, answers in train.items() if other != name for a in answers]
        other_weights = [w for other, ws in weights.items() if other != name for w in ws]
        kinds = {a.kind for a in others}
        calibrators = fit_calibrators(
            others, {k: u for k, u in uses.items() if k in kinds}, {k: b for k, b in bases.items() if k in kinds},
            other_weights,
        )  # fmt: skip
        out[name] = {split: calibrated(answers_of(rows, bases, reads), calibrators) for split, rows in splits.items()}
    return out


def stream_orders(n: int, k: int, seeds: int) -> list[np.ndarray]:
    """The first `k` of `n` train answers in each of `seeds` seeded random orders (one order at K = 0: nothing is
    posted, so every order gives the same)."""
    return [np.random.default_rng(seed).permutation(n)[:k] for seed in range(seeds if k else 1)]


def samples_of(rows: Sequence[Readout], predictions: Sequence[Prediction], bases, reads: int) -> list[Sample]:
    answers = answers_of(rows, bases, reads)
    return [
        Sample(tuple(p.probabilities), a.mass, a.disagreement, p.gold)
        for a, p in zip(answers, predictions, strict=True)
    ]


def labeled_sets(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    questions: Mapping[str, Mapping[tuple[str, str], Question]],
    fitted: Mapping[str, Mapping[str, Sequence[Prediction]]],
    bases: Mapping[str, str],
    prompt_version: str,
    reads: int = 1,
) -> Iterator[tuple[str, tuple[dict[str, list[dict[str, str]]], list[Sample], list[Sample]]]]:
    """Per set, as a new user's task: each split's questions' keys (as the server keys labels), and its train and
    held-out answers as the learner sees them, through the default fitted without the set (`fitted`: `defaults`)."""
    for name, splits in readouts.items():
        keys = {
            split: [question_keys(questions[name][(r.example, r.question)], prompt_version) for r in rows]
            for split, rows in splits.items()
        }
        train = samples_of(splits["train"], fitted[name]["train"], bases, reads)
        held = samples_of(splits["held_out"], fitted[name]["held_out"], bases, reads)
        yield name, (keys, train, held)


def simulate(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    questions: Mapping[str, Mapping[tuple[str, str], Question]],
    variants: Mapping[str, ShippedVariant],
    prompt_version: str,
    ks: Sequence[int] = KS,
    seeds: int = SEEDS,
    balanced: bool = True,
    reads: int = 1,
) -> dict[str, Any]:
    """The learning curve of every set (see the module): {set: {"raw": ..., "K": {k: summary}, "stream": ...}}.
    `questions[set][(example id, question id)]`: each readout's question, for the learner's keys."""
    bases = {kind: v.base for kind, v in variants.items()}
    fitted = defaults(readouts, variants, balanced, reads)
    report: dict[str, Any] = {}
    for name, (keys, train, held) in labeled_sets(readouts, questions, fitted, bases, prompt_version, reads):
        splits = readouts[name]
        raw = calibrated(answers_of(splits["held_out"], CalibrationMethod.RAW, reads), {})
        curve = {}
        for k in ks:
            runs = []
            for order in stream_orders(len(train), k, seeds):
                folds = OutOfFold()
                folds.add((position, keys["train"][i], train[i], None, True) for position, i in enumerate(order))
                predictions = []
                for r, key, s in zip(splits["held_out"], keys["held_out"], held, strict=True):
                    probs = folds.answer(key, r.kind, s.probs, s.mass, s.disagreement).probs
                    predictions.append(Prediction(r.kind, tuple(probs), s.gold, s.mass))
                runs.append(summary_of(predictions))
            curve[k] = mean_of(runs)
        report[name] = {"raw": summary_of(raw), "K": curve, "stream": {"batch": summary_of(batch_calibrated(
            splits["held_out"], held, keys["held_out"]))}}  # fmt: skip
    for name, entry in stream_temperature(readouts, fitted, questions, prompt_version, bases, reads).items():
        report[name]["stream"]["predicted temperature"] = entry
    return report


def batch_calibrated(rows: Sequence[Readout], samples: Sequence[Sample], keys: Sequence[dict[str, str]]):
    """Batch calibration on the unlabeled stream: per exact question, the mean of its answers' probabilities over
    the stream is divided out of each (a per-answer bias estimated without a label), then renormalised."""
    by_question: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_question.setdefault(key["exact"], []).append(i)
    out: list[Prediction | None] = [None] * len(samples)
    for members in by_question.values():
        mean = np.mean([samples[i].probs for i in members], axis=0)
        for i in members:
            p = np.asarray(samples[i].probs) / np.maximum(mean, 1e-12)
            out[i] = Prediction(rows[i].kind, tuple((p / p.sum()).tolist()), samples[i].gold, samples[i].mass)
    return out


def _stream_features(samples: Sequence[Sample]) -> np.ndarray:
    """A stream's statistics: mean log raw mass, mean and spread of the top probability, mean normalised entropy."""
    top = np.asarray([max(s.probs) for s in samples])
    entropy = np.asarray([-sum(p * math.log(max(p, 1e-12)) for p in s.probs) / math.log(len(s.probs)) for s in samples])
    mass = np.log(np.maximum([s.mass for s in samples], 1e-12))
    return np.asarray([1.0, mass.mean(), top.mean(), top.std(), entropy.mean()])


def stream_temperature(readouts, fitted, questions, prompt_version, bases, reads) -> dict[str, dict[str, float]]:
    """A temperature for a set's answers predicted from its stream's statistics (`_stream_features`), by a ridge
    regression of each other set's own best log temperature (fitted on its train split) on its statistics; scored
    on the set's held-out answers. Leave-one-set-out: the set's own labels are never used."""
    sets = list(readouts)
    train = {n: samples_of(readouts[n]["train"], fitted[n]["train"], bases, reads) for n in sets}
    held = {n: samples_of(readouts[n]["held_out"], fitted[n]["held_out"], bases, reads) for n in sets}
    features = {n: _stream_features(held[n]) for n in sets}
    best = {
        n: math.log(fit_temperature([np.asarray(s.probs) for s in train[n]], [s.gold for s in train[n]])) for n in sets
    }
    out = {}
    for name in sets:
        others = [n for n in sets if n != name]
        x = np.stack([features[n] for n in others])
        y = np.asarray([best[n] for n in others])
        w = np.linalg.solve(x.T @ x + 1.0 * np.eye(x.shape[1]), x.T @ y)
        temperature = math.exp(float(features[name] @ w))
        predictions = []
        for r, s in zip(readouts[name]["held_out"], held[name], strict=True):
            logits = np.log(np.maximum(s.probs, 1e-12)) / temperature
            p = np.exp(logits - logits.max())
            predictions.append(Prediction(r.kind, tuple((p / p.sum()).tolist()), s.gold, s.mass))
        out[name] = {**summary_of(predictions), "temperature": temperature}
    return out


def verdicts(report: Mapping[str, Any], k: int = 50) -> dict[str, dict[str, bool]]:
    """Per set, whether K = `k` meets the targets: ECE ≤ floor90 + `TARGET_MARGIN`, accuracy ≥ raw − slack."""
    out = {}
    for name, entry in report.items():
        at = entry["K"][k]
        out[name] = {
            "ece": at["ece"] <= at["floor90"] + TARGET_MARGIN,
            "accuracy": at["accuracy"] >= entry["raw"]["accuracy"] - ACCURACY_SLACK,
        }
    return out
