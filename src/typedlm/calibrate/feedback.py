"""Calibration learned from users' gold answers: the feedback calibrator, and the service between it and the store.

    feedback = Feedback(store, calibrator, model=..., fingerprint=..., reading=...)   # the decider builds it
    levels = feedback.post(questions, reading, gold, feedback_id)   # labels stored, then every new label learned
    feedback.report()                                               # per question family: is it honest?

`FeedbackCalibrator` (method "feedback") is the decider's default calibrator, `base`, with what the labels taught on
top: the mean of the fold models (`typedlm.calibrate.out_of_fold`), each the learner (`typedlm.calibrate.learning`)
fitted on the labels outside its fold and the readouts learned from those labels' features where one has earned its
place (`typedlm.calibrate.readout`). The answer shown, its set and its certificate all come from those fold models
(`typedlm.calibrate.decisions`). An answer whose question has no labels at any level is the base's answer,
unchanged; one that used labels says so, and whether a learned readout read it (in any fold):
`"x_feedback": {"level": "family", "labels": 37, "readout": "calibrated"}` ("learned": a learned readout too).

`Feedback` keeps the fold models in step with the store (`typedlm.store.feedback`): every label is written to the store
first and learned from the store (`sync`, the labels after the last id seen), so labels posted to another process on
the same file (a replica) are learned the same way, within `POLL_S` by a poll thread. A label keeps what the model
read (masses, priors, label lengths), never re-read: a refit needs no model. Labels are learned only where they
mean the same thing: the same weights (fingerprint), prompt wording and way of reading choices.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from typedlm.calibrate.calibrators import Calibrator, wire_probs
from typedlm.calibrate.decisions import Decisions, hand_over
from typedlm.calibrate.guarantees import THRESHOLDS, Scored, automated_share, certify, split_quantile
from typedlm.calibrate.learning import Learner, Sample, question_keys
from typedlm.calibrate.out_of_fold import OutOfFold, Served
from typedlm.calibrate.projection import FEATURES_VERSION, decode, encode
from typedlm.calibrate.reads import Reads
from typedlm.calibrate.reliability import ece, floor_eces, reliability
from typedlm.core.answers import Answer
from typedlm.core.errors import InvalidRequest, StoreError
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import Handover, Question, parse_question, question_to_wire
from typedlm.store.feedback import FeedbackStore
from typedlm.store.labels import Label

logger = logging.getLogger(__name__)

POLL_S = 1.0  # how often a process looks for labels other processes stored
REPORT_FOLDS = 5  # the report's cross-validation
REPORT_MIN_LABELS = 10  # a family's calibration is measured from this many labels on
REPORT_MAX_LABELS = 2000  # ... on its latest this many labels (read from the store)
REPORT_MAX_FAMILIES = 100  # the report lists the most labeled this many families
REPORT_ACCURACIES = (0.9, 0.95, 0.99)  # the report's automated shares: answers certified this accurate
REPORT_COVERAGES = (0.8, 0.9, 0.95)  # the report's mean set sizes
SYNC_ROWS = 5000  # labels read from the store at a time
FLOOR = 1e-12


def disagreement(answer: Answer) -> float:
    """The share of order reads that disagreed with the top answer (0 with one read)."""
    return 1.0 - answer.extras.get("agreement", 1.0)


class FeedbackCalibrator:
    """`base` with what the labels taught on top: the fold models' mean (see the module)."""

    method = CalibrationMethod.FEEDBACK

    def __init__(self, base: Calibrator, prompt_version: str, out_of_fold: OutOfFold | None = None):
        self.base = base
        self.prompt_version = prompt_version
        # the served model: fold models that each never saw one fold of the labels, whose scores of those labels
        # are the guarantees' data, and whose mean is every answer shown
        self.out_of_fold = out_of_fold or OutOfFold()
        self.decisions = Decisions(self.out_of_fold)

    @property
    def needs_prior(self) -> bool:
        return self.base.needs_prior

    def keys(self, question: Question) -> dict[str, str]:
        return question_keys(question, self.prompt_version)

    def sample(self, question: Question, reads: Reads, gold: int) -> Sample:
        """A labeled answer as the learner sees it: the base's answer and the gold answer's index."""
        answer = self.base.answer(question, reads)
        return Sample(tuple(wire_probs(question, answer)), answer.raw_mass, disagreement(answer), gold)

    def served(
        self, question: Question, reads: Reads, keys: dict[str, str] | None = None, readouts: bool = True
    ) -> tuple[Answer, Served]:
        """The base's answer, and the fold models' answers for it (`OutOfFold.answer`; without `readouts`, their
        learners' alone); `keys`: the question's, where already known."""
        base = self.base.answer(question, reads)
        served = self.out_of_fold.answer(
            keys or self.keys(question),
            question.kind,
            wire_probs(question, base),
            base.raw_mass,
            disagreement(base),
            reads.features if readouts else None,
        )
        return base, served

    def answer(self, question: Question, reads: Reads) -> Answer:
        base, served = self.served(question, reads)
        if served.used is None:
            return base
        feedback = {**served.used.to_wire(), "readout": "learned" if served.readouts else "calibrated"}
        return question.answer(served.probs, base.raw_mass, {**base.extras, "feedback": feedback})

    def hand_over(self, question: Question, reads: Reads, answer: Answer, handover: Handover) -> Answer:
        """`answer` with its set and abstention, from the question's fair labels as the fold models scored them,
        applied to the fold models' answers that `answer` shows."""
        keys = self.keys(question)
        _, served = self.served(question, reads, keys)
        return hand_over(question, answer, served, keys, self.decisions, handover)

    def reported(self, answers: Iterable[Answer]) -> CalibrationMethod:
        """Feedback where any answer used what was learned; else every answer is the base's, and says so."""
        return self.method if any("feedback" in answer.extras for answer in answers) else self.base.method

    def in_force(self, question: Question) -> dict[str, Any]:
        """The most specific level with labels for `question`, and their count ("default", 0: none)."""
        keys = self.keys(question)
        used = self.out_of_fold.used(keys)
        if used is None:
            return {"level": "default", "labels": 0}
        learned = self.out_of_fold.learned_readout(keys, question.kind, question.size)
        return {**used.to_wire(), "readout": "learned" if learned else "calibrated"}


