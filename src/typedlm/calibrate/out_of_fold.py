"""The model served from labels: `FOLDS` fold models, each fitted without one fold of the labels. A new answer is
their mean; a label is scored by the one fold model that never saw it. The guarantees
(`typedlm.calibrate.guarantees`, `typedlm.calibrate.decisions`) are computed from those scores, and the answers
they are applied to come from the same fold models: what is served is what was certified.

    folds = OutOfFold()
    folds.add([(label_id, keys, sample, features, fair), ...])   # every fold but the label's own learns it
    served = folds.answer(keys, kind, probs, mass, disagreement, features)   # `Served`: each fold's, their mean
    folds.scored("family", key)   # that level's fair labels as `Scored`: each as its fold's model answers it

A label's fold is its id modulo `FOLDS` (the store's id, so every process on one database agrees). Fold f's model is
a `Learner` (`typedlm.calibrate.learning`) fitted on every label outside fold f, then the learned readouts of those
labels (`typedlm.calibrate.readout`), each with every choice it makes (variant, λ, whether a readout earns its place,
its size) made on those labels alone. So a label's out-of-fold answer is an answer of the whole pipeline, choices
included, that never saw it; and a new answer, which no fold model saw either, is the mean of all five (CV+, Barber
et al. 2021: each fold's model answers, and the sets are built from its answer and its own fold's scores).

The fold learners learn a label when it is added (a few small refits each); their readouts, the costly part, learn on
a thread of their own at a lower priority (`start`; `catch_up`: all the labels added since at once, once the labels
pause for `QUIET_S` or `CATCH_UP_WAIT_S` after the first), so neither a post nor an answer waits for them; `settle`
waits for them. Without the thread (`start` not called: the simulation, a library user) they catch up when an answer
or a score is asked for. A level's `Scored` is kept until the next label or refit (`state`); `MAX_LEVEL_LABELS`
latest fair labels per level, `MAX_RECORD_BYTES` of fair labels in all (the latest).

Only fair labels (`x_sample` "random": a fair sample of the traffic) are scored: a label chosen because the answer
was wrong or hard is not a draw from the traffic a guarantee speaks of. Every label, fair or not, is learned.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from typedlm.calibrate.guarantees import Scored
from typedlm.calibrate.learning import LEVELS, MAX_LEVEL_LABELS, MAX_SAMPLE_BYTES, Learner, Sample, Used
from typedlm.calibrate.readout import Readouts

FOLDS = 5
QUIET_S = 0.25  # the readouts learn once no label has come for this long...
CATCH_UP_WAIT_S = 2.0  # ... or this long after the first label they have not learned
NICENESS = 10  # their thread's scheduling priority below the others'
MAX_RECORD_BYTES = 64 * 2**20  # the fair labels kept for scoring (the latest), in bytes of their samples and features
FLOOR = 1e-12

Labeled = tuple[int, dict[str, str], Sample, "np.ndarray | None", bool]  # id, keys, sample, features, fair


@dataclass(frozen=True)
class Record:
    """A fair label as scoring needs it."""

    fold: int
    keys: dict[str, str]
    sample: Sample
    features: np.ndarray | None  # [d] float16, where the label's read has them

    @property
    def nbytes(self) -> int:
        return 8 * (len(self.sample.probs) + 4) + 200 + (0 if self.features is None else self.features.nbytes)


@dataclass(frozen=True)
class Served:
    """A new answer as the fold models give it: each fold's probabilities [K, n] and their mean, the one shown
    (`probs`); the most specific level with labels (None: none; `probs` are then the default's), and how many fold
    models read it through a learned readout."""

    by_fold: np.ndarray
    probs: list[float]
    used: Used | None
    readouts: int

    @classmethod
    def alone(cls, probs: Sequence[float]) -> Served:
        """An answer no labels speak for: its probabilities, as one model's."""
        return cls(np.asarray([probs], dtype=np.float64), list(probs), None, 0)


class OutOfFold:
    """The fold models and the fair labels' records (see the module). `add` from one thread at a time (the feedback
    service's lock); `answer` and `scored` from any thread."""

    def __init__(self, folds: int = FOLDS, max_bytes: int = MAX_SAMPLE_BYTES, readouts: Readouts | None = None):
        self.folds = folds
        self.learners = [Learner(max_bytes=max_bytes) for _ in range(folds)]
        self.readouts = readouts or Readouts(folds)
        assert self.readouts.folds == folds, "the readouts' folds are the learners'"
        self.records: dict[int, Record] = {}
        self.order: deque[int] = deque()  # record ids, oldest first
        self.record_bytes = 0
        self.members: dict[tuple[str, str], deque[int]] = {}  # (level, key) -> its fair labels' ids, oldest first
        self.labels: dict[tuple[str, str], int] = {}  # (level, key) -> labels learned there, fair or not
        self.version = 0  # labels added so far
        self.refits = 0  # readout catch-ups done: with `version`, what a cached `Scored` was computed at (`state`)
        self._cache: dict[tuple[str, str], tuple[tuple[int, int], Scored]] = {}
        self._lock = threading.Lock()  # the cache, the records and the members
        self.pending: list[tuple[int, dict[str, str], Sample, np.ndarray | None]] = []  # not in the readouts yet
        self._fit_lock = threading.Lock()  # the readouts: one catch-up at a time
        self._pending_lock = threading.Lock()
        self._wake = threading.Event()  # set by `add`: the thread has labels to teach
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> tuple[int, int]:
        """What the scores depend on: the labels added and the readouts' refits."""
        return self.version, self.refits

    # -- learning ----------------------------------------------------------------------------------------------

    def add(self, labeled: Iterable[Labeled]) -> None:
        """Labels (each its id, its question's keys, its sample, its features and whether it is fair): learned by
        every fold's learner but its own's now, by their readouts on the thread; the fair ones kept for scoring."""
        labeled = list(labeled)
        for fold, learner in enumerate(self.learners):
            learner.add((keys, sample) for label_id, keys, sample, _, _ in labeled if label_id % self.folds != fold)
        with self._pending_lock:  # never waits for a readout refit
            self.pending += [(label_id, keys, sample, features) for label_id, keys, sample, features, _ in labeled]
        with self._lock:  # the records and members, as `scored` reads them from other threads
            for label_id, keys, sample, features, fair in labeled:
                for level in LEVELS:
                    self.labels[(level, keys[level])] = self.labels.get((level, keys[level]), 0) + 1
                if not fair:
                    continue
                stored = None if features is None else np.asarray(features, dtype=np.float16)
                record = Record(label_id % self.folds, keys, sample, stored)
                self.records[label_id] = record
                self.record_bytes += record.nbytes
                self.order.append(label_id)
                for level in LEVELS:
                    members = self.members.setdefault((level, keys[level]), deque(maxlen=MAX_LEVEL_LABELS))
                    members.append(label_id)
            while self.record_bytes > MAX_RECORD_BYTES:
                self.record_bytes -= self.records.pop(self.order.popleft()).nbytes
            self.version += len(labeled)
        self._wake.set()

    def catch_up(self) -> None:
        """Teach the readouts every label added since they last learned (one refit per fold of each level touched,
        for all of them at once)."""
        with self._fit_lock:
            with self._pending_lock:
                pending, self.pending = self.pending, []
            if pending:
                self.readouts.add(self.learners, pending)
                with self._lock:
                    self.refits += 1

    def settle(self) -> None:
        """Return once every label added so far is learned, readouts included."""
        self.catch_up()

    def start(self) -> None:
        """Teach the readouts on a thread of their own from now on (see the module)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="typedlm-out-of-fold", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(AttributeError, OSError):  # below the threads that answer and post (Linux)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)
        while not self._stop.is_set():
            self._wake.wait()
            first = time.monotonic()
            # labels come in bursts (a batch job's gold column, a team labelling a queue): wait for a quiet
            # moment, at most `CATCH_UP_WAIT_S`, so that one refit learns the burst
            while time.monotonic() - first < CATCH_UP_WAIT_S and not self._stop.is_set():
                self._wake.clear()
                if not self._wake.wait(QUIET_S):
                    break
            self._wake.clear()
            if not self._stop.is_set():
                self.catch_up()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _caught_up(self) -> None:
        """Without the thread, what was added is learned when it is read."""
        if self._thread is None and self.pending:
            self.catch_up()

    # -- answering ---------------------------------------------------------------------------------------------

    def answer(
        self,
        keys: dict[str, str],
        kind: str,
        probs: Sequence[float],
        mass: float,
        disagreement: float,
        features: np.ndarray | None = None,
    ) -> Served:
        """A new answer (the default's probabilities, raw mass and disagreement; its read's features, where the
        forward was asked for them) through every fold model, and their mean (see `Served`)."""
        self._caught_up()
        used = self.used(keys)
        if used is None:
            return Served.alone(probs)
        rows, readouts = [], 0
        for fold, learner in enumerate(self.learners):
            row, _ = learner.calibrate(keys, probs, mass, disagreement)
            row, fitted = self.readouts.apply(keys, kind, row, features, fold)
            rows.append(row)
            readouts += fitted is not None
        by_fold = np.asarray(rows, dtype=np.float64)  # [K, n]
        return Served(by_fold, by_fold.mean(axis=0).tolist(), used, readouts)

    def used(self, keys: dict[str, str]) -> Used | None:
        """The most specific level of a question with labels, and how many it has learned (None: none)."""
        for level in LEVELS:
            if count := self.labels.get((level, keys[level]), 0):
                return Used(level, count)
        return None

    def learned_readout(self, keys: dict[str, str], kind: str, answers: int) -> bool:
        """Whether any fold model reads a question through a learned readout now."""
        fits = self.readouts.fits_for(keys, kind, answers)
        return fits is not None and any(fit is not None for fit in fits)

    # -- scoring -----------------------------------------------------------------------------------------------

    def count(self, level: str, key: str) -> int:
        """The fair labels a level holds (those scored: their records kept)."""
        with self._lock:
            return sum(1 for i in self.members.get((level, key), ()) if i in self.records)

    def scored(self, level: str, key: str) -> Scored | None:
        """The level's fair labels, each as its fold's model answers it (None: none)."""
        self._caught_up()
        version = self.state
        with self._lock:
            cached = self._cache.get((level, key))
            if cached is not None and cached[0] == version:
                return cached[1]
            records = [self.records[i] for i in self.members.get((level, key), ()) if i in self.records]
        if not records:
            return None
        scored = self._score(records)
        with self._lock:
            self._cache[(level, key)] = (version, scored)
        return scored

    def _score(self, records: list[Record]) -> Scored:
        """Each record through its fold's model, grouped by fold, question and answer count so that each group is
        one array through each level's fit and the fold's readout."""
        groups: dict[tuple[int, str, int], list[int]] = {}
        for i, record in enumerate(records):
            groups.setdefault((record.fold, record.keys["exact"], len(record.sample.probs)), []).append(i)
        learned: list[np.ndarray] = [np.zeros(0)] * len(records)
        for (fold, _, n), members in groups.items():
            keys, samples = records[members[0]].keys, [records[i].sample for i in members]
            probs = self.learners[fold].calibrate_rows(
                keys,
                np.asarray([s.probs for s in samples], dtype=np.float64),
                np.asarray([s.mass for s in samples]),
                np.asarray([s.disagreement for s in samples]),
            )
            fitted = self.readouts.fit_for(keys, keys["kind"], n, fold)
            read = [at for at, i in enumerate(members) if records[i].features is not None]
            if fitted is not None and read:
                features = np.asarray([records[members[at]].features for at in read], dtype=np.float64)
                if features.shape[1] == fitted.dims:
                    probs[read] = fitted.apply_rows(np.log(np.maximum(probs[read], FLOOR)), features)
            for i, row in zip(members, probs):
                learned[i] = row
        gold = np.asarray([record.sample.gold for record in records])
        return Scored(
            scores=np.asarray([1.0 - row[g] for row, g in zip(learned, gold)]),
            confidence=np.asarray([row.max() for row in learned]),
            correct=np.asarray([row.argmax() == g for row, g in zip(learned, gold)]),
            answers=np.concatenate(learned),
            folds=np.asarray([record.fold for record in records]),
            fold_count=self.folds,
        )

    # -- what it holds -----------------------------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Labels the fold learners hold (their latest): every label is held by all of them but its own fold's."""
        return round(sum(learner.held for learner in self.learners) / max(1, self.folds - 1))

    @property
    def nbytes(self) -> int:
        """Bytes of the fold learners' samples and the fair labels' records."""
        return sum(learner.nbytes for learner in self.learners) + self.record_bytes
