"""An answer's set and its abstention, from its question's labels: which level speaks for it, and what it says.

    decisions = Decisions(out_of_fold)
    decisions.answer_set(keys, served, coverage=0.9)            # AnswerSet: answer indexes, level, labels, guarantee
    decisions.selective(keys, top_probability, min_accuracy=0.95)   # Selective: abstain or not, the certificate

Both read the answer the server shows (`out_of_fold.Served`: the fold models' answers and their mean), and the labels
as the same fold models scored them (`OutOfFold.scored`): the set is CV+'s over the fold models
(`guarantees.cv_plus_set`), with the top answer shown always in it (a set is never empty, and coverage can only
rise); the certificate is tested on the labels' top probabilities and held against the top probability shown, for
the top answer shown. No choice among scores is made on the labels a quantile uses: the scores are always the served
model's.

Mondrian by level: of a question's levels (exact → family → kind, `typedlm.calibrate.learning`), the most specific
with enough fair labels speaks for it. For a set, enough is `settled_labels(α)` (34 at α = 0.1), and where no level
has that many, the most labeled one with at least `labels_needed(α)` (9 at α = 0.1); which level speaks depends on
the levels' label counts alone, never on the labels' scores. For a certificate, `CERTIFY_MIN_LABELS`. Within a
level, CV+ unless its stream has drifted so that adaptive conformal inference measures better
(`guarantees.prefer_online`); the set then says its guarantee is long-run. That switch looks at the scores, so CV+'s
guarantee holds given that it was not taken only to within the switch's rate on a stream that does not drift (ε,
measured by simulation: P(cover | kept) ≥ (P(cover) − ε)/(1 − ε)). A level's rule and certificate are computed once
per label count and kept (`MAX_CACHED` of them), so that answering costs a lookup and a few binary searches.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from typedlm.calibrate.guarantees import (
    DELTA,
    ONLINE_WINDOW,
    Certificate,
    answer_set,
    certify,
    cv_plus_floor,
    cv_plus_set,
    labels_needed,
    online_quantile,
    prefer_online,
    quantile_rank,
)
from typedlm.calibrate.learning import LEVELS
from typedlm.calibrate.out_of_fold import OutOfFold, Served
from typedlm.core.answers import Answer
from typedlm.core.questions import Handover, Question

SETTLED_SD = 0.05  # a level's labels settle its coverage once the Beta law's spread is within this (see below)
CERTIFY_MIN_LABELS = 20  # the fewest fair labels a level certifies from (fewer: the next level, or abstain)
MAX_CACHED = 4096  # quantiles and certificates kept


@dataclass(frozen=True)
class SetRule:
    """How one level gives sets at one miss rate: CV+ over its folds' sorted scores at `rank`, or the online
    variant's quantile `q` on the answer shown; the guarantee and its labels."""

    guarantee: str  # "cv+" or "long-run"
    labels: int
    rank: int | None = None  # CV+: ⌈(n+1)(1−α)⌉
    fold_scores: tuple[np.ndarray, ...] = ()  # CV+: each fold's labels' scores, sorted
    q: float | None = None  # long-run: the quantile of 1 − p the shown answer is held to
    proven: float | None = None  # CV+: the coverage proven for any fit (`guarantees.cv_plus_floor`)

    def answers(self, served: Served) -> list[int]:
        """The set of a served answer, its top answer always in."""
        if self.guarantee == "long-run":
            chosen = answer_set(served.probs, self.q)
        else:
            chosen = cv_plus_set(served.by_fold, self.fold_scores, self.rank)
        top = max(range(len(served.probs)), key=served.probs.__getitem__)
        return chosen if top in chosen else sorted([*chosen, top])


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
    guarantee: str  # "cv+" (CV+ over the fold models), "long-run" (adaptive), "none" (every answer)
    proven: float | None = None  # CV+: the coverage proven whatever the fit (`guarantees.cv_plus_floor`)

    def to_wire(self, names: Sequence[Any]) -> dict[str, Any]:
        return {
            "answers": [names[i] for i in self.answers],
            "coverage": self.coverage,
            "labels": self.labels,
            "level": self.level,
            "guaranteed": self.guarantee == "cv+",
            "guarantee": self.guarantee,
            "proven_coverage": self.proven,
        }


