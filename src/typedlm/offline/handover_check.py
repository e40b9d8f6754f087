"""The hand-over's guarantees checked where the truth is known: a model whose reads are a known distortion of true
answer probabilities, served through the feedback calibrator a decider uses (`FeedbackCalibrator.answer` and
`hand_over`, the fold models learning labels as a server's feedback service feeds them), over many independent draws
of labels. No language model runs: the subject is the calibration layer, and here every answer's true probability of
being right is known, so a set's coverage and a certificate's accuracy are computed exactly, not estimated.

    report = check(Task(answers=2, readout=True), draws=500)

A task (`Task`): each answer has true logits z ~ N(0, `SPREAD`²) over its `answers` options, its gold drawn from
softmax(z); the model reads masses ∝ exp(z/`temperature` + noise) (over-confident at 0.6), so the default calibration
is wrong in a way labels can teach; with `readout`, each read also has features that hold z (a few dimensions, plus
noise), which a learned readout can use and the label masses cannot. Per draw: `labels` fresh answers posted as fair
labels, then `answers_per_draw` fresh answers asked with x_coverage 1 − α and x_min_accuracy at each target:
- coverage: the mean over the asked answers of the true probability that the set holds the gold one; a draw
  under-covers below 1 − α − `UNDER` (theory's own share for split conformal at that many labels beside it:
  `beta_under_share`);
- a certificate is wrong where the answers it commits are right, by their true probabilities, less than the target
  of the time (judged on every draw that commits any);
- the online variant's switches: draws in which any set said "long-run" (the stream does not drift: each is a false
  switch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from typedlm.calibrate.calibrators import RawCalibrator
from typedlm.calibrate.feedback import FeedbackCalibrator
from typedlm.calibrate.out_of_fold import OutOfFold
from typedlm.calibrate.reads import Reads
from typedlm.core.questions import ChoiceQuestion, Handover, NoulQuestion, Question

SPREAD = 1.5
ALPHA = 0.1
TARGETS = (0.8, 0.9)
UNDER = 0.03
FEATURE_DIMS = 16
PROMPT_VERSION = "1"  # any wording: it only keys the labels


@dataclass(frozen=True)
class Task:
    answers: int = 2  # 2: a yes/no question; more: a choice with fixed options
    temperature: float = 0.6  # the model's reads' over-confidence
    read_noise: float = 0.5  # what the model's read gets wrong beyond its temperature (features know better)
    readout: bool = False  # reads carry features that hold the true logits

    def question(self) -> Question:
        if self.answers == 2:
            return NoulQuestion("Does it hold?")
        return ChoiceQuestion(tuple((f"option {i}", None) for i in range(self.answers)), "Which one?")

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, list[Reads], np.ndarray]:
        """n answers: their true probabilities [n, m], reads and gold answers [n]."""
        m = self.answers
        z = rng.normal(0.0, SPREAD, (n, m))  # [n, m]
        truth = np.exp(z - z.max(axis=1, keepdims=True))
        truth /= truth.sum(axis=1, keepdims=True)
        gold = (truth.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1)  # [n]
        read = z / self.temperature + rng.normal(0.0, self.read_noise, (n, m))
        masses = 0.9 * np.exp(read - read.max(axis=1, keepdims=True))
        masses /= masses.sum(axis=1, keepdims=True) / 0.9  # a raw mass of 0.9
        features = None
        if self.readout:  # z in the first m dimensions (noisy), noise in the rest
            features = rng.normal(0.0, 1.0, (n, FEATURE_DIMS))
            features[:, :m] += 3.0 * z  # z to within 1/3 per dimension: more than a noisy read holds
        reads = [
            Reads(
                "noul" if m == 2 else "choice",
                [masses[i].tolist()],
                features=None if features is None else features[i].astype(np.float16),
            )
            for i in range(n)
        ]
        return truth, reads, np.minimum(gold, m - 1)


def _draw(task: Task, seed: int, labels: int, answers_per_draw: int, alpha: float) -> dict[str, Any]:
    """One draw of labels posted to a fresh served model, then fresh answers asked (see the module)."""
    rng = np.random.default_rng(seed)
    question = task.question()
    calibrator = FeedbackCalibrator(RawCalibrator(), PROMPT_VERSION, OutOfFold())
    keys = calibrator.keys(question)
    _, reads, gold = task.draw(rng, labels)
    calibrator.out_of_fold.add(
        (i, keys, calibrator.sample(question, read, int(g)), read.features, True)
        for i, (read, g) in enumerate(zip(reads, gold))
    )
    calibrator.out_of_fold.settle()
    truth, reads, _ = task.draw(rng, answers_per_draw)
    names = question.answer_keys()
    coverage, switched, readout = [], False, 0
    committed: dict[float, list[float]] = {target: [] for target in TARGETS}
    for target in TARGETS:
        for true, read in zip(truth, reads):
            answer = calibrator.answer(question, read)
            handed = calibrator.hand_over(question, read, answer, Handover(1 - alpha, target)).to_wire()
            probs = question.wire_probabilities(handed)
            top = max(range(len(probs)), key=probs.__getitem__)
            if not handed["x_abstain"]:
                assert handed["x_threshold"]["answer"] == names[top], "the certified answer is the one shown"
                committed[target].append(float(true[top]))
            if target == TARGETS[0]:  # the set does not depend on the target
                chosen = handed["x_set"]
                assert names[top] in chosen["answers"], "the answer shown is in its set"
                coverage.append(float(sum(true[names.index(a)] for a in chosen["answers"])))
                switched |= chosen["guarantee"] == "long-run"
                readout += answer.extras.get("feedback", {}).get("readout") == "learned"
    return {
        "coverage": float(np.mean(coverage)),
        "switched": switched,
        "readout_share": readout / answers_per_draw,
        "committed": {target: (len(c), float(np.mean(c)) if c else None) for target, c in committed.items()},
    }


def beta_under_share(n: int, alpha: float, under: float = UNDER) -> float:
    """The share of draws of n labels in which split conformal itself covers below 1 − α − `under`: the Beta law's
    cdf there (its coverage given the labels is Beta(k, n + 1 − k), k = ⌈(n+1)(1−α)⌉)."""
    from scipy.stats import beta

    k = math.ceil((n + 1) * (1 - alpha) - 1e-9)
    return float(beta.cdf(1 - alpha - under, k, n + 1 - k))


def check(
    task: Task, draws: int, labels: int = 100, answers_per_draw: int = 400, alpha: float = ALPHA, seed: int = 0
) -> dict[str, Any]:
    """`draws` independent draws of `labels` labels on `task`: per-draw coverage, the share under-covering beside
    the theory's, certificates' wrong share per target, false switches to the online variant (see the module)."""
    runs = [_draw(task, seed * 100_003 + d, labels, answers_per_draw, alpha) for d in range(draws)]
    coverage = np.asarray([r["coverage"] for r in runs])
    selective = {}
    for target in TARGETS:
        cells = [r["committed"][target] for r in runs]
        judged = [accuracy for n, accuracy in cells if n]
        selective[str(target)] = {
            "draws_committing": len(judged),
            "wrong_draws": int(sum(accuracy < target for accuracy in judged)),
            "wrong_share": float(np.mean([accuracy < target for accuracy in judged])) if judged else None,
            "committed_share": float(np.mean([n for n, _ in cells]) / answers_per_draw),
            "committed_true_accuracy": float(np.mean(judged)) if judged else None,
        }
    return {
        "task": {**task.__dict__},
        "draws": draws,
        "labels": labels,
        "answers_per_draw": answers_per_draw,
        "alpha": alpha,
        "coverage_mean": float(coverage.mean()),
        "coverage_sd": float(coverage.std(ddof=1)),
        "under_share": float((coverage < 1 - alpha - UNDER).mean()),
        "theory_under_share": beta_under_share(labels, alpha),
        "switched_draws": int(sum(r["switched"] for r in runs)),
        "readout_share": float(np.mean([r["readout_share"] for r in runs])),
        "selective": selective,
    }
