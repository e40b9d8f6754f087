"""A readout learned from a question's labels: its calibrated answer corrected by a linear function of what the model
held at the decision row (the read's features: `typedlm.calibrate.projection`), zero until labels earn it.

    readouts = Readouts(folds=5)
    readouts.add(learners, labeled)   # (id, keys, sample, features) per label, once each fold's learner has them
    probs, learned = readouts.apply(keys, kind, probs, features, fold)   # fold `fold`'s readout

Each fold f of the served model (`typedlm.calibrate.out_of_fold`) has its own readouts, learned from the labels
outside fold f on fold f's learner's calibration of them, and chosen (or not) on those labels alone: a label's
out-of-fold answer then went through a readout, and a choice of readout, that never saw it.

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

The model (`typedlm.calibrate.readout_fit`): log p'(a) = (log p(a) + w_a · x(features)) / T + const, p the
calibrated probabilities, x the level's features whitened, w fitted by MAP; it is used only where its gate
(`readout_fit.choose`) says it earns its place, chosen whenever a level's labels double from `MIN_READOUT_LABELS`
on, and refitted with the chosen settings as labels come (each `REFIT_SHARE` more) in between.

Bounded: a level keeps its latest `MAX_READOUT_LABELS` labels, all levels together `MAX_READOUT_BYTES`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from typedlm.calibrate.learning import Learner, Sample
from typedlm.calibrate.readout_fit import MARGIN_Z, ReadoutFit, choose
from typedlm.core.names import Kind

MIN_READOUT_LABELS = 30  # a readout is considered from this many labels on
MAX_READOUT_ANSWERS = 64  # a choice or score learns a readout with at most this many answers
MAX_READOUT_LABELS = 2048  # a level's latest labels
MAX_READOUT_BYTES = 32 * 2**20  # every level's labels together
REFIT_SHARE = 0.05  # between cross-validations, refitted once labels grew by this share (at least one)
FLOOR = 1e-12


def readout_keys(keys: dict[str, str], kind: str, answers: int) -> list[tuple[str, str]]:
    """The levels whose labels a question's readouts learn from, the most specific first (see the module)."""
    if kind == Kind.NOUL:
        return [("family", keys["family"]), ("kind", keys["kind"])]
    if answers <= MAX_READOUT_ANSWERS:
        return [("exact", keys["exact"])]
    return []


@dataclass
class _Level:
    """One readout level's labels (the latest), each with its fold, and per fold the readout learned from the
    labels outside it: its chosen (components, λ, temperature), and the label counts it was chosen and fitted at."""

    answers: int
    folds: int
    keys: deque = field(default_factory=deque)  # each label's question keys (its learner calibration's)
    samples: deque = field(default_factory=deque)  # each label's `Sample`
    features: deque = field(default_factory=deque)  # each label's features [d] float16
    fold_of: deque = field(default_factory=deque)  # each label's fold
    chosen: list = field(default_factory=list)  # per fold: (components, λ, temperature) or None
    chosen_at: list = field(default_factory=list)  # per fold: its labels at its last choice
    fitted_at: list = field(default_factory=list)  # per fold: its labels at its last fit
    added: list = field(default_factory=list)  # per fold: labels ever added outside it (it learns from the latest)

    def __post_init__(self) -> None:
        self.chosen = [None] * self.folds
        self.chosen_at, self.fitted_at, self.added = [0] * self.folds, [0] * self.folds, [0] * self.folds

    def learns(self, fold: int, fold_of):
        """Whether fold `fold`'s readout learns from labels of folds `fold_of` (with one fold: every label)."""
        return (fold_of != fold) | (self.folds == 1)

    def offsets(self, learner: Learner, rows: np.ndarray) -> np.ndarray:
        """The labels at `rows`' calibrated log-probabilities [N, n] as `learner` gives them now (grouped by
        question)."""
        out = np.zeros((len(rows), self.answers))
        groups: dict[str, list[int]] = {}
        for at, i in enumerate(rows):
            groups.setdefault(self.keys[i]["exact"], []).append(at)
        for members in groups.values():
            keys, samples = self.keys[rows[members[0]]], [self.samples[rows[at]] for at in members]
            probs = np.asarray([s.probs for s in samples])
            mass = np.asarray([s.mass for s in samples])
            disagreement = np.asarray([s.disagreement for s in samples])
            out[members] = learner.calibrate_rows(keys, probs, mass, disagreement)
        return np.log(np.maximum(out, FLOOR))

    def refit(self, fold: int, learner: Learner, margin_z: float = MARGIN_Z) -> tuple[bool, ReadoutFit | None]:
        """Fold `fold`'s readout (learned from the labels outside it, calibrated by its `learner`): chosen again
        where its count doubled since its last choice, refitted where it grew by `REFIT_SHARE`: (whether it was
        refitted, the fit then in force: None where no readout has earned its place)."""
        rows = np.flatnonzero(self.learns(fold, np.asarray(self.fold_of)))
        n, added = len(rows), self.added[fold]
        if n < MIN_READOUT_LABELS:
            return True, None
        due_choice = added >= 2 * self.chosen_at[fold]
        due_fit = added - self.fitted_at[fold] >= max(1, REFIT_SHARE * n)
        if not (due_choice or due_fit):
            return False, None
        offsets = self.offsets(learner, rows)
        features = np.asarray([self.features[i] for i in rows], dtype=np.float64)
        gold = np.asarray([self.samples[i].gold for i in rows])
        if due_choice:
            self.chosen[fold], self.chosen_at[fold] = choose(offsets, features, gold, margin_z), added
        self.fitted_at[fold] = added
        chosen = self.chosen[fold]
        return True, None if chosen is None else ReadoutFit.fit(offsets, features, gold, *chosen)


