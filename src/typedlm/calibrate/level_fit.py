"""One level's calibrator as numbers (see `typedlm.calibrate.learning` for the levels): the two variants' logits and
their Jacobian in θ, the maximum a posteriori fit by damped Gauss-Newton, and the variant chosen by cross-validation.
Plain numpy, no model, no storage.

Contract:
- `as_rows(probs, mass, disagreement, gold)` gives answers of one size n as the model reads them (`Rows`).
- `fit(kind, variant, groups, biased, shrink, start, platt)` gives the θ minimising λ/2·|θ|² plus the cross-entropy
  to the labels (or to Platt's `targets`), from `start` (0: change nothing), in at most `NEWTON_STEPS` steps.
- `choose_variant(kind, groups, biasable, shrinks)` gives (variant, biased, λ) with the lowest `CV_FOLDS`-fold
  cross-validated log loss; ties go to the first.
- `LevelFit` is a fitted level, immutable: it takes one answer (`apply`) or rows of one size (`apply_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from typedlm.calibrate.calibration import CALIBRATOR_FEATURES, FLOOR, LOG_T_BOUNDS
from typedlm.core.names import Kind

SHRINK = 10.0  # λ: the prior's weight, in labels' worth of log loss curvature (see `learning`'s docstring)
SHRINKS = (10.0, 1.0, 0.1)  # the weights cross-validation chooses among, with the variant
CV_FOLDS = 5
VARIANTS = ("scale", "features")
NEWTON_STEPS = 25


@dataclass(frozen=True)
class LevelFit:
    """A level's fitted calibrator: its variant, parameters and the labels it was fitted on."""

    kind: str
    variant: str
    theta: tuple[float, ...]
    labels: int
    biased: bool  # whether it has a bias per answer (or on yes for noul)

    def apply(self, probs: Sequence[float], mass: float, disagreement: float) -> list[float]:
        """`probs` through this level."""
        return self.apply_rows(np.asarray([probs], dtype=np.float64), np.asarray([mass]), np.asarray([disagreement]))[
            0
        ].tolist()

    def apply_rows(self, probs: np.ndarray, mass: np.ndarray, disagreement: np.ndarray) -> np.ndarray:
        """Answers of one size through this level: probabilities [N, n], raw masses [N], disagreements [N]."""
        rows = as_rows(probs, mass, disagreement)
        return softmax(_logits(self.kind, self.variant, np.asarray(self.theta), self.biased, rows))


# ---- the model: logits and their Jacobian in θ, for samples of one size n -------------------------------------


@dataclass
class Rows:
    """Samples of one size n as arrays: log probabilities [N, n], features [N, d], gold [N]."""

    log_p: np.ndarray
    phi: np.ndarray
    gold: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def as_rows(probs: np.ndarray, mass: np.ndarray, disagreement: np.ndarray, gold: np.ndarray | None = None) -> Rows:
    """Answers of one size as the model reads them; the features are `calibration.calibrator_features`'s, computed
    for all rows at once."""
    n = probs.shape[1]
    safe = np.where(probs > 0, probs, 1.0)
    entropy = -(probs * np.log(safe)).sum(axis=1) / math.log(n)
    phi = np.stack(
        [np.ones(len(probs)), np.log(np.maximum(mass, FLOOR)), entropy, np.full(len(probs), math.log(n)), disagreement],
        axis=1,
    )
    log_p = np.log(np.maximum(probs, FLOOR))
    return Rows(log_p, phi, gold if gold is not None else np.zeros(0, dtype=np.int64))


def _bias_size(kind: str, n: int, biased: bool) -> int:
    if not biased:
        return 0
    return 1 if kind == Kind.NOUL else n


def _size(kind: str, variant: str, n: int, biased: bool) -> int:
    return (1 if variant == "scale" else len(CALIBRATOR_FEATURES)) + _bias_size(kind, n, biased)


