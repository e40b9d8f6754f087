"""A readout learned from a question's labels: its calibrated answer corrected by a linear function of what the model
held at the decision row (the read's features: `typedlm.calibrate.projection`), zero until labels earn it.

    readouts = Readouts()
    readouts.add(learner, labeled)                 # (keys, sample, features) per label, once the learner has them
    probs, learned = readouts.apply(keys, kind, probs, features)

The learner (`typedlm.calibrate.learning`) makes a question's probabilities honest; what is right stays what the label
logits say. The hidden state at the decision row holds more than the label logits: a readout learns from it where
a question's answers mean the same from label to label (`readout_keys`, the most specific first):

    noul            at its family (type and instructions), where yes and no mean the same for every question
                    asked so, and at its kind (every yes/no question: "yes, it holds"), for questions whose family
                    has too few labels of its own (generated questions, each its own family)
    choice, score   at the exact question, up to `MAX_READOUT_ANSWERS` answers: options fixed, each answer its own
                    weights
    anything else   none: a family whose options change from question to question has no fixed answer to learn
                    weights for

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
cross-validation on every label; in between, it is refitted with them as labels come. Noise features passed in 11
of 2,400 simulated draws (scripts/readout_gate_simulation.py; docs/feedback.md).

Bounded: a level keeps its latest `MAX_READOUT_LABELS` labels, all levels together `MAX_READOUT_BYTES`.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from typedlm.calibrate.learning import Learner, Sample
from typedlm.calibrate.level_fit import softmax
from typedlm.calibrate.reliability import ece, floor_eces
from typedlm.core.names import Kind

MIN_READOUT_LABELS = 30  # a readout is considered from this many labels on
MAX_READOUT_ANSWERS = 64  # a choice or score learns a readout with at most this many answers
COMPONENTS = (4, 16, 64)  # principal components a readout may read
SHRINKS = (2.0, 8.0, 32.0, 128.0)  # the prior's strength λ
FOLDS = 5  # the gate's outer folds, and the served variant's selection
INNER_FOLDS = 4  # the selection's folds inside each outer fold's training labels
VARIANTS = tuple((k, s) for k in COMPONENTS for s in SHRINKS)
ECE_QUANTILE = 0.9  # of an honest model's ECEs (`floor_eces`): what sampling alone allows a readout
MARGIN_Z = 1.64  # how many standard errors of the out-of-fold gain a readout must win by (one-sided 95%)
MAX_READOUT_LABELS = 2048  # a level's latest labels
MAX_READOUT_BYTES = 32 * 2**20  # every level's labels together
REFIT_SHARE = 0.05  # between cross-validations, refitted once labels grew by this share (at least one)
MAX_STEPS = 300
TOLERANCE = 1e-5
FLOOR = 1e-12


TEMPERATURES = np.exp(np.linspace(-1.5, 1.5, 61))  # the readout's temperature, chosen on its out-of-fold output


def readout_keys(keys: dict[str, str], kind: str, answers: int) -> list[tuple[str, str]]:
    """The levels whose labels a question's readouts learn from, the most specific first (see the module)."""
    if kind == Kind.NOUL:
        return [("family", keys["family"]), ("kind", keys["kind"])]
    if answers <= MAX_READOUT_ANSWERS:
        return [("exact", keys["exact"])]
    return []


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
        # the components from the Gram matrix [d, d]: cheaper than an SVD of [N, d] where N > d
        spread2, directions = np.linalg.eigh((features - mean).T @ (features - mean))
        order = np.argsort(spread2)[::-1]
        spread2, directions = np.maximum(spread2[order], 0.0), directions[:, order]
        kept = int(np.sum(spread2 > spread2[0] * 1e-8)) if len(spread2) and spread2[0] > 0 else 0
        return cls(mean, directions[:, :kept] * (math.sqrt(len(features)) / np.sqrt(spread2[:kept])))

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


