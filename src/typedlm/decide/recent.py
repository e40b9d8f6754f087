"""Recent answers, held so that a label may name one by its id (`x_id`) and cost no second forward.

    recent = RecentAnswers(max_bytes=128 << 20, max_age_s=86400.0)
    response = recent.remember(response, questions, method, family_of)   # each answer gets an id and is held
    answers = recent.held(["Zq3...", ...])                                # the answers, or AnswerNotHeld
    recent.suggest("3f2a...", 10)                                         # what to label next

Each answer is held with what a label of it stores and learns from, exactly what its response was built from: its
question id and question (as parsed), its reads (each read's label masses, and their content-free priors where the
calibration read them, as float64: the floats themselves; label lengths; the first read's features, float16), the
calibration it was answered under, its question family's key, how unsure it was and when it was answered.

Bounded twice: by bytes (`max_bytes`, counted as the arrays' bytes plus an estimate of the rest, `ENTRY_BYTES` and
the question's size) and by age (`max_age_s`); the oldest answers go first, and an answer past its age is never
found even before it is let go. Thread-safe: one lock (the model's finishing thread remembers answers while the
feedback thread takes them).

What to label next (`suggest`): a random draw (uniform, without replacement, over the answers held that no label has
named and no earlier draw gave) whose labels are a fair sample of the traffic and feed the guarantees, and,
separately, the answers whose labels would teach most: the most unsure of the rest (`uncertainty`: the entropy of
the answer's probabilities over the log of their number, 0 for a sure answer, 1 for a uniform one), handed out once
each. Those are not a fair draw: a label of one is stored "chosen" whatever its post says (`Held.sample`).
"""

from __future__ import annotations

import heapq
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from typedlm.calibrate.reads import Reads
from typedlm.core.answers import Answer, NoulAnswer, Response
from typedlm.core.errors import AnswerNotHeld
from typedlm.core.labeling import MAX_SUGGESTIONS, answer_id
from typedlm.core.questions import Question
from typedlm.core.settings import ANSWER_WINDOW_MB, ANSWER_WINDOW_S

DEFAULT_MAX_BYTES = ANSWER_WINDOW_MB << 20
DEFAULT_MAX_AGE_S = ANSWER_WINDOW_S
ENTRY_BYTES = 900  # what an answer held takes beyond its arrays and question: the entry, its id, three arrays'
# headers, its slot in the table (measured with tracemalloc on yes/no and 3-option answers: tests/decide/test_recent.py)
RANDOM, TEACH = "random", "teach"  # how an answer was handed out


@dataclass(slots=True, eq=False)
class Held:
    """One answer held (see the module)."""

    question_id: str
    question: Question
    kind: str
    masses: np.ndarray  # [reads, answers] float64
    priors: np.ndarray | None  # [reads, answers] float64, where the calibration read them
    lengths: tuple[int, ...] | None  # each answer's label length in tokens, where options were read by name
    features: np.ndarray | None  # [dims] float16: the first read's projected hidden state
    method: str  # the calibration it was answered under
    family: str  # its question's family key
    uncertainty: float  # normalised entropy of the answer's probabilities
    answered: float  # time.monotonic() when it was answered
    nbytes: int
    handed_out: str | None = None  # RANDOM or TEACH, once a suggestion gave it
    labeled: bool = False

    def reads(self) -> Reads:
        """The reads as its response read them, for `Feedback.post`: the same floats."""
        return Reads(
            self.kind,
            self.masses.tolist(),
            None if self.priors is None else self.priors.tolist(),
            None if self.lengths is None else list(self.lengths),
            self.features,
        )

    def sample(self, posted: str) -> str:
        """How a label of it was picked: "chosen" where its post says so or a suggestion gave it to teach."""
        return "chosen" if posted == "chosen" or self.handed_out == TEACH else "random"


@dataclass(frozen=True)
class Suggestions:
    """What to label next (see the module)."""

    family: str | None
    answers: int  # answers held (of the family) that no label has named
    drawable: int  # of them, those no earlier random draw gave: what this one was drawn from
    random: list[str] = field(default_factory=list)
    teach: list[str] = field(default_factory=list)
    uncertainty: list[float] = field(default_factory=list)  # of each answer to teach

    def to_wire(self) -> dict[str, Any]:
        return {
            "object": "feedback_suggestions",
            "family": self.family,
            "answers": self.answers,
            "drawable": self.drawable,
            "random": self.random,
            "teach": self.teach,
            "teach_by": "entropy",
            "teach_uncertainty": self.uncertainty,
        }


def probabilities(answer: Answer) -> Sequence[float]:
    """An answer's probabilities in its question's answer order."""
    if isinstance(answer, NoulAnswer):
        return (answer.p_yes, 1.0 - answer.p_yes)
    return tuple(answer.probabilities.values()) if isinstance(answer.probabilities, Mapping) else answer.probabilities


def uncertainty(probs: Sequence[float]) -> float:
    """The entropy of `probs` over the log of their number: 0 sure, 1 uniform."""
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    return entropy / math.log(len(probs)) if len(probs) > 1 else 0.0


