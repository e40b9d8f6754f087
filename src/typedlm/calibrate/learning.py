"""Calibration learned from gold answers, per question, hierarchically. Plain numbers, no model, no storage.

A labeled answer (`Sample`: the default's probabilities for it, its raw mass and order-read disagreement, and the
gold answer's index) counts at three levels of the question it answers (`question_keys`):

    exact    the question itself: type, instructions and options (`calibration.signature`)
    family   type and instructions: the same question over options that vary
    kind     every question of its type (all of a user's yes/no questions, say)

Each level holds a small calibrator fitted on its own labels, on what the level above it gives (kind on the
default, family on kind, exact on family), so an answer goes default → kind → family → exact, and a level without
labels passes its input on unchanged. A level's parameters θ are fitted by maximum a posteriori with a Gaussian
prior centred on "change nothing" (θ = 0): minimise Σ −log p(gold) + λ/2·|θ|², λ = `SHRINK` at first, so a level
is shrunk towards its parent: 3 labels move it a little, 100 a lot. From `MIN_CV_LABELS` labels on, the fit aims
at Platt's targets (`targets`) rather than the labels (labels that all give one answer make it very likely, never
certain), and λ is chosen with the variant, among `SHRINKS`: the prior's right weight depends on how far the
task is from the default, which only the level's own labels tell. Two variants (`VARIANTS`), each with or
without its bias, chosen per level by `CV_FOLDS`-fold cross-validation on its labels whenever its count doubles
from `MIN_CV_LABELS` on (before that: a temperature alone, which never moves a top answer):

    scale      p ∝ q^(1/T)·e^(b): a temperature, and a bias per answer where the level's answers are the same
               answers (noul everywhere: a bias on yes; choice and score at the exact level, up to
               `MAX_BIAS_ANSWERS` answers)
    features   log T = w·φ, φ the feature calibrator's features of the answer (`calibration.calibrator_features`),
               for noul with a bias on yes too

Fitting (`level_fit`) is damped Gauss-Newton on the parameters (at most a few dozen), over at most
`MAX_LEVEL_LABELS` labels per level (the latest). `Learner.add` refits the levels a new label touches;
`Learner.calibrate` reads an immutable snapshot, so answering never waits for a refit.

Memory is bounded: the learner holds the latest samples up to `MAX_SAMPLE_BYTES` (`Learner.nbytes`); older ones are
let go, and a level left without samples keeps its last fit (it answers as before) until a new label refits it.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from typedlm.calibrate.calibration import FLOOR, signature
from typedlm.calibrate.level_fit import SHRINK, SHRINKS, LevelFit, Rows, as_rows, choose_variant, fit
from typedlm.core.names import Kind
from typedlm.core.questions import Question

LEVELS = ("exact", "family", "kind")  # the most specific first: an answer's report names the first with labels
MAX_LEVEL_LABELS = 4096  # the latest labels a level is fitted on
MAX_SAMPLE_BYTES = 64 * 2**20  # the samples a learner holds (the latest), in bytes of their arrays
MAX_BIAS_ANSWERS = 16  # a per-answer bias only for questions with at most this many answers
MIN_CV_LABELS = 20  # a level's variant is chosen by cross-validation from this many labels on, at each doubling


def _hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def question_keys(question: Question, prompt_version: str) -> dict[str, str]:
    """The question's key at each level (see the module docstring): exact, family and kind."""
    return {
        "exact": signature(question, prompt_version),
        "family": _hash(question.kind, question.instructions),
        "kind": question.kind,
    }


@dataclass(frozen=True)
class Sample:
    """One labeled answer as the learner sees it."""

    probs: tuple[float, ...]  # the default calibration's probabilities
    mass: float  # the raw label mass
    disagreement: float  # share of order reads disagreeing with the top answer (0 with one read)
    gold: int


# ---- a level: its samples, variant and fit ------------------------------------------------------------------


@dataclass
class Level:
    """One key's labels at one level and its current fit."""

    kind: str
    biasable: bool  # whether a bias per answer is possible here (noul, or the exact level of a small question)
    samples: list[int] = field(default_factory=list)  # indexes into the learner's samples, oldest first
    variant: str = "scale"
    biased: bool = False  # whether the chosen variant has the bias (never before the first cross-validation)
    theta: np.ndarray | None = None
    chosen_at: int = 0  # the label count at the last cross-validation
    shrink: float | None = None  # λ as last chosen (None: the learner's, before the first cross-validation)

    def fit(self, groups: Sequence[Rows], shrink: float, shrinks: Sequence[float] = SHRINKS) -> LevelFit:
        """Refit on `groups` (this level's samples as its parent gives them, one `Rows` per size), choosing the
        variant and λ (among `shrinks`; `shrink` until then) again by cross-validation where the count has doubled
        since the last choice."""
        n = sum(len(rows.gold) for rows in groups)
        if n >= MIN_CV_LABELS and n >= 2 * self.chosen_at:
            self.variant, self.biased, self.shrink = choose_variant(self.kind, groups, self.biasable, shrinks)
            self.chosen_at, self.theta = n, None
        lam = shrink if self.shrink is None else self.shrink
        # from the first cross-validation on, the prior may be weak (λ = 0.1) and a bias possible: Platt's targets
        # keep the fit finite where every label gives one answer; before it, the prior of 10 labels does
        platt = n >= MIN_CV_LABELS
        self.theta = fit(self.kind, self.variant, groups, self.biased, lam, self.theta, platt)
        return LevelFit(self.kind, self.variant, tuple(self.theta.tolist()), n, self.biased)


