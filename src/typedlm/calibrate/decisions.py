"""An answer's set and its abstention, from its question's labels: which level speaks for it, and what it says.

    decisions = Decisions(out_of_fold)
    decisions.answer_set(keys, probs, coverage=0.9)     # AnswerSet: answer indexes, level, labels, guarantee
    decisions.selective(keys, confidence, min_accuracy=0.95)   # Selective: abstain or not, the certificate

Mondrian by level: of a question's levels (exact → family → kind, `typedlm.calibrate.learning`), the most specific
with enough fair labels speaks for it. For a set, enough is `settled_labels(α)` (34 at α = 0.1), and where no level
has that many, the most labeled one with at least `labels_needed(α)` (9 at α = 0.1); for a certificate,
`CERTIFY_MIN_LABELS`. Within a level, split conformal unless its stream has drifted so that adaptive conformal
inference measures better (`guarantees.prefer_online`); the set then says its guarantee is long-run. A level's
quantile and certificate are computed once per label count and kept (`MAX_CACHED` of them), so that answering costs
a lookup.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from typedlm.calibrate.guarantees import (
    DELTA,
    ONLINE_WINDOW,
    Certificate,
    answer_set,
    certify,
    labels_needed,
    online_quantile,
    prefer_online,
    split_quantile,
)
from typedlm.calibrate.learning import LEVELS
from typedlm.calibrate.out_of_fold import OutOfFold
from typedlm.core.answers import Answer
from typedlm.core.questions import Handover, Question

SETTLED_SD = 0.05  # a level's labels settle its coverage once the Beta law's spread is within this (see below)
CERTIFY_MIN_LABELS = 20  # the fewest fair labels a level certifies from (fewer: the next level, or abstain)
MAX_CACHED = 4096  # quantiles and certificates kept


@dataclass(frozen=True)
class SetRule:
    """How one level gives sets at one miss rate: the quantile, on whose scores, the guarantee and its labels."""

    q: float
    default: bool  # the default calibration's scores and probabilities (else the learned calibration's)
    guarantee: str  # "finite-sample" or "long-run"
    labels: int


def settled_labels(alpha: float) -> int:
    """The labels from which a level's sets are its own: split conformal's coverage given n labels spreads by
    about √(α(1−α)/(n+2)) (the Beta law's standard deviation), within `SETTLED_SD` from this many on (34 at
    α = 0.1). A more specific level with fewer labels has a guarantee too, but one that varies more from one set
    of labels to another than its parent's, so the parent speaks until then."""
    return math.ceil(alpha * (1 - alpha) / SETTLED_SD**2 - 2)


@dataclass(frozen=True)
class AnswerSet:
    """An answer set: its answers' indexes, the coverage asked for, and what it rests on."""

    answers: list[int]
    coverage: float
    labels: int
    level: str  # the level whose labels gave it; "default" where none has enough
    guarantee: str  # "finite-sample" (split conformal), "long-run" (adaptive), "none" (every answer)
    scores: str  # whose probabilities the set is read from: "feedback" (learned), "default", "none"

    def to_wire(self, names: Sequence[Any]) -> dict[str, Any]:
        return {
            "answers": [names[i] for i in self.answers],
            "coverage": self.coverage,
            "labels": self.labels,
            "level": self.level,
            "guaranteed": self.guarantee == "finite-sample",
            "guarantee": self.guarantee,
            "scores": self.scores,
        }


@dataclass(frozen=True)
class Selective:
    """Whether an answer abstains, and the certificate it was held to (None: no level certifies one)."""

    abstain: bool
    level: str
    certificate: Certificate | None

    def threshold_wire(self) -> dict[str, Any] | None:
        c = self.certificate
        if c is None:
            return None
        return {
            "confidence": c.confidence,
            "labels": c.labels,
            "right": c.right,
            "level": self.level,
            "min_accuracy": c.min_accuracy,
            "delta": c.delta,
        }


