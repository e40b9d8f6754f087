"""Decisions a team can hand over, as numbers: answer sets with a coverage guarantee and answers that abstain unless
labels certify them. Plain numpy and math, no model, no storage.

Every function here takes a level's out-of-fold record (`Scored`): for each fair label, what a calibrator fitted
without that label answered (`typedlm.calibrate.out_of_fold`). Scores from a fit that saw the label are optimistic
(it has learned that very answer), so they never come here.

    split_quantile(scores, alpha)      # split conformal (LAC): the ⌈(n+1)(1−α)⌉-th smallest score, or None
    answer_set(probs, q)               # the answers whose score 1 − p is within q
    online_alpha(scores, alpha)        # adaptive conformal inference over the label stream: the α to use now
    certify(confidence, correct, target, delta)   # the lowest confidence threshold whose answers are right at
                                                  # least `target` of the time, at confidence 1 − δ, or None

Split conformal (Vovk et al. 2005; Lei et al. 2018) with the least-ambiguous-set score 1 − p(gold) (Sadinle et al.
2019): for n exchangeable labels and a new answer from the same traffic, the set holds the right answer with
probability at least 1 − α, and the probability conditional on the n labels follows Beta(k, n + 1 − k), k =
⌈(n+1)(1−α)⌉. Adaptive conformal inference (Gibbs & Candès 2021) moves α after each label by γ(α − miss) and holds
the long-run miss rate near α for any stream, drifting or not, with no promise for one answer. Selective answers
test, from the most confident threshold down, "answers at this confidence or above are right less than `target` of
the time" by the exact binomial tail and stop at the first that is not rejected at δ: fixed-sequence testing, so
the threshold returned is certified at confidence 1 − δ whichever it is (Learn then Test, Angelopoulos et al. 2021).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ONLINE_GAMMA = 0.02  # adaptive conformal inference's step (a few hundred labels, not tens of thousands: larger
# than the paper's 0.005 so that it moves within a stream a team labels)
ONLINE_WINDOW = 200  # the latest scores its quantile is taken over, so that it follows a drift
DELTA = 0.1  # a selective answer's certificate holds with probability 1 − DELTA
THRESHOLDS = tuple(round(0.99 - 0.01 * i, 2) for i in range(50))  # 0.99 down to 0.50, tested in this order


@dataclass(frozen=True)
class Scored:
    """A level's fair labels as the fold models that did not see them answered them, oldest first: each label's
    score 1 − p(gold) [n], its top answer's probability [n] and whether that answer was right [n], every answer's
    probability, and each label's fold [n] (of `fold_count`)."""

    scores: np.ndarray
    confidence: np.ndarray
    correct: np.ndarray
    answers: np.ndarray  # every answer's probability of every label, one label after another [Σ answers]
    folds: np.ndarray
    fold_count: int = 1

    def mean_size(self, q: float | None) -> float:
        """The mean size of these labels' own sets at quantile q (their number of answers where q is None)."""
        if q is None:
            return len(self.answers) / len(self.scores)
        return float((1.0 - self.answers <= q + 1e-12).sum() / len(self.scores))

    def by_fold(self) -> tuple[np.ndarray, ...]:
        """Each fold's labels' scores, sorted (what `cv_plus_set` counts against)."""
        return tuple(np.sort(self.scores[self.folds == f]) for f in range(self.fold_count))

    def __len__(self) -> int:
        return len(self.scores)


def quantile_rank(n: int, alpha: float) -> int | None:
    """k = ⌈(n+1)(1−α)⌉, the rank of the score split conformal takes among n, or None where k > n (too few labels
    for any finite quantile: the set must be every answer)."""
    k = math.ceil((n + 1) * (1 - alpha) - 1e-9)
    return k if k <= n else None


def labels_needed(alpha: float) -> int:
    """The fewest labels for which split conformal at miss rate α gives a set smaller than every answer."""
    return math.ceil((1 - alpha) / alpha - 1e-9)


def split_quantile(scores: np.ndarray, alpha: float) -> float | None:
    """The k-th smallest score (`quantile_rank`), or None with too few."""
    k = quantile_rank(len(scores), alpha)
    return None if k is None else float(np.partition(np.asarray(scores), k - 1)[k - 1])