def _scales(variant: str, theta: np.ndarray, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's 1/T [N] and whether its log T is inside the bounds (else its gradient is 0) [N]."""
    log_t = np.full(len(rows.log_p), -theta[0]) if variant == "scale" else rows.phi @ theta[: rows.phi.shape[1]]
    inside = (log_t > LOG_T_BOUNDS[0]) & (log_t < LOG_T_BOUNDS[1])
    return np.exp(-np.clip(log_t, *LOG_T_BOUNDS)), inside


def _logits(kind: str, variant: str, theta: np.ndarray, biased: bool, rows: Rows) -> np.ndarray:
    scale, _ = _scales(variant, theta, rows)
    logits = rows.log_p * scale[:, None]
    k = _size(kind, variant, rows.log_p.shape[1], False)
    if biased:
        if kind == Kind.NOUL:
            logits[:, 0] += theta[k]
        else:
            logits += theta[k:]
    return logits


def _jacobian(kind: str, variant: str, theta: np.ndarray, biased: bool, rows: Rows) -> np.ndarray:
    """d logits / d θ: [N, n, P]."""
    n_rows, n = rows.log_p.shape
    scale, inside = _scales(variant, theta, rows)
    jac = np.zeros((n_rows, n, len(theta)))
    scaled = rows.log_p * (scale * inside)[:, None]  # d logits / d(−log T)
    if variant == "scale":
        jac[:, :, 0] = scaled  # θ0 = −log T
        k = 1
    else:
        k = rows.phi.shape[1]
        jac[:, :, :k] = -scaled[:, :, None] * rows.phi[:, None, :]
    if biased:
        if kind == Kind.NOUL:
            jac[:, 0, k] = 1.0
        else:
            jac[:, np.arange(n), k + np.arange(n)] = 1.0
    return jac


def softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of logits [N, n] → probabilities [N, n]."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def targets(gold: np.ndarray, n: int) -> np.ndarray:
    """Platt's targets (Platt 1999, "Probabilistic outputs for support vector machines") made the same for every
    answer [N, n]: each of N labels aims at (N + 1) / (N + 2) on its gold answer and shares the rest equally among
    the others, Laplace's rule of succession for "this label's answer is right". Labels that all give one answer
    (22 of 22, a rare answer not yet seen) then teach "very likely" (23/24), never "certain"; with many labels the
    targets are the labels themselves. Platt's own targets count each answer's labels apart, (N_c + 1) / (N_c + 2),
    which aims a rare answer's labels lower and so moves top answers toward the common one: these do not."""
    on_gold = (len(gold) + 1.0) / (len(gold) + 2.0)
    out = np.full((len(gold), n), (1.0 - on_gold) / max(n - 1, 1))
    out[np.arange(len(gold)), gold] = on_gold
    return out


def _aims(rows: Rows, platt: bool) -> np.ndarray:
    """What a fit aims each label's probabilities at: Platt's `targets`, or with `platt` False the labels."""
    n = rows.log_p.shape[1]
    if platt:
        return targets(rows.gold, n)
    out = np.zeros((len(rows.gold), n))
    out[np.arange(len(rows.gold)), rows.gold] = 1.0
    return out


def _loss(
    kind: str,
    variant: str,
    theta: np.ndarray,
    biased: bool,
    groups: Sequence[Rows],
    shrink: float,
    aims: Sequence[np.ndarray],
) -> float:
    """The shrinkage term plus the cross-entropy to what the fit aims at (`_aims`, one array per group); with the
    labels as aims and no shrinkage, the gold answers' log loss (how cross-validation scores a fit)."""
    total = 0.5 * shrink * float(theta @ theta)
    for rows, aim in zip(groups, aims):
        logits = _logits(kind, variant, theta, biased, rows)
        top = logits.max(axis=1)
        log_p = logits - (top + np.log(np.exp(logits - top[:, None]).sum(axis=1)))[:, None]
        total -= float((aim * log_p).sum())
    return total


def fit(
    kind: str,
    variant: str,
    groups: Sequence[Rows],
    biased: bool,
    shrink: float = SHRINK,
    start: np.ndarray | None = None,
    platt: bool = False,
) -> np.ndarray:
    """θ minimising the level's log loss plus the shrinkage term, by damped Gauss-Newton from `start` (0: no
    change). `groups`: the level's samples, one `Rows` per size n (a bias per answer needs one size)."""
    size = _size(kind, variant, groups[0].log_p.shape[1], biased)
    theta = np.zeros(size) if start is None or len(start) != size else np.array(start, dtype=np.float64)
    aims = [_aims(rows, platt) for rows in groups]  # the same at every step
    loss = _loss(kind, variant, theta, biased, groups, shrink, aims)
    for _ in range(NEWTON_STEPS):
        grad, hess = shrink * theta, shrink * np.eye(size)
        for rows, aim in zip(groups, aims):
            jac = _jacobian(kind, variant, theta, biased, rows)
            probs = softmax(_logits(kind, variant, theta, biased, rows))
            residual = probs - aim
            grad = grad + np.einsum("inp,in->p", jac, residual)
            weighted = np.einsum("inp,in->ip", jac, probs)
            hess = hess + np.einsum("inp,in,inq->pq", jac, probs, jac) - weighted.T @ weighted
        step = np.linalg.solve(hess, -grad)
        scale = 1.0
        while scale > 1e-4:
            trial = theta + scale * step
            trial_loss = _loss(kind, variant, trial, biased, groups, shrink, aims)
            if trial_loss <= loss:
                break
            scale /= 2
        else:
            break
        theta, improvement, loss = trial, loss - trial_loss, trial_loss
        if improvement < 1e-7 * max(1.0, abs(loss)):
            break
    return theta


# ---- a level's variant and λ, chosen by cross-validation ---------------------------------------------------


def _subset(rows: Rows, keep: np.ndarray) -> Rows:
    return Rows(rows.log_p[keep], rows.phi[keep], rows.gold[keep])


def choose_variant(
    kind: str, groups: Sequence[Rows], biasable: bool, shrinks: Sequence[float] = SHRINKS
) -> tuple[str, bool, float]:
    """The variant, with or without its bias where a bias is possible, and the prior's weight λ among `shrinks`,
    with the lowest cross-validated log loss on these labels (folds by position: `CV_FOLDS`; ties go to the
    first, so list λ from the strongest). A bias moves top answers, so it must earn its place: labels that say
    nothing about one answer being favoured leave it out, and accuracy with it."""
    splits = []  # (train, test, the test labels as aims) per fold, the same for every candidate
    for fold in range(CV_FOLDS):
        folds = [np.arange(len(rows.gold)) % CV_FOLDS == fold for rows in groups]
        train = [_subset(rows, ~f) for rows, f in zip(groups, folds) if (~f).any()]
        test = [_subset(rows, f) for rows, f in zip(groups, folds) if f.any()]
        if train and test:
            splits.append((train, test, [_aims(rows, False) for rows in test]))
    losses = {}
    for variant in VARIANTS:
        for biased in (False, True) if biasable else (False,):
            for shrink in shrinks:
                losses[(variant, biased, shrink)] = sum(
                    _loss(kind, variant, fit(kind, variant, train, biased, shrink, platt=True), biased, test, 0, aims)
                    for train, test, aims in splits
                )
    return min(losses, key=losses.__getitem__)
