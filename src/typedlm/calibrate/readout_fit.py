"""One readout as numbers (see `typedlm.calibrate.readout` for where readouts are learned): its features whitened,
its weights fitted, its temperature, and the gate that says whether it is used at all. Plain numpy, no storage.

The model: log p'(a) = (log p(a) + w_a · x(features)) / T + const, p the calibrated probabilities, x the level's
features centred and whitened on its own labels, cut to the first k principal components, T a temperature fitted on
the cross-validated predictions (the prior's shrinkage leaves a readout less sure than it is right). Fitted by
maximum a posteriori with a Gaussian prior centred on "no change" (w = 0, strength λ): Böhning's bound makes each
step a fixed-step gradient step (the whitened features' Gram matrix is N·I), accelerated.

The gate (`choose`), whenever a level's label count doubles from `MIN_READOUT_LABELS` on: the whole procedure is
scored by nested cross-validation. In each of `FOLDS` outer folds, k, λ (among `COMPONENTS` × `SHRINKS`) and T are
chosen by `INNER_FOLDS`-fold cross-validation on the other folds' labels alone and the readout fitted there
predicts the fold; calibration alone gets a temperature fitted on the same labels, so a temperature that mends the
calibration is no gain of the readout's. The readout is used only where its held-out log loss is below that
base's by more than `MARGIN_Z` standard errors, its accuracy not below it, and its ECE not above the base's or
within what sampling alone gives an honest model with its confidences (`ECE_QUANTILE` of `floor_eces`): answers
made more right must not be made less honest. Where it passes, k, λ and T are chosen by `FOLDS`-fold
cross-validation on every label. Noise features passed it in 11 of 2,400 draws (scripts/readout_gate_simulation.py,
docs/results/readout-gate.json).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from typedlm.calibrate.level_fit import softmax
from typedlm.calibrate.reliability import ece, floor_eces

COMPONENTS = (4, 16, 64)  # principal components a readout may read
SHRINKS = (2.0, 8.0, 32.0, 128.0)  # the prior's strength λ
FOLDS = 5  # the gate's outer folds, and the served variant's selection
INNER_FOLDS = 4  # the selection's folds inside each outer fold's training labels
VARIANTS = tuple((k, s) for k in COMPONENTS for s in SHRINKS)
ECE_QUANTILE = 0.9  # of an honest model's ECEs (`floor_eces`): what sampling alone allows a readout
MARGIN_Z = 1.64  # how many standard errors of the out-of-fold gain a readout must win by (one-sided 95%)
MAX_STEPS = 300
TOLERANCE = 1e-5
FLOOR = 1e-12


TEMPERATURES = np.exp(np.linspace(-1.5, 1.5, 61))  # the readout's temperature, chosen on its out-of-fold output


@dataclass(frozen=True)
class Whitening:
    """Features centred and whitened on a level's labels: x = (f − mean) @ basis, [k] with unit variance there."""

    mean: np.ndarray  # [d]
    basis: np.ndarray  # [d, k]

    @classmethod
    def of(cls, features: np.ndarray, components: int) -> Whitening:
        return cls.full(features).cut(components)

    @classmethod
    def full(cls, features: np.ndarray) -> Whitening:
        """Every principal component the features have (those of non-negligible spread), most spread first."""
        mean = features.mean(axis=0)
        centred = features - mean  # [N, d]
        # the components from the smaller Gram matrix: [d, d] where N > d; else [N, N], whose eigenvectors u give
        # the components' directions centredᵀ·u / √spread² (cheaper than an SVD of [N, d] either way)
        rows = len(features) < features.shape[1]
        spread2, vectors = np.linalg.eigh(centred @ centred.T if rows else centred.T @ centred)
        order = np.argsort(spread2)[::-1]
        spread2, vectors = np.maximum(spread2[order], 0.0), vectors[:, order]
        kept = int(np.sum(spread2 > spread2[0] * 1e-8)) if len(spread2) and spread2[0] > 0 else 0
        spread2 = spread2[:kept]
        directions = centred.T @ vectors[:, :kept] / np.sqrt(spread2) if rows else vectors[:, :kept]  # [d, kept]
        return cls(mean, directions * (math.sqrt(len(features)) / np.sqrt(spread2)))

    def cut(self, components: int) -> Whitening:
        """The first `components` of these."""
        return Whitening(self.mean, self.basis[:, :components])

    def __call__(self, features: np.ndarray) -> np.ndarray:
        return (features - self.mean) @ self.basis