def _bytes(sample: Sample, features: np.ndarray) -> int:
    return features.nbytes + 8 * (len(sample.probs) + 4) + 200  # the features, the sample, the keys' share


class Readouts:
    """Every readout level's labels, and per level and fold the readout learned from the labels outside the fold
    (`typedlm.calibrate.out_of_fold`: each fold's model is its learner, then its readout). `add` (one writer at a
    time) refits, for every fold, the levels its labels touch and publishes a new snapshot; `apply` (any thread)
    reads the snapshot it finds."""

    def __init__(self, folds: int = 1, max_bytes: int = MAX_READOUT_BYTES, margin_z: float = MARGIN_Z):
        self.folds = folds
        self.max_bytes = max_bytes
        self.margin_z = margin_z  # `choose`'s margin (the simulations compare others)
        self.held_bytes = 0
        self.levels: dict[tuple[str, str], _Level] = {}
        self.snapshot: dict[tuple[str, str], tuple[ReadoutFit | None, ...]] = {}  # per level: each fold's fit
        self._lock = threading.Lock()

    def add(
        self,
        learners: Sequence[Learner],
        labeled: Iterable[tuple[int, dict[str, str], Sample, np.ndarray | None]],
    ) -> None:
        """Labels (each its id, whose remainder modulo the folds is its fold, its question's keys, its sample and
        its features; those without features are passed over), after fold f's learner `learners[f]` has learned
        the ones outside fold f: each level they touch refitted, per fold, on that fold's learner's calibration of
        the labels outside it (see the module)."""
        assert len(learners) == self.folds, "one learner per fold"
        with self._lock:
            touched = set()
            for label_id, keys, sample, features in labeled:
                if features is None:
                    continue
                stored = np.asarray(features, dtype=np.float16)
                for key in readout_keys(keys, keys["kind"], len(sample.probs)):
                    level = self.levels.setdefault(key, _Level(len(sample.probs), self.folds))
                    if level.features and len(level.features[0]) != len(stored):
                        continue  # another projection's features (another model's): never mixed
                    level.keys.append(keys)
                    level.samples.append(sample)
                    level.features.append(stored)
                    level.fold_of.append(label_id % self.folds)
                    for fold in range(self.folds):
                        level.added[fold] += bool(level.learns(fold, label_id % self.folds))
                    self.held_bytes += _bytes(sample, stored)
                    if len(level.samples) > MAX_READOUT_LABELS:
                        self._drop_oldest(level)
                    touched.add(key)
            while self.held_bytes > self.max_bytes:  # the most labeled level lets its oldest go
                self._drop_oldest(max(self.levels.values(), key=lambda level: len(level.samples)))
            snapshot = dict(self.snapshot)
            for key in touched:
                fits = list(snapshot.get(key, (None,) * self.folds))
                for fold, learner in enumerate(learners):
                    refitted, fitted = self.levels[key].refit(fold, learner, self.margin_z)
                    if refitted:
                        fits[fold] = fitted
                if any(fit is not None for fit in fits):
                    snapshot[key] = tuple(fits)
                else:
                    snapshot.pop(key, None)
            self.snapshot = snapshot

    def _drop_oldest(self, level: _Level) -> None:
        sample, features = level.samples.popleft(), level.features.popleft()
        level.keys.popleft()
        level.fold_of.popleft()
        self.held_bytes -= _bytes(sample, features)

    def fits_for(self, keys: dict[str, str], kind: str, answers: int) -> tuple[ReadoutFit | None, ...] | None:
        """The question's readouts in force, one per fold (None where that fold has none): its most specific
        level's where any fold has one (None: no level has)."""
        snapshot = self.snapshot
        return next((snapshot[k] for k in readout_keys(keys, kind, answers) if k in snapshot), None)

    def fit_for(self, keys: dict[str, str], kind: str, answers: int, fold: int = 0) -> ReadoutFit | None:
        """Fold `fold`'s readout in force for the question (None: none)."""
        fits = self.fits_for(keys, kind, answers)
        return None if fits is None else fits[fold]

    def apply(
        self,
        keys: dict[str, str],
        kind: str,
        probs: Sequence[float],
        features: np.ndarray | None,
        fold: int = 0,
    ) -> tuple[list[float], ReadoutFit | None]:
        """`probs` (calibrated by fold `fold`'s learner) through that fold's learned readout where one is in force
        and the read has features; else unchanged, and None."""
        fitted = None if features is None else self.fit_for(keys, kind, len(probs), fold)
        if fitted is None or fitted.dims != len(features):
            return list(probs), None
        return fitted.apply(probs, features), fitted