def answer_set(probs: Sequence[float], q: float | None) -> list[int]:
    """The indexes of the answers whose score 1 − p is within `q`: every answer where q is None or +inf, none where
    q is −inf (the online variant's quantile once its α_t reaches 1; `decisions` then keeps the top answer alone),
    and possibly none for a finite q (no answer as likely as the labels' right answers were)."""
    if q is None:
        return list(range(len(probs)))
    return [i for i, p in enumerate(probs) if 1.0 - p <= q + 1e-12]


def cv_plus_set(by_fold: np.ndarray, fold_scores: Sequence[np.ndarray], rank: int | None) -> list[int]:
    """CV+ (Barber et al. 2021; for classification, Romano, Sesia & Candès 2020): the answers y of a new question
    for which fewer than `rank` labels have a score below the new question's own score 1 − p_f(y) under the fold
    model f that scored that label: y is in where Σ_f #{i in fold f: R_i < 1 − p_f(y)} < rank. `by_fold`: the new
    answer's probabilities under each fold model [K, n]; `fold_scores`: each fold's labels' scores, sorted; `rank`:
    ⌈(n+1)(1−α)⌉ (None: too few labels, every answer). With one model for every fold this is split conformal."""
    n = by_fold.shape[1]
    if rank is None:
        return list(range(n))
    below = np.zeros(n, dtype=np.int64)
    for probs, scores in zip(by_fold, fold_scores, strict=True):
        below += np.searchsorted(scores, 1.0 - probs - 1e-12, side="left")  # [n]: labels scored below each y's
    return np.flatnonzero(below < rank).tolist()


def cv_plus_floor(n: int, alpha: float, folds: int) -> float:
    """The coverage CV+ is proven to give at miss rate α with n labels in `folds` folds, for any fitting method:
    1 − 2α − min(2(1 − 1/K)/(n/K + 1), (1 − K/n)/(K + 1)) (Barber et al. 2021, for K-fold CV+). In practice it
    covers about 1 − α (measured: docs/handover.md); this is what holds whatever the fit does."""
    k = folds
    return max(0.0, 1 - 2 * alpha - min(2 * (1 - 1 / k) / (n / k + 1), (1 - k / n) / (k + 1)))


def _window_quantile(window: list[float], alpha_t: float) -> float:
    """The ⌈(m+1)(1−α_t)⌉-th smallest of a sorted window of m scores: +inf (every answer) where that rank is past
    the window or α_t ≤ 0, −inf (the top answer alone) where α_t ≥ 1."""
    if alpha_t >= 1:
        return -math.inf
    if alpha_t <= 0 or not window:
        return math.inf
    k = math.ceil((len(window) + 1) * (1 - alpha_t) - 1e-9)
    return window[k - 1] if k <= len(window) else math.inf


def online_run(
    scores: Sequence[float], alpha: float, gamma: float = ONLINE_GAMMA, window: int = ONLINE_WINDOW
) -> tuple[float, np.ndarray]:
    """Adaptive conformal inference over a stream of scores in label order: at each label the set is the quantile
    at 1 − α_t of the `window` scores before it, a miss is its score above it, and α_{t+1} = α_t + γ(α − miss).
    Returns the α to use for the next answer and each label's miss [n]."""
    alpha_t, recent, sorted_recent = alpha, [], []
    misses = np.zeros(len(scores), dtype=bool)
    for t, score in enumerate(scores):
        misses[t] = score > _window_quantile(sorted_recent, alpha_t)
        alpha_t += gamma * (alpha - misses[t])
        recent.append(score)
        bisect.insort(sorted_recent, score)
        if len(recent) > window:
            sorted_recent.pop(bisect.bisect_left(sorted_recent, recent.pop(0)))
    return alpha_t, misses


def online_quantile(scores: Sequence[float], alpha: float) -> float:
    """The quantile adaptive conformal inference gives the next answer (see `online_run`)."""
    alpha_t, _ = online_run(scores, alpha)
    window = sorted(scores[-ONLINE_WINDOW:])
    return _window_quantile(window, alpha_t)