def _matrix(rows: list[list[float]] | None) -> np.ndarray | None:
    return None if rows is None else np.asarray(rows, dtype=np.float64)


class RecentAnswers:
    """The window of recent answers (see the module)."""

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        origin: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ):
        assert max_bytes > 0 and max_age_s > 0, "a window holds something for some time"
        self.max_bytes, self.max_age_s, self.origin = max_bytes, max_age_s, origin
        self._clock = clock
        self._rng = rng or random.SystemRandom()
        self._held: OrderedDict[str, Held] = OrderedDict()  # oldest first
        self._lock = threading.Lock()
        self.nbytes = 0
        self.evicted = 0  # answers let go of, for their bytes or their age
        self.labeled_by_id = 0  # answers labeled by their id
        self.not_held = 0  # ids asked for and not held

    def remember(
        self,
        response: Response,
        questions: Mapping[str, Question],
        method: str,
        family_of: Callable[[Question], str],
    ) -> Response:
        """Hold every answer of `response` (built with its reads kept: `Response.reading`) under a new id; return
        the response with each answer's id in it (`x_id`)."""
        reads = response.reading.reads
        now = self._clock()
        answers, entries = {}, []
        for qid, answer in response.answers.items():
            read, question = reads[qid], questions[qid]
            masses, priors = _matrix(read.masses), _matrix(read.priors)
            lengths = None if read.lengths is None else tuple(read.lengths)
            features = read.features
            size = ENTRY_BYTES + len(repr(question)) + masses.nbytes + 8 * len(lengths or ())
            size += (priors.nbytes if priors is not None else 0) + (features.nbytes if features is not None else 0)
            held = Held(
                qid,
                question,
                read.kind,
                masses,
                priors,
                lengths,
                features,
                method,
                family_of(question),
                uncertainty(probabilities(answer)),
                now,
                size,
            )
            key = answer_id(self.origin)
            entries.append((key, held))
            answers[qid] = replace(answer, extras={**answer.extras, "id": key})
        with self._lock:
            for key, held in entries:
                self._held[key] = held
                self.nbytes += held.nbytes
            self._evict(now)
        return replace(response, answers=answers)

    def _evict(self, now: float) -> None:
        """Let the oldest answers go while over the bytes, and those past their age (the lock held)."""
        while self._held:
            key, oldest = next(iter(self._held.items()))
            if self.nbytes <= self.max_bytes and now - oldest.answered <= self.max_age_s:
                return
            del self._held[key]
            self.nbytes -= oldest.nbytes
            self.evicted += 1

    def held(self, ids: Sequence[str]) -> list[Held]:
        """The answers `ids` name, in order.

        Raises:
            AnswerNotHeld: naming every id not held (never given, or let go of).
        """
        with self._lock:
            self._evict(self._clock())
            missing = [key for key in ids if key not in self._held]
            if missing:
                self.not_held += len(missing)
                raise AnswerNotHeld(missing)
            return [self._held[key] for key in ids]

    def labeled(self, answers: Sequence[Held]) -> None:
        """Note `answers` as labeled by their ids: no suggestion gives them again."""
        with self._lock:
            for held in answers:
                held.labeled = True
            self.labeled_by_id += len(answers)

    def suggest(self, family: str | None, n: int) -> Suggestions:
        """Up to `n` answers of `family` (None: any) drawn at random, and up to `n` others to teach (see the module);
        each is marked as handed out, so that the next suggestion gives others."""
        assert 0 < n <= MAX_SUGGESTIONS, f"1 to {MAX_SUGGESTIONS} suggestions"
        with self._lock:
            self._evict(self._clock())
            pool = [
                (key, held)
                for key, held in self._held.items()
                if not held.labeled and (family is None or held.family == family)
            ]
            undrawn = [(key, held) for key, held in pool if held.handed_out != RANDOM]
            drawn = self._rng.sample(undrawn, min(n, len(undrawn)))
            for _, held in drawn:
                held.handed_out = RANDOM  # a fair draw, even of an answer handed out to teach before
            rest = [(key, held) for key, held in pool if held.handed_out is None]
            teach = heapq.nlargest(n, rest, key=lambda pair: pair[1].uncertainty)
            for _, held in teach:
                held.handed_out = TEACH
        return Suggestions(
            family,
            len(pool),
            len(undrawn),
            [key for key, _ in drawn],
            [key for key, _ in teach],
            [held.uncertainty for _, held in teach],
        )

    def stats(self) -> dict[str, float]:
        """Answers held and their bytes, the bound, answers let go of, labeled by id, and ids not held."""
        with self._lock:
            return {
                "entries": len(self._held),
                "bytes": self.nbytes,
                "max_bytes": self.max_bytes,
                "max_age_seconds": self.max_age_s,
                "evictions": self.evicted,
                "labeled_by_id": self.labeled_by_id,
                "not_held": self.not_held,
            }