class Decisions:
    """Answer sets and abstentions read from an `OutOfFold`'s scores (see the module). Thread-safe."""

    def __init__(self, out_of_fold: OutOfFold):
        self.out_of_fold = out_of_fold
        self._cache: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def _cached(self, key: tuple, compute):
        key = (*key, *self.out_of_fold.state)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        value = compute()
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            self._cache[key] = value
        return value

    def _rule(self, level: str, key: str, alpha: float) -> SetRule | None:
        """How a level gives sets at miss rate α (None: too few labels). Split conformal on the scores that give the
        smaller sets on its labels, the learned calibration's out of fold or the default's; adaptive conformal
        inference instead where the stream has drifted (`prefer_online`)."""

        def compute() -> SetRule | None:
            scored = self.out_of_fold.scored(level, key)
            if scored is None or len(scored) < labels_needed(alpha):
                return None
            rules = []
            for default, scores in ((False, scored.scores), (True, scored.default_scores)):
                if prefer_online(scores.tolist(), alpha):
                    q, guarantee, n = (
                        online_quantile(scores.tolist(), alpha),
                        "long-run",
                        min(len(scored), ONLINE_WINDOW),
                    )
                else:
                    q, guarantee, n = split_quantile(scores, alpha), "finite-sample", len(scored)
                rules.append((scored.mean_size(q, default), SetRule(q, default, guarantee, n)))
            return min(rules, key=lambda rule: rule[0])[1]  # ties: the learned calibration's

        return self._cached(("set", level, key, alpha), compute)

    def answer_set(
        self, keys: dict[str, str], probs: Sequence[float], base: Sequence[float], coverage: float
    ) -> AnswerSet:
        """The set for `coverage` (1 − α) of an answer whose probabilities are `probs` (the default's: `base`), from
        the most specific level with enough labels."""
        alpha = 1.0 - coverage
        # which level speaks, from the levels' label counts alone: only that level's rule is computed
        counts = {level: self._count(level, keys[level]) for level in LEVELS}
        held = [level for level in LEVELS if counts[level] >= labels_needed(alpha)]
        settled = [level for level in held if counts[level] >= settled_labels(alpha)]
        if held:
            # the most specific settled, else the most labeled (of equals, the most specific)
            level = settled[0] if settled else max(held, key=counts.__getitem__)
            rule = self._rule(level, keys[level], alpha)
            if rule is not None:
                answers = answer_set(base if rule.default else probs, rule.q)
                scores = "default" if rule.default else "feedback"
                return AnswerSet(answers, coverage, rule.labels, level, rule.guarantee, scores)
        return AnswerSet(list(range(len(probs))), coverage, 0, "default", "none", "none")

    def _count(self, level: str, key: str) -> int:
        """The fair labels a level holds, counted once per label count. A rule's labels are this count, or the
        online variant's window where that is smaller, which is never below a settled count (at most 98, at
        α = 0.5): so the counts choose the level as the rules would."""
        return self._cached(("count", level, key), lambda: self.out_of_fold.count(level, key))

    def _certificate(self, level: str, key: str, target: float) -> tuple[Certificate | None, int]:
        def compute():
            scored = self.out_of_fold.scored(level, key)
            n = 0 if scored is None else len(scored)
            if n < CERTIFY_MIN_LABELS:
                return None, n
            return certify(scored.confidence, scored.correct, target, DELTA), n

        return self._cached(("certify", level, key, target), compute)

    def selective(self, keys: dict[str, str], confidence: float, min_accuracy: float) -> Selective:
        """Whether an answer of this `confidence` abstains: not where the most specific level with enough labels
        certifies a threshold at or below it."""
        for level in LEVELS:
            certificate, n = self._certificate(level, keys[level], min_accuracy)
            if n >= CERTIFY_MIN_LABELS:
                keep = certificate is not None and confidence >= certificate.confidence - 1e-12
                return Selective(not keep, level, certificate)
        return Selective(True, "default", None)


def hand_over(
    question: Question,
    answer: Answer,
    probs: Sequence[float],
    base: Sequence[float],
    keys: dict[str, str] | None,
    decisions: Decisions | None,
    handover: Handover,
) -> Answer:
    """`answer` (probabilities `probs`; the default's `base`) with what `handover` asks: its set (`x_set`) and
    whether it abstains (`x_abstain`, `x_threshold`). Without `decisions` (no labels: no feedback database, or a
    request answered by another calibration than the one labels were scored under) the set is every answer and
    every answer abstains, and they say so."""
    extras = dict(answer.extras)
    if handover.coverage is not None:
        chosen = (
            decisions.answer_set(keys, probs, base, handover.coverage)
            if decisions is not None and keys is not None
            else AnswerSet(list(range(len(probs))), handover.coverage, 0, "default", "none", "none")
        )
        extras["set"] = chosen.to_wire(question.answer_keys())
    if handover.min_accuracy is not None:
        confidence = max(probs)
        selective = (
            decisions.selective(keys, confidence, handover.min_accuracy)
            if decisions is not None and keys is not None
            else Selective(True, "default", None)
        )
        extras["abstain"] = selective.abstain
        extras["threshold"] = selective.threshold_wire()
    return dataclasses.replace(answer, extras=extras)