@dataclass(frozen=True)
class Selective:
    """Whether an answer abstains, and the certificate it was held to (None: no level certifies one)."""

    abstain: bool
    level: str
    certificate: Certificate | None

    def threshold_wire(self, answer: Any) -> dict[str, Any] | None:
        """The certificate on the wire, with the answer it speaks of (`answer`: the top answer shown)."""
        c = self.certificate
        if c is None:
            return None
        return {
            "top_probability": c.confidence,
            "answer": answer,
            "labels": c.labels,
            "right": c.right,
            "lower_bound": round(c.lower_bound, 6),
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
        """How a level gives sets at miss rate α (None: too few labels): CV+ on its labels' out-of-fold scores,
        adaptive conformal inference instead where the stream has drifted (`prefer_online`)."""

        def compute() -> SetRule | None:
            scored = self.out_of_fold.scored(level, key)
            if scored is None or len(scored) < labels_needed(alpha):
                return None
            scores = scored.scores.tolist()
            if prefer_online(scores, alpha):
                return SetRule("long-run", min(len(scored), ONLINE_WINDOW), q=online_quantile(scores, alpha))
            n = len(scored)
            proven = cv_plus_floor(n, alpha, scored.fold_count)
            return SetRule("cv+", n, quantile_rank(n, alpha), scored.by_fold(), proven=proven)

        return self._cached(("set", level, key, alpha), compute)

    def answer_set(self, keys: dict[str, str], served: Served, coverage: float) -> AnswerSet:
        """The set for `coverage` (1 − α) of a served answer, from the most specific level with enough labels."""
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
                return AnswerSet(rule.answers(served), coverage, rule.labels, level, rule.guarantee, rule.proven)
        return AnswerSet(list(range(len(served.probs))), coverage, 0, "default", "none")

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

    def selective(self, keys: dict[str, str], top_probability: float, min_accuracy: float) -> Selective:
        """Whether an answer whose top probability (the one shown) is `top_probability` abstains: not where the most
        specific level with enough labels certifies a threshold at or below it."""
        for level in LEVELS:
            certificate, n = self._certificate(level, keys[level], min_accuracy)
            if n >= CERTIFY_MIN_LABELS:
                keep = certificate is not None and top_probability >= certificate.confidence - 1e-12
                return Selective(not keep, level, certificate)
        return Selective(True, "default", None)


def hand_over(
    question: Question,
    answer: Answer,
    served: Served,
    keys: dict[str, str] | None,
    decisions: Decisions | None,
    handover: Handover,
) -> Answer:
    """`answer` (the served answer `served` typed) with what `handover` asks: its set (`x_set`) and whether it
    abstains (`x_abstain`, `x_threshold`, which names the answer it certifies: the top answer shown). Without
    `decisions` (no labels: no feedback database, or a request answered by another calibration than the one labels
    were scored under) the set is every answer and every answer abstains, and they say so."""
    extras = dict(answer.extras)
    names = question.answer_keys()
    probs = served.probs
    if handover.coverage is not None:
        chosen = (
            decisions.answer_set(keys, served, handover.coverage)
            if decisions is not None and keys is not None
            else AnswerSet(list(range(len(probs))), handover.coverage, 0, "default", "none")
        )
        extras["set"] = chosen.to_wire(names)
    if handover.min_accuracy is not None:
        top = max(range(len(probs)), key=probs.__getitem__)
        selective = (
            decisions.selective(keys, probs[top], handover.min_accuracy)
            if decisions is not None and keys is not None
            else Selective(True, "default", None)
        )
        extras["abstain"] = selective.abstain
        extras["threshold"] = selective.threshold_wire(names[top])
    return dataclasses.replace(answer, extras=extras)
