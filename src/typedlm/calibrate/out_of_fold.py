"""What the feedback calibrator would have answered for each label had it not seen it: out-of-fold scores, the only
scores the guarantees (`typedlm.calibrate.guarantees`) are computed from.

    folds = OutOfFold()
    folds.add([(label_id, keys, sample, fair), ...])   # beside `Learner.add`, the same labels
    folds.scored("family", key)                        # that level's fair labels as `Scored`, oldest first

Every label goes to `FOLDS` − 1 of `FOLDS` learners (`typedlm.calibrate.learning.Learner`, the server's own): the
fold of a label is its id modulo `FOLDS` (the store's id, so every process on one database agrees), and the learner
of fold f learns every label outside fold f. A label's out-of-fold answer is its fold's learner's answer: fitted
on the other four fifths of the labels, never on it. The answers a server gives come from the learner fitted on
every label, a little better than each fold's, so a set built on these scores covers at least as often as the
theory says (checked by simulation, docs/feedback.md).

Only fair labels (`x_sample` "random": a fair sample of the traffic) are scored: a label chosen because the answer
was wrong or hard is not a draw from the traffic a guarantee speaks of. Every label, fair or not, is learned.

The fold learners learn new labels on a thread of their own, at a lower priority (`start`; `catch_up`: all the labels
added since at once, one refit per level they touch, once the labels pause for `QUIET_S` or `CATCH_UP_WAIT_S` after
the first), so neither a post nor an answer waits for their refits. Until they have, a new
label is scored by its fold's learner as it stands, which has not seen it either: every score stays out of fold
whenever it is read. Without the thread (`start` not called: the simulation, a library user) scores are caught up
when asked for. A level's `Scored` is kept until the next label or refit (`state`: a fit at the kind level moves
every family's answers); `MAX_LEVEL_LABELS` latest fair labels per level, `MAX_RECORDS` labels in all.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from typedlm.calibrate.guarantees import Scored
from typedlm.calibrate.learning import LEVELS, MAX_LEVEL_LABELS, MAX_SAMPLE_BYTES, Learner, Sample

FOLDS = 5
QUIET_S = 0.25  # the fold learners learn once no label has come for this long...
CATCH_UP_WAIT_S = 2.0  # ... or this long after the first label they have not learned
NICENESS = 10  # their thread's scheduling priority below the others'
MAX_RECORDS = 200_000  # the labels whose samples are kept for scoring (the latest)


@dataclass(frozen=True)
class Record:
    """A fair label as scoring needs it."""

    fold: int
    keys: dict[str, str]
    sample: Sample


class OutOfFold:
    """The fold learners and the fair labels' records (see the module). `add` from one thread at a time (the
    feedback service's lock); `scored` from any thread."""

    def __init__(self, folds: int = FOLDS, max_bytes: int = MAX_SAMPLE_BYTES):
        self.folds = folds
        self.learners = [Learner(max_bytes=max_bytes) for _ in range(folds)]
        self.records: dict[int, Record] = {}
        self.order: deque[int] = deque()  # record ids, oldest first
        self.members: dict[tuple[str, str], deque[int]] = {}  # (level, key) -> its fair labels' ids, oldest first
        self.version = 0  # labels added so far
        self.refits = 0  # catch-ups done: with `version`, what a cached `Scored` was computed at (`state`)
        self._cache: dict[tuple[str, str], tuple[tuple[int, int], Scored]] = {}
        self._lock = threading.Lock()  # the cache, the records and the members
        self.pending: list[tuple[int, dict[str, str], Sample]] = []  # labels the fold learners have not learned yet
        self._fit_lock = threading.Lock()  # the fold learners: one catch-up at a time
        self._pending_lock = threading.Lock()
        self._wake = threading.Event()  # set by `add`: the thread has labels to teach
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> tuple[int, int]:
        """What the scores depend on: the labels added and the fold learners' refits."""
        return self.version, self.refits

    def start(self) -> None:
        """Teach the fold learners on a thread of their own from now on (see the module)."""
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

    def catch_up(self) -> None:
        """Teach the fold learners every label added since they last learned (one refit per level touched, for
        all of them at once)."""
        with self._fit_lock:
            with self._pending_lock:
                pending, self.pending = self.pending, []
            if pending:
                for fold, learner in enumerate(self.learners):
                    learner.add((keys, sample) for label_id, keys, sample in pending if label_id % self.folds != fold)
                self.refits += 1

    def add(self, labeled: Iterable[tuple[int, dict[str, str], Sample, bool]]) -> None:
        """Labels (each its id, its question's keys, its sample and whether it is fair), learned by every fold's
        learner but its own; the fair ones kept for scoring."""
        labeled = list(labeled)
        with self._pending_lock:  # never waits for a refit
            self.pending += [(label_id, keys, sample) for label_id, keys, sample, _ in labeled]
        with self._lock:  # the records and members, as `scored` reads them from other threads
            for label_id, keys, sample, fair in labeled:
                if not fair:
                    continue
                self.records[label_id] = Record(label_id % self.folds, keys, sample)
                self.order.append(label_id)
                for level in LEVELS:
                    members = self.members.setdefault((level, keys[level]), deque(maxlen=MAX_LEVEL_LABELS))
                    members.append(label_id)
            while len(self.order) > MAX_RECORDS:
                del self.records[self.order.popleft()]
        self.version += len(labeled)
        self._wake.set()

    def count(self, level: str, key: str) -> int:
        """The fair labels a level holds (those scored: their records kept)."""
        with self._lock:
            return sum(1 for i in self.members.get((level, key), ()) if i in self.records)

    def scored(self, level: str, key: str) -> Scored | None:
        """The level's fair labels, each as its fold's learner answers it (None: none)."""
        if self._thread is None:
            self.catch_up()
        version = self.state
        with self._lock:
            cached = self._cache.get((level, key))
            if cached is not None and cached[0] == version:
                return cached[1]
        with self._lock:
            records = [self.records[i] for i in self.members.get((level, key), ()) if i in self.records]
        if not records:
            return None
        scored = self._score(records)
        with self._lock:
            self._cache[(level, key)] = (version, scored)
        return scored

    def _score(self, records: list[Record]) -> Scored:
        """Each record through its fold's learner, grouped by fold, question and answer count so that each group is
        one array through each level's fit."""
        groups: dict[tuple[int, str, int], list[int]] = {}
        for i, record in enumerate(records):
            groups.setdefault((record.fold, record.keys["exact"], len(record.sample.probs)), []).append(i)
        learned: list[np.ndarray] = [np.zeros(0)] * len(records)
        for (fold, _, _), members in groups.items():
            samples = [records[i].sample for i in members]
            probs = self.learners[fold].calibrate_rows(
                records[members[0]].keys,
                np.asarray([s.probs for s in samples], dtype=np.float64),
                np.asarray([s.mass for s in samples]),
                np.asarray([s.disagreement for s in samples]),
            )
            for i, row in zip(members, probs):
                learned[i] = row
        gold = np.asarray([record.sample.gold for record in records])
        default = [np.asarray(record.sample.probs, dtype=np.float64) for record in records]
        return Scored(
            scores=np.asarray([1.0 - row[g] for row, g in zip(learned, gold)]),
            confidence=np.asarray([row.max() for row in learned]),
            correct=np.asarray([row.argmax() == g for row, g in zip(learned, gold)]),
            answers=np.concatenate(learned),
            default_scores=np.asarray([1.0 - row[g] for row, g in zip(default, gold)]),
            default_answers=np.concatenate(default),
        )