class Feedback:
    """The feedback store and the learner, in step (see the module). Thread-safe; `start` polls for labels that
    other processes store, `close` stops that and closes the store."""

    def __init__(
        self,
        store: FeedbackStore,
        calibrator: FeedbackCalibrator,
        *,
        model: str,
        fingerprint: str,
        reading: str,
        poll_s: float = POLL_S,
    ):
        self.store = store
        self.calibrator = calibrator
        self.model, self.fingerprint, self.reading = model, fingerprint, reading
        self.poll_s = poll_s
        self.last_id = 0  # the last label learned
        self.learned = 0
        self.skipped = 0  # labels that cannot be learned here (no priors where the base needs them)
        self.families: dict[str, int] = {}  # labels learned per family (the report reads them from the store)
        self.described: dict[str, dict[str, Any]] = {}  # per family: its kind and first question's instructions
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._report: tuple[int, dict[str, Any]] | None = None

    # -- learning ----------------------------------------------------------------------------------------------

    def _stored(self, **where: Any) -> list[Label]:
        """Labels from the store that mean here what they meant when posted (see the module)."""
        return self.store.labels(
            fingerprint=self.fingerprint, prompt_version=self.calibrator.prompt_version, reading=self.reading, **where
        )

    def sync(self) -> int:
        """Learn every label stored since the last one learned (`SYNC_ROWS` at a time); return how many."""
        with self._lock:
            total = 0
            while labels := self._stored(after=self.last_id, limit=SYNC_ROWS):
                labeled = []
                for label in labels:
                    item = self._labeled(label)
                    if item is None:
                        self.skipped += 1
                        continue
                    labeled.append((label.id, *item, _features(label), label.sample == "random"))
                    self.families[label.family] = self.families.get(label.family, 0) + 1
                    self.described.setdefault(
                        label.family, {"kind": label.kind, "instructions": label.question.get("instructions")}
                    )
                self.calibrator.out_of_fold.add(labeled)
                self.last_id = labels[-1].id
                self.learned += len(labeled)
                total += len(labels)
            return total

    def _labeled(self, label: Label) -> tuple[dict[str, str], Sample] | None:
        """A stored label as the learner takes it: its question's keys and its sample (None: it cannot be learned
        here, having no priors where the base needs them)."""
        if self.calibrator.needs_prior and label.priors is None:
            return None
        question = parse_question(label.question, ("question",))
        reads = Reads(label.kind, label.masses, label.priors, label.lengths)
        keys = {"exact": label.exact, "family": label.family, "kind": label.kind}
        return keys, self.calibrator.sample(question, reads, label.gold)

    def post(
        self,
        questions: Mapping[str, Question],
        reads: Mapping[str, Reads],
        gold: Mapping[str, int],
        feedback_id: str | None = None,
        sample: str = "random",
    ) -> tuple[int, dict[str, dict[str, Any]]]:
        """Store the labeled questions' reads with their gold answers (one transaction), learn them, and return how
        many were stored (0: `feedback_id` was posted before) and, per labeled question, the calibration now in
        force for it (`FeedbackCalibrator.in_force`)."""
        labels = [
            Label(
                question_id=qid,
                model=self.model,
                fingerprint=self.fingerprint,
                prompt_version=self.calibrator.prompt_version,
                reading=self.reading,
                **self.calibrator.keys(questions[qid]),  # kind, exact, family
                question=question_to_wire(questions[qid]),
                masses=reads[qid].masses,
                priors=reads[qid].priors,
                lengths=reads[qid].lengths,
                gold=index,
                sample=sample,
                **_stored_features(reads[qid]),
            )
            for qid, index in gold.items()
        ]
        stored = self.store.add(labels, feedback_id)
        self.sync()
        return len(stored or ()), {qid: self.calibrator.in_force(questions[qid]) for qid in gold}

    def settle(self) -> None:
        """Return once every label stored so far is learned, readouts included (they learn on a thread of their
        own: `OutOfFold`); for a batch job or a test that reads answers right after posting."""
        self.sync()
        self.calibrator.out_of_fold.settle()

    def stats(self) -> dict[str, float]:
        """Labels learned from the store, those that cannot be (see `sync`), the samples the fold learners hold
        (their latest) and the bytes of those and of the fair labels' records, and the learned readouts in force
        (levels where any fold has one) and the bytes of the labels they hold."""
        folds = self.calibrator.out_of_fold
        readouts = folds.readouts
        return {
            "labels": self.learned,
            "not_learned": self.skipped,
            "held": folds.held,
            "bytes": folds.nbytes,
            "readouts": len(readouts.snapshot),
            "readout_bytes": readouts.held_bytes,
        }

    # -- polling -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Learn what is stored now, then poll every `poll_s` for labels other processes store; the out-of-fold
        models' readouts learn on a thread of their own (`OutOfFold.start`)."""
        self.sync()
        self.calibrator.out_of_fold.start()
        if self._thread is None and self.poll_s > 0:
            self._thread = threading.Thread(target=self._poll, name="typedlm-feedback", daemon=True)
            self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.sync()
            except StoreError as exc:  # a locked or vanished file: said, and tried again at the next poll
                logger.warning("typedlm: reading the feedback database failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.calibrator.out_of_fold.close()
        self.store.close()

    # -- the report --------------------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Per question family (the most labeled first): its labels, and the default's and the learned
        calibration's accuracy, log loss and ECE on them, cross-validated (`REPORT_FOLDS` folds: each label
        scored by a fit on the others), each ECE beside its noise floor and with its reliability bins; and what
        it may hand over (`handover_report`). Families past
        the `REPORT_MAX_FAMILIES` most labeled are counted, not listed; each is measured on its latest
        `REPORT_MAX_LABELS` labels (`measured_on`)."""
        self.sync()
        with self._lock:
            if self._report is not None and self._report[0] == self.last_id:
                return self._report[1]
            families = sorted(self.families.items(), key=lambda item: (-item[1], item[0]))
            rows = []
            for family, count in families[:REPORT_MAX_FAMILIES]:
                stored = self._stored(family=family, limit=REPORT_MAX_LABELS, latest=True)
                labeled = [item for item in map(self._labeled, stored) if item is not None]
                row = {"family": family, **self.described[family], "labels": count, "measured_on": len(labeled)}
                scored = self.calibrator.out_of_fold.scored("family", family)
                rows.append({**row, **_measured(labeled), "handover": handover_report(scored)})
            report = {
                "object": "feedback_report",
                "model": self.model,
                "database": str(self.store.path),
                "labels": self.learned,
                "not_learned": self.skipped,
                "families_labeled": len(families),
                "families": rows,
            }
            self._report = (self.last_id, report)
            return report


def _stored_features(reads: Reads) -> dict[str, str | None]:
    """A label's features fields: its reads' features, encoded, and their version (none where not read)."""
    if reads.features is None:
        return {}
    return {"features": encode(reads.features), "features_version": FEATURES_VERSION}


def _features(label: Label) -> np.ndarray | None:
    """A stored label's features where they were made as this version makes them (else None: not used)."""
    if label.features is None or label.features_version != FEATURES_VERSION:
        return None
    return decode(label.features)