def temperature(logits: np.ndarray, gold: np.ndarray) -> float:
    """The T among `TEMPERATURES` with the least log loss of softmax(logits / T) [N, n] on gold [N]."""
    losses = [_losses(softmax(logits / t), gold).mean() for t in TEMPERATURES]
    return float(TEMPERATURES[int(np.argmin(losses))])


def fit_weights(offsets: np.ndarray, x: np.ndarray, gold: np.ndarray, shrink: float) -> np.ndarray:
    """MAP weights [n, k] of log p' = offsets + x·wᵀ (offsets [N, n]: calibrated log-probabilities; x [N, k]
    whitened on these N rows, so xᵀx = N·I) under the prior N(0, 1/λ): Böhning's bound ½·N·(I − 11ᵀ/n) + λ on the
    Hessian gives the fixed step, Nesterov's momentum the pace."""
    n, k = offsets.shape[1], x.shape[1]
    weights = np.zeros((n, k))
    if k == 0:
        return weights
    onehot = np.eye(n)[gold]
    step = 1.0 / (0.5 * len(x) + shrink)
    previous, ahead = weights, weights
    for t in range(1, MAX_STEPS + 1):
        probs = softmax(offsets + x @ ahead.T)
        gradient = (probs - onehot).T @ x + shrink * ahead
        weights = ahead - step * gradient
        if np.abs(weights - previous).max() < TOLERANCE:
            break
        ahead = weights + (t - 1) / (t + 2) * (weights - previous)
        previous = weights
    return weights


@dataclass(frozen=True)
class ReadoutFit:
    """A level's learned readout, folded into one affine map of the features (whitening, then weights):
    corrected logits = log p + features @ matrix + bias, then the temperature; and what it was fitted with."""

    matrix: np.ndarray  # [d, n]: basis @ weightsᵀ
    bias: np.ndarray  # [n]: −mean @ matrix
    labels: int
    components: int
    shrink: float
    temperature: float = 1.0

    @classmethod
    def fit(
        cls,
        offsets: np.ndarray,
        features: np.ndarray,
        gold: np.ndarray,
        components: int,
        shrink: float,
        temperature: float = 1.0,
        whitened: Whitening | None = None,
    ) -> ReadoutFit:
        """The readout of these labels (`whitened`: their features' `Whitening.full`, where already computed)."""
        whitening = (whitened or Whitening.full(features)).cut(components)
        weights = fit_weights(offsets, whitening(features), gold, shrink)
        matrix = whitening.basis @ weights.T
        return cls(matrix, -whitening.mean @ matrix, len(gold), components, shrink, temperature)

    @property
    def dims(self) -> int:
        """The features' dimensions it reads."""
        return self.matrix.shape[0]

    def logits(self, log_probs: np.ndarray, features: np.ndarray) -> np.ndarray:
        """Calibrated log-probabilities [N, n] and features [N, d] → the corrected logits before the temperature."""
        return log_probs + features @ self.matrix + self.bias

    def apply_rows(self, log_probs: np.ndarray, features: np.ndarray) -> np.ndarray:
        """Calibrated log-probabilities [N, n] and features [N, d] → corrected probabilities [N, n]."""
        return softmax(self.logits(log_probs, features) / self.temperature)

    def apply(self, probs: Sequence[float], features: np.ndarray) -> list[float]:
        """One answer's calibrated probabilities and its features [d] → its corrected probabilities (one matrix
        product; the rest, a few answers' arithmetic, in Python: an answer's step costs microseconds)."""
        shift = (features @ self.matrix + self.bias).tolist()
        logits = [math.log(max(p, FLOOR)) + s for p, s in zip(probs, shift, strict=True)]
        top = max(logits)
        exp = [math.exp((z - top) / self.temperature) for z in logits]
        total = sum(exp)
        return [e / total for e in exp]