# ---- the learner ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Used:
    """What an answer's calibration used: the most specific level with labels, and their count."""

    level: str
    labels: int

    def to_wire(self) -> dict[str, Any]:
        return {"level": self.level, "labels": self.labels}


class _Columns:
    """The samples of one size n as growing arrays (capacity doubled as needed): probabilities [N, n], raw masses,
    disagreements, gold indexes and each row's sample index [N]."""

    def __init__(self, n: int, capacity: int = 16):
        self.count = 0
        self.probs = np.zeros((capacity, n))
        self.mass, self.disagreement = np.zeros(capacity), np.zeros(capacity)
        self.gold = np.zeros(capacity, dtype=np.int64)
        self.index = np.zeros(capacity, dtype=np.int64)

    @staticmethod
    def row_bytes(n: int) -> int:
        return 8 * (n + 4)

    def append(self, sample: Sample, index: int) -> int:
        if self.count == len(self.mass):
            grow = len(self.mass)
            self.probs = np.concatenate([self.probs, np.zeros_like(self.probs)])
            self.mass, self.disagreement = np.pad(self.mass, (0, grow)), np.pad(self.disagreement, (0, grow))
            self.gold, self.index = np.pad(self.gold, (0, grow)), np.pad(self.index, (0, grow))
        row, self.count = self.count, self.count + 1
        self.probs[row], self.mass[row], self.disagreement[row] = sample.probs, sample.mass, sample.disagreement
        self.gold[row], self.index[row] = sample.gold, index
        return row

    def kept(self, first: int) -> tuple[_Columns, dict[int, int]]:
        """These columns without the samples older than index `first`, and each kept sample's new row."""
        keep = np.flatnonzero(self.index[: self.count] >= first)
        out = _Columns(self.probs.shape[1], max(16, len(keep)))
        out.count = len(keep)
        out.probs[: len(keep)], out.mass[: len(keep)] = self.probs[keep], self.mass[keep]
        out.disagreement[: len(keep)], out.gold[: len(keep)] = self.disagreement[keep], self.gold[keep]
        out.index[: len(keep)] = self.index[keep]
        return out, {int(i): row for row, i in enumerate(out.index[: len(keep)])}

    @property
    def nbytes(self) -> int:
        return self.probs.nbytes + self.mass.nbytes + self.disagreement.nbytes + self.gold.nbytes + self.index.nbytes