def _scores(samples: Sequence[Sample], probs: Sequence[Sequence[float]]) -> dict[str, Any]:
    top = np.asarray([max(range(len(p)), key=p.__getitem__) for p in probs])
    gold = np.asarray([s.gold for s in samples])
    confidences = np.asarray([max(p) for p in probs])
    correct = top == gold
    return {
        "accuracy": float(correct.mean()),
        "log_loss": float(np.mean([-math.log(max(p[s.gold], FLOOR)) for p, s in zip(probs, samples)])),
        "ece": ece(confidences, correct),
        "ece_floor90": float(np.quantile(floor_eces(confidences), 0.9)),
        "reliability": reliability(confidences, correct),
    }


def _measured(labeled: list[tuple[dict[str, str], Sample]]) -> dict[str, Any]:
    """A family's labels scored under the default and, cross-validated, under calibration learned from the rest of
    them (each fold's learner knows this family's labels only)."""
    samples = [sample for _, sample in labeled]
    default = _scores(samples, [s.probs for s in samples])
    if len(samples) < REPORT_MIN_LABELS:
        return {"default": default, "feedback": None}
    learned: list[Sequence[float]] = [()] * len(samples)
    for fold in range(REPORT_FOLDS):
        learner = Learner()
        learner.add(item for i, item in enumerate(labeled) if i % REPORT_FOLDS != fold)
        for i in range(fold, len(samples), REPORT_FOLDS):
            keys, s = labeled[i]
            learned[i] = learner.calibrate(keys, s.probs, s.mass, s.disagreement)[0]
    return {"default": default, "feedback": _scores(samples, learned)}