def _losses(probs: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Each label's log loss [N] under probabilities [N, n]."""
    return -np.log(np.maximum(probs[np.arange(len(gold)), gold], FLOOR))


def _variant_logits(offsets: np.ndarray, features: np.ndarray, gold: np.ndarray, folds: np.ndarray) -> list[np.ndarray]:
    """Each variant's (`VARIANTS`, in order) out-of-fold logits [N, n] before its temperature, folds [N] each
    label's fold: every fold predicted by the readout fitted on the others."""
    out = [np.zeros_like(offsets) for _ in VARIANTS]
    for f in np.unique(folds):
        train, test = folds != f, folds == f
        whitened = Whitening.full(features[train])  # once per fold, cut to each k
        for logits, (components, shrink) in zip(out, VARIANTS, strict=True):
            fitted = ReadoutFit.fit(offsets[train], features[train], gold[train], components, shrink, whitened=whitened)
            logits[test] = fitted.logits(offsets[test], features[test])
    return out


def _select(offsets: np.ndarray, features: np.ndarray, gold: np.ndarray, folds: np.ndarray) -> tuple[int, float, float]:
    """The (components, λ, temperature) whose out-of-fold predictions (folds [N]) have the least log loss, each
    variant's temperature fitted on its own out-of-fold logits."""
    best: tuple[float, int, float, float] | None = None
    for (components, shrink), logits in zip(VARIANTS, _variant_logits(offsets, features, gold, folds), strict=True):
        t = temperature(logits, gold)
        loss = float(_losses(softmax(logits / t), gold).mean())
        if best is None or loss < best[0]:
            best = (loss, components, shrink, t)
    assert best is not None, "no variant to select"
    return best[1:]


def _nested(offsets: np.ndarray, features: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The readout's and the base's probabilities [N, n] for each label, each from the other folds' labels alone
    (`FOLDS` folds, label i in fold i mod FOLDS): there the readout's (components, λ, temperature) selected by
    `INNER_FOLDS`-fold cross-validation and fitted, the base's temperature fitted (calibration alone has no other
    parameter to fit): so the selection is scored with the readout, and the temperature is no gain of its own."""
    fold = np.arange(len(gold)) % FOLDS
    readout, base = np.zeros_like(offsets), np.zeros_like(offsets)
    for f in range(FOLDS):
        train, test = fold != f, fold == f
        inner = np.arange(int(train.sum())) % INNER_FOLDS
        chosen = _select(offsets[train], features[train], gold[train], inner)
        fitted = ReadoutFit.fit(offsets[train], features[train], gold[train], *chosen)
        readout[test] = fitted.apply_rows(offsets[test], features[test])
        base[test] = softmax(offsets[test] / temperature(offsets[train], gold[train]))
    return readout, base


def _earns(readout: np.ndarray, base: np.ndarray, gold: np.ndarray, margin_z: float) -> bool:
    """Whether held-out probabilities [N, n] of the readout beat the base's: log loss lower by more than `margin_z`
    standard errors of the labels' paired differences, accuracy not lower, and ECE within the base's or within what
    sampling alone gives an honest model with the readout's confidences (`ECE_QUANTILE` of `floor_eces`)."""
    gain = _losses(base, gold) - _losses(readout, gold)
    if gain.mean() <= margin_z * gain.std() / math.sqrt(len(gain)):
        return False
    right, base_right = readout.argmax(axis=1) == gold, base.argmax(axis=1) == gold
    if right.mean() < base_right.mean():
        return False
    sure = readout.max(axis=1)
    allowed = max(ece(base.max(axis=1), base_right), float(np.quantile(floor_eces(sure), ECE_QUANTILE)))
    return ece(sure, right) <= allowed


def choose(
    offsets: np.ndarray, features: np.ndarray, gold: np.ndarray, margin_z: float = MARGIN_Z
) -> tuple[int, float, float] | None:
    """The (components, λ, temperature) of the readout to serve on these labels, or None where none earns its place.

    The gate scores the whole procedure out of fold (`_nested`: selection among `VARIANTS` and the temperature
    included) against calibration alone (`offsets`) given a temperature fitted the same way (`_earns`). Where it
    passes, the variant served is the one `FOLDS`-fold cross-validation selects on every label."""
    readout, base = _nested(offsets, features, gold)
    if not _earns(readout, base, gold, margin_z):
        return None
    return _select(offsets, features, gold, np.arange(len(gold)) % FOLDS)
