"""Calibrators: one object per calibration method, each turning a question's reads into its answer.

    answer = calibrator.answer(question, reads)   # every read calibrated, then averaged, then typed

Every calibrator has the same small interface (`Calibrator`): its method (`method`, what `x_calibration` says of it),
whether it needs the content-free priors of the reads (`needs_prior`), `answer`, and `reported` (the method a
response's answers were in fact given by). Each owns its arithmetic, from `typedlm.calibrate.calibration`; nothing
switches on a method's name:

- `RawCalibrator`: masses divided by their total;
- `ContextualCalibrator`: the content-free label prior divided out. It owns the priors: a byte-bounded cache
  of them per suffix text, and `priors`, which reads every missing one in one batched forward on the
  content-free document (the forward itself is the decider's, passed in);
- `FittedCalibrator`: a `CalibrationFile` on top of its base method, per question where the file knows the
  question, else per kind, or its feature calibrator.

The calibrator learned from users' gold answers builds on these (`typedlm.calibrate.feedback`); the set a decider
offers, resolved once from its options, is `typedlm.calibrate.methods.Calibrators`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from typedlm.calibrate.calibration import (
    BASES,
    CalibrationFile,
    ReadRule,
    calibrate_reads,
    combined_prior,
    contextual,
    raw,
    signature,
)
from typedlm.calibrate.decisions import hand_over
from typedlm.calibrate.out_of_fold import Served
from typedlm.calibrate.reads import Reads
from typedlm.core.answers import Answer
from typedlm.core.bounded import BoundedCache, ids_bytes, text_bytes
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import Handover, Question

PRIOR_CACHE_BYTES = 16 << 20  # content-free masses remembered, per suffix text


class Calibrator(Protocol):
    """What every calibration method offers the decider."""

    method: CalibrationMethod  # its name on the wire: what `x_calibration` says
    needs_prior: bool  # whether `answer` reads the reads' content-free priors (`Reads.priors`)

    def answer(self, question: Question, reads: Reads) -> Answer:
        """The question's answer from its reads (each in the question's own option order)."""
        ...

    def reported(self, answers: Iterable[Answer]) -> CalibrationMethod:
        """The method these answers (of one response) were given by: `method`, or a method it stood back for."""
        ...

    def hand_over(self, question: Question, reads: Reads, answer: Answer, handover: Handover) -> Answer:
        """`answer` (this calibrator's, from `reads`) with its set and abstention (`decisions.hand_over`)."""
        ...


def wire_probs(question: Question, answer: Answer) -> list[float]:
    """An answer's probabilities in its question's answer order."""
    return list(question.wire_probabilities(answer.to_wire()))


def _extras(reads: Reads, stderr: float, agreement: float) -> dict[str, Any]:
    """What an answer read in several option orders says about them (nothing for one read)."""
    return {"stderr": stderr, "agreement": agreement, "reads": len(reads.masses)} if len(reads.masses) > 1 else {}


class RawCalibrator:
    """Each read's masses divided by their total, then the reads averaged. `length_normalised`: choices read by
    name are length-normalised first (`calibration.per_token`)."""

    method = CalibrationMethod.RAW
    needs_prior = False
    rule: ReadRule = staticmethod(raw)  # one read's arithmetic

    def __init__(self, length_normalised: bool = False):
        self.length_normalised = length_normalised

    def lengths(self, reads: Reads) -> list[int] | None:
        """The label lengths to normalise by, where this calibrator normalises."""
        return reads.lengths if self.length_normalised else None

    def answer(self, question: Question, reads: Reads) -> Answer:
        probs, mass, stderr, agreement = calibrate_reads(self.rule, reads.masses, reads.priors, self.lengths(reads))
        return question.answer(probs, mass, _extras(reads, stderr, agreement))

    def reported(self, answers: Iterable[Answer]) -> CalibrationMethod:
        return self.method

    def hand_over(self, question: Question, reads: Reads, answer: Answer, handover: Handover) -> Answer:
        """No labels are scored under this calibration: every answer in the set, every answer abstaining."""
        return hand_over(question, answer, Served.alone(wire_probs(question, answer)), None, None, handover)


class ContextualCalibrator(RawCalibrator):
    """Each read's masses with its content-free prior divided out (Zhao et al., 2021), then averaged.

    `content_free(versions)`: the masses of each question version on the content-free document, from one forward;
    `priors(versions, texts)` serves them from this calibrator's cache, keyed by each version's suffix text (the
    content-free prompt is the same for the same suffix text), and reads only the missing ones."""

    method = CalibrationMethod.CONTEXTUAL
    needs_prior = True
    rule: ReadRule = staticmethod(contextual)

    def __init__(
        self,
        content_free: Callable[[list[Question]], list[list[float]]],
        length_normalised: bool = False,
        cache_bytes: int = PRIOR_CACHE_BYTES,
    ):
        super().__init__(length_normalised)
        self.content_free = content_free
        self.cache: BoundedCache[str, list[float]] = BoundedCache("priors", cache_bytes)  # suffix text -> masses

    def priors(self, versions: Sequence[Question], texts: Sequence[str]) -> list[list[float]]:
        """The content-free masses of each question version (`texts`: their suffix texts), the missing ones read in
        one forward."""
        found = {text: self.cache.get(text) for text in texts}
        missing = {text: i for i, text in enumerate(texts) if found[text] is None}
        if missing:
            masses = self.content_free([versions[i] for i in missing.values()])
            for text, m in zip(missing, masses):
                found[text] = self.cache.put(text, m, text_bytes(text) + ids_bytes(m))
        return [found[text] for text in texts]


class FittedCalibrator(RawCalibrator):
    """A calibration file fitted for this model (`CalibrationFile`), applied on top of its base method.

    A question the file knows by its signature (`prompt_version`'s words) gets its own parameters; else an answer
    of a kind the file has a feature calibrator for goes through it (its reads combined by the calibrator's base),
    else its kind's parameters."""

    method = CalibrationMethod.FITTED

    def __init__(self, file: CalibrationFile, prompt_version: str, length_normalised: bool = False):
        super().__init__(length_normalised)
        self.file = file
        self.prompt_version = prompt_version

    @property
    def needs_prior(self) -> bool:
        return self.file.needs_prior

    def answer(self, question: Question, reads: Reads) -> Answer:
        file, kind = self.file, reads.kind
        key = signature(question, self.prompt_version) if file.questions else None
        # a file's feature calibrator reads the combined reads: each read is then calibrated by its base only
        calibrator = file.uses_calibrator(kind, key)
        rule = BASES[file.base_of(kind)] if calibrator else file.reader(kind, key)
        lengths = self.lengths(reads)
        probs, mass, stderr, agreement = calibrate_reads(rule, reads.masses, reads.priors, lengths)
        if calibrator:
            weighs_prior = file.calibrator[kind].get("prior_weight")  # else the prior is not needed
            prior = combined_prior(reads.priors, lengths) if weighs_prior and reads.priors else None
            probs = file.calibrate(kind, probs, mass, 1.0 - agreement, prior)
        return question.answer(probs, mass, _extras(reads, stderr, agreement))