@dataclass
class _Level:
    """One readout level's labels (the latest), its chosen (components, λ) and when it was chosen and fitted."""

    answers: int
    keys: deque = field(default_factory=deque)  # each label's question keys (its learner calibration's)
    samples: deque = field(default_factory=deque)  # each label's `Sample`
    features: deque = field(default_factory=deque)  # each label's features [d] float16
    chosen: tuple[int, float, float] | None = None  # (components, λ, temperature)
    chosen_at: int = 0
    fitted_at: int = 0
    added: int = 0  # labels ever added (the latest are held)

    def offsets(self, learner: Learner) -> np.ndarray:
        """Each label's calibrated log-probabilities [N, n] as the learner gives them now (grouped by question)."""
        out = np.zeros((len(self.samples), self.answers))
        groups: dict[str, list[int]] = {}
        for i, keys in enumerate(self.keys):
            groups.setdefault(keys["exact"], []).append(i)
        for rows in groups.values():
            keys, samples = self.keys[rows[0]], [self.samples[i] for i in rows]
            probs = np.asarray([s.probs for s in samples])
            mass = np.asarray([s.mass for s in samples])
            disagreement = np.asarray([s.disagreement for s in samples])
            out[rows] = learner.calibrate_rows(keys, probs, mass, disagreement)
        return np.log(np.maximum(out, FLOOR))

    def refit(self, learner: Learner, margin_z: float = MARGIN_Z) -> tuple[bool, ReadoutFit | None]:
        """Choose again where the count doubled since the last choice, refit where it grew by `REFIT_SHARE`:
        (whether it was refitted, the fit then in force: None where no readout has earned its place)."""
        n = len(self.samples)
        if n < MIN_READOUT_LABELS:
            return True, None
        due_choice = self.added >= 2 * self.chosen_at
        due_fit = self.added - self.fitted_at >= max(1, REFIT_SHARE * n)
        if not (due_choice or due_fit):
            return False, None
        offsets = self.offsets(learner)
        features = np.asarray(self.features, dtype=np.float64)
        gold = np.asarray([s.gold for s in self.samples])
        if due_choice:
            self.chosen, self.chosen_at = choose(offsets, features, gold, margin_z), self.added
        self.fitted_at = self.added
        return True, None if self.chosen is None else ReadoutFit.fit(offsets, features, gold, *self.chosen)


def _bytes(sample: Sample, features: np.ndarray) -> int:
    return features.nbytes + 8 * (len(sample.probs) + 4) + 200  # the features, the sample, the keys' share


class Readouts:
    """Every readout level's labels and fits. `add` (one writer at a time) refits the levels its labels touch and
    publishes a new snapshot; `apply` (any thread) reads the snapshot it finds."""

    def __init__(self, max_bytes: int = MAX_READOUT_BYTES, margin_z: float = MARGIN_Z):
        self.max_bytes = max_bytes
        self.margin_z = margin_z  # `choose`'s margin (the simulations compare others)
        self.held_bytes = 0
        self.levels: dict[tuple[str, str], _Level] = {}
        self.snapshot: dict[tuple[str, str], ReadoutFit] = {}
        self._lock = threading.Lock()

    def add(self, learner: Learner, labeled: Iterable[tuple[dict[str, str], Sample, np.ndarray | None]]) -> None:
        """Labels with features (those without are passed over), after `learner` has learned them: each level they
        touch refitted on the learner's calibration of its labels (see the module)."""
        with self._lock:
            touched = set()
            for keys, sample, features in labeled:
                if features is None:
                    continue
                stored = np.asarray(features, dtype=np.float16)
                for key in readout_keys(keys, keys["kind"], len(sample.probs)):
                    level = self.levels.setdefault(key, _Level(len(sample.probs)))
                    if level.features and len(level.features[0]) != len(stored):
                        continue  # another projection's features (another model's): never mixed
                    level.keys.append(keys)
                    level.samples.append(sample)
                    level.features.append(stored)
                    level.added += 1
                    self.held_bytes += _bytes(sample, stored)
                    if len(level.samples) > MAX_READOUT_LABELS:
                        self._drop_oldest(level)
                    touched.add(key)
            while self.held_bytes > self.max_bytes:  # the most labeled level lets its oldest go
                self._drop_oldest(max(self.levels.values(), key=lambda level: len(level.samples)))
            snapshot = dict(self.snapshot)
            for key in touched:
                refitted, fitted = self.levels[key].refit(learner, self.margin_z)
                if refitted and fitted is None:
                    snapshot.pop(key, None)
                elif refitted:
                    snapshot[key] = fitted
            self.snapshot = snapshot

    def _drop_oldest(self, level: _Level) -> None:
        sample, features = level.samples.popleft(), level.features.popleft()
        level.keys.popleft()
        self.held_bytes -= _bytes(sample, features)

    def fit_for(self, keys: dict[str, str], kind: str, answers: int) -> ReadoutFit | None:
        """The question's readout in force: its most specific level's that has one (None: none has)."""
        snapshot = self.snapshot
        return next((snapshot[k] for k in readout_keys(keys, kind, answers) if k in snapshot), None)

    def apply(
        self, keys: dict[str, str], kind: str, probs: Sequence[float], features: np.ndarray | None
    ) -> tuple[list[float], ReadoutFit | None]:
        """`probs` (calibrated) through the question's learned readout where one is in force and the read has
        features; else unchanged, and None."""
        fitted = None if features is None else self.fit_for(keys, kind, len(probs))
        if fitted is None or fitted.dims != len(features):
            return list(probs), None
        return fitted.apply(probs, features), fitted