def split_misses(scores: Sequence[float], alpha: float) -> np.ndarray:
    """Each label's miss had split conformal on every label before it given its set (the first ones, with too few
    before them, never miss): how split conformal did on this stream, to set beside `online_run`."""
    misses = np.zeros(len(scores), dtype=bool)
    seen: list[float] = []
    for t, score in enumerate(scores):
        k = quantile_rank(len(seen), alpha)
        misses[t] = k is not None and score > seen[k - 1]
        bisect.insort(seen, score)
    return misses


def prefer_online(scores: Sequence[float], alpha: float, recent: int = ONLINE_WINDOW) -> bool:
    """Whether the stream has drifted so that the online variant measures better: over its latest `recent` labels,
    split conformal's miss rate is further from α than the online variant's by more than two binomial standard
    deviations (without a drift both sit near α, and the split guarantee, which holds for each answer, is kept)."""
    if len(scores) < 2 * labels_needed(alpha):
        return False
    _, online = online_run(scores, alpha)
    split = split_misses(scores, alpha)
    m = min(recent, len(scores) // 2)
    noise = 2 * math.sqrt(alpha * (1 - alpha) / m)
    return abs(split[-m:].mean() - alpha) > abs(online[-m:].mean() - alpha) + noise


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), exact, summed in log space (n up to the thousands at once)."""
    if k <= 0 or p >= 1:
        return 1.0
    if k > n or p <= 0:
        return 0.0
    j = np.arange(k, n + 1)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    terms = log_fact[n] - log_fact[j] - log_fact[n - j] + j * math.log(p) + (n - j) * math.log1p(-p)
    top = terms.max()
    return float(min(1.0, math.exp(top) * np.exp(terms - top).sum()))


def clopper_pearson_lower(n: int, right: int, delta: float) -> float:
    """The exact (Clopper-Pearson) one-sided lower bound at confidence 1 − δ on the rate of rightness behind `right`
    of `n`: the p at which P(X ≥ right | Binomial(n, p)) = δ (0 where right is 0), by bisection."""
    if right <= 0:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if binomial_tail(n, right, middle) > delta:
            high = middle
        else:
            low = middle
    return low


@dataclass(frozen=True)
class Certificate:
    """A top-probability threshold certified: answers whose top probability is `confidence` or above were right
    `right` of `labels` times, and are right at least `min_accuracy` of the time with probability 1 − `delta`;
    `lower_bound` is the exact lower bound at 1 − δ on their rate of rightness (at least `min_accuracy`)."""

    confidence: float
    labels: int
    right: int
    min_accuracy: float
    delta: float
    lower_bound: float  # computed once, with the certificate (`certify`): answers read it, never recompute it


def certify(
    confidence: np.ndarray,
    correct: np.ndarray,
    target: float,
    delta: float = DELTA,
    thresholds: Sequence[float] = THRESHOLDS,
) -> Certificate | None:
    """The lowest threshold of `thresholds` (tested from the highest down, stopping at the first not certified)
    whose labels at or above it reject "right less than `target` of the time" at level δ; None where the first
    tested already fails (every answer abstains). A threshold with too few labels above it to be certified even
    were they all right (target^n > δ) is passed over untested: which thresholds those are depends on the
    labels' confidences alone, never on whether they were right, so the sequence tested is still fixed before
    any outcome is seen."""
    confidence, correct = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=bool)
    best = None
    for tau in thresholds:
        chosen = confidence >= tau - 1e-12
        n, right = int(chosen.sum()), int(correct[chosen].sum())
        if target**n > delta:
            continue  # too few labels this confident to certify it even were all right: not tested, nothing spent
        if binomial_tail(n, right, target) > delta:
            break
        best = (tau, n, right)
    if best is None:
        return None
    tau, n, right = best
    return Certificate(tau, n, right, target, delta, clopper_pearson_lower(n, right, delta))


def automated_share(confidence: np.ndarray, certificate: Certificate | None) -> float:
    """The share of these labels' answers a certificate lets through (0 without one)."""
    if certificate is None or len(confidence) == 0:
        return 0.0
    return float((np.asarray(confidence) >= certificate.confidence - 1e-12).mean())