def handover_report(scored: Scored | None) -> dict[str, Any] | None:
    """What a family's fair labels, scored out of fold, say a team may hand over: the share of its labeled answers
    that could be committed at each of `REPORT_ACCURACIES` (certified as `x_min_accuracy` would be), the mean set
    size at each of `REPORT_COVERAGES`, and accuracy against the share committed over the threshold grid (the
    curve a team picks its operating point on). None under `REPORT_MIN_LABELS` fair labels."""
    if scored is None or len(scored) < REPORT_MIN_LABELS:
        return None
    automation = []
    for target in REPORT_ACCURACIES:
        certificate = certify(scored.confidence, scored.correct, target)
        automation.append({
            "min_accuracy": target,
            "share": automated_share(scored.confidence, certificate),
            "threshold": None if certificate is None else certificate.confidence,
            "labels": 0 if certificate is None else certificate.labels,
        })  # fmt: skip
    sets = []
    for coverage in REPORT_COVERAGES:
        q = split_quantile(scored.scores, 1 - coverage)
        sets.append({"coverage": coverage, "mean_size": scored.mean_size(q), "guaranteed": q is not None})
    curve = []
    for tau in sorted(THRESHOLDS):
        chosen = scored.confidence >= tau - 1e-12
        if chosen.any():
            curve.append(
                {"confidence": tau, "share": float(chosen.mean()), "accuracy": float(scored.correct[chosen].mean())}
            )
    return {
        "fair_labels": len(scored),
        "answers": len(scored.answers) / len(scored),
        "automation": automation,
        "sets": sets,
        "curve": curve,
    }


def feedback_needed() -> InvalidRequest:
    """The refusal of a feedback post (or report) where no feedback database is open."""
    return InvalidRequest("gold answers need a feedback database (typedlm serve --feedback-db PATH; none is open)")