class Learner:
    """Every level's labels and fits. `add` (one writer at a time: a lock) refits the levels a label touches and
    publishes a new snapshot; `calibrate` (any thread, no lock) reads the snapshot it finds. Holds the latest
    samples up to `max_bytes` (see the module)."""

    def __init__(self, shrink: float = SHRINK, max_bytes: int = MAX_SAMPLE_BYTES, shrinks: Sequence[float] = SHRINKS):
        self.shrink = shrink  # λ before a level's first cross-validation
        self.shrinks = tuple(shrinks)  # the λ its cross-validations choose among
        self.max_bytes = max_bytes
        self.count = 0  # samples added
        self.first = 0  # the oldest sample still held
        self.held_bytes = 0  # the held samples' share of the columns (`_Columns.row_bytes` each)
        self.columns: dict[int, _Columns] = {}  # answers per sample -> the samples of that size
        self.where: dict[int, tuple[int, int]] = {}  # held sample index -> (its size, its row in `columns[size]`)
        self.levels: dict[tuple[str, str], Level] = {}  # (level, key) -> Level, for levels holding samples
        self.snapshot: dict[tuple[str, str], LevelFit] = {}
        self.keys_of: dict[int, dict[str, str]] = {}  # held sample index -> its question's keys
        self._lock = threading.Lock()

    def add(self, labeled: Iterable[tuple[dict[str, str], Sample]]) -> None:
        """Labels (each its question's keys and its sample), then every level they touch refitted, the most general
        first (each level is fitted on what its parent gives once refitted)."""
        with self._lock:
            touched: dict[str, set[str]] = {level: set() for level in LEVELS}
            for keys, sample in labeled:
                index, size = self.count, len(sample.probs)
                self.count += 1
                self.where[index] = (size, self.columns.setdefault(size, _Columns(size)).append(sample, index))
                self.held_bytes += _Columns.row_bytes(size)
                for level in LEVELS:
                    biasable = sample_biasable(keys["kind"], level, size)
                    entry = self.levels.setdefault((level, keys[level]), Level(keys["kind"], biasable))
                    entry.samples.append(index)
                    if len(entry.samples) > MAX_LEVEL_LABELS:
                        del entry.samples[0]
                    touched[level].add(keys[level])
                self.keys_of[index] = keys
            if self.held_bytes > self.max_bytes:
                self._let_go()
            snapshot = dict(self.snapshot)
            for level in reversed(LEVELS):  # kind, family, exact
                for key in touched[level]:
                    entry = self.levels.get((level, key))
                    if entry is not None:  # None: all its samples let go (one add larger than the budget)
                        inputs = self._inputs(snapshot, level, entry)
                        snapshot[(level, key)] = entry.fit(inputs, self.shrink, self.shrinks)
            self.snapshot = snapshot

    def _let_go(self) -> None:
        """Let the oldest samples go until those held fill three quarters of `max_bytes` (so that this is rare),
        and the levels forget them; a level left with none is dropped (its fit stays in the snapshot)."""
        while self.held_bytes > 0.75 * self.max_bytes and self.first < self.count:
            self.held_bytes -= _Columns.row_bytes(self.where.pop(self.first)[0])
            del self.keys_of[self.first]
            self.first += 1
        for size in list(self.columns):
            columns, rows = self.columns[size].kept(self.first)
            if columns.count:
                self.columns[size] = columns
                self.where.update((index, (size, row)) for index, row in rows.items())
            else:
                del self.columns[size]
        for name, entry in list(self.levels.items()):
            entry.samples = entry.samples[bisect.bisect_left(entry.samples, self.first) :]
            if not entry.samples:
                del self.levels[name]

    @property
    def nbytes(self) -> int:
        """The bytes of the samples' arrays, their spare capacity included."""
        return sum(columns.nbytes for columns in self.columns.values())

    @property
    def held(self) -> int:
        """Samples held (the latest; `count` were added)."""
        return len(self.where)

    def _inputs(self, snapshot: dict[tuple[str, str], LevelFit], level: str, entry: Level) -> list[Rows]:
        """A level's samples as the levels above it give them (one `Rows` per answer count). The samples of a
        family share its kind, those of an exact question its family: their parents are the same levels."""
        rows_of: dict[int, list[int]] = {}
        for index in entry.samples:
            size, row = self.where[index]
            rows_of.setdefault(size, []).append(row)
        keys = self.keys_of[entry.samples[-1]]
        groups = []
        for size, rows in rows_of.items():
            columns, at = self.columns[size], np.asarray(rows)
            probs, mass, disagreement = columns.probs[at], columns.mass[at], columns.disagreement[at]
            for above in reversed(LEVELS[LEVELS.index(level) + 1 :]):
                fitted = snapshot.get((above, keys[above]))
                if fitted is not None:
                    probs = fitted.apply_rows(probs, mass, disagreement)
            groups.append(as_rows(probs, mass, disagreement, columns.gold[at]))
        return groups

    def calibrate(
        self, keys: dict[str, str], probs: Sequence[float], mass: float, disagreement: float
    ) -> tuple[list[float], Used | None]:
        """An answer's default probabilities through every level of its question that has labels (kind, family,
        exact), and the most specific of them (None: no labels at any level; the probabilities unchanged)."""
        snapshot, used = self.snapshot, None
        out = list(probs)
        for level in reversed(LEVELS):
            fitted = snapshot.get((level, keys[level]))
            if fitted is not None and len(out) == len(probs):
                out = fitted.apply(out, mass, disagreement)
                used = Used(level, fitted.labels)
        return out, used

    def calibrate_rows(
        self, keys: dict[str, str], probs: np.ndarray, mass: np.ndarray, disagreement: np.ndarray
    ) -> np.ndarray:
        """`calibrate` for answers of one question at once: probabilities [N, n], raw masses [N], disagreements
        [N] → probabilities [N, n]."""
        snapshot = self.snapshot
        for level in reversed(LEVELS):
            fitted = snapshot.get((level, keys[level]))
            if fitted is not None:
                probs = fitted.apply_rows(probs, mass, disagreement)
        return probs

    def labels(self, level: str, key: str) -> int:
        fitted = self.snapshot.get((level, key))
        return fitted.labels if fitted is not None else 0


def sample_biasable(kind: str, level: str, n: int) -> bool:
    """Whether a level may learn a bias per answer: on yes for noul everywhere; per answer at the exact level of a
    choice or score with at most `MAX_BIAS_ANSWERS` answers (elsewhere the answers differ from label to label)."""
    return kind == Kind.NOUL or (level == "exact" and n <= MAX_BIAS_ANSWERS)


def log_loss(probs: Sequence[float], gold: int) -> float:
    return -math.log(max(probs[gold], FLOOR))
