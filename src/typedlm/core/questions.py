"""Questions: the typed, validated form of a `/v1/systemone` request. Plain data, no model.

`parse_request(body)` turns a decoded JSON body into a `Request` or raises `InvalidRequest` with the
path of the offending value and a message that says what to change. The rules follow the Jev API:
state is a string, object or array; a question is `noul` (yes/no), `choice` (2..255 named options)
or `score` (2..10 ordered levels). Text fields (instructions, descriptions, levels) may be strings,
objects or arrays; prompt rendering decides how they read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from typedlm.core.answers import ChoiceAnswer, NoulAnswer, ScoreAnswer, Text
from typedlm.core.confidence import choice_confidence, score_confidence
from typedlm.core.errors import InvalidRequest
from typedlm.core.names import CalibrationMethod, Kind

MIN_OPTIONS = 2
MAX_OPTIONS = 255
MIN_LEVELS = 2
MAX_LEVELS = 10
QUESTION_TYPES = tuple(Kind)  # the `kind` of each question class below
CALIBRATION_METHODS = tuple(CalibrationMethod)  # see typedlm.calibrate.calibrators
MAX_ORDER_READS = 8  # option orders read per choice/score question (x_order_reads)
MAX_FEEDBACK_ID_CHARS = 200  # x_feedback_id: a client's idempotency id for a feedback post
SAMPLES = ("random", "chosen")  # x_sample: how a feedback post's labels were picked
MAX_CHARS_PER_TOKEN = 32  # no tokenizer packs more text than this into one token of real text: text longer than
# this many characters per token of a limit is over it before it is tokenized (a name, a request's text)

YES, NO = 0, 1  # a noul question's answers, in the order of its probabilities everywhere: [p_yes, p_no]

# Every question type has the same small interface, so no caller asks which type it holds:
#   kind                 "noul", "choice" or "score" (its wire name)
#   size                 how many answers it has (its probabilities' length)
#   reorderable          whether its answers may be shown in another order (`reordered`)
#   answer(probs, ...)   its typed answer from probabilities in its own answer order
#   gold_index(gold)     a labeled gold answer as an index into those probabilities (ValueError if invalid)
#   wire_probabilities   a wire answer's probabilities in that order
#   answer_keys()        each answer as an answer set names it (noul true/false, choice its name, score "i")


@dataclass(frozen=True)
class NoulQuestion:
    """A yes/no question; `true`/`false` say what counts as yes and as no. Answers: [yes, no]."""

    instructions: Text | None = None
    true: Text | None = None
    false: Text | None = None

    kind: ClassVar[Kind] = Kind.NOUL
    size: ClassVar[int] = 2
    reorderable: ClassVar[bool] = False  # the prompt asks "yes or no"

    def answer(self, probs: Sequence[float], raw_mass: float, extras: dict[str, Any]) -> NoulAnswer:
        return NoulAnswer(probs[YES], raw_mass, extras)

    def gold_index(self, gold: Any) -> int:
        if not isinstance(gold, bool):
            raise ValueError("true or false")
        return YES if gold else NO

    def wire_probabilities(self, answer: Mapping[str, Any]) -> tuple[float, ...]:
        return (answer["noul"], 1 - answer["noul"])

    def answer_keys(self) -> tuple[bool, ...]:
        return (True, False)


@dataclass(frozen=True)
class ChoiceQuestion:
    """Pick one of `options`: (name, description or None) pairs, in request order.

    `by_name`: the options are answered by their names instead of by letters (a way of reading the question that
    the decider chooses; a request never sets it)."""

    options: tuple[tuple[str, Text | None], ...]
    instructions: Text | None = None
    by_name: bool = False

    kind: ClassVar[Kind] = Kind.CHOICE
    reorderable: ClassVar[bool] = True

    @property
    def size(self) -> int:
        return len(self.options)

    def reordered(self, order: Sequence[int]) -> ChoiceQuestion:
        """The same question with option `order[j]` shown in position j."""
        return ChoiceQuestion(tuple(self.options[i] for i in order), self.instructions, self.by_name)

    def answer(self, probs: Sequence[float], raw_mass: float, extras: dict[str, Any]) -> ChoiceAnswer:
        by_name = {name: p for (name, _), p in zip(self.options, probs)}
        return ChoiceAnswer(by_name, choice_confidence(probs), raw_mass, extras)

    def gold_index(self, gold: Any) -> int:
        names = [name for name, _ in self.options]
        if not isinstance(gold, str) or gold not in names:
            raise ValueError(f"one of {names}")
        return names.index(gold)

    def wire_probabilities(self, answer: Mapping[str, Any]) -> tuple[float, ...]:
        return tuple(answer["probabilities"][name] for name, _ in self.options)

    def answer_keys(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.options)


@dataclass(frozen=True)
class ScoreQuestion:
    """Rate on ordered `levels`; level i scores i."""

    levels: tuple[Text, ...]
    instructions: Text | None = None

    kind: ClassVar[Kind] = Kind.SCORE
    reorderable: ClassVar[bool] = True

    @property
    def size(self) -> int:
        return len(self.levels)

    def reordered(self, order: Sequence[int]) -> ScoreQuestion:
        """The same question with level `order[j]`'s description shown as level j."""
        return ScoreQuestion(tuple(self.levels[i] for i in order), self.instructions)

    def answer(self, probs: Sequence[float], raw_mass: float, extras: dict[str, Any]) -> ScoreAnswer:
        return ScoreAnswer(tuple(probs), self.levels, score_confidence(probs), raw_mass, extras)

    def gold_index(self, gold: Any) -> int:
        if type(gold) is not int or not 0 <= gold < len(self.levels):
            raise ValueError(f"a level index 0..{len(self.levels) - 1}")
        return gold

    def wire_probabilities(self, answer: Mapping[str, Any]) -> tuple[float, ...]:
        return tuple(answer["probabilities"][str(i)] for i in range(len(self.levels)))

    def answer_keys(self) -> tuple[str, ...]:
        return tuple(str(i) for i in range(len(self.levels)))


Question = NoulQuestion | ChoiceQuestion | ScoreQuestion


@dataclass(frozen=True)
class Handover:
    """What a request asks of its answers beyond probabilities (`typedlm.calibrate.decisions`): each answer's set at
    `coverage` (x_coverage) and whether it abstains below `min_accuracy` (x_min_accuracy); None: not asked."""

    coverage: float | None = None
    min_accuracy: float | None = None

    def __bool__(self) -> bool:
        return self.coverage is not None or self.min_accuracy is not None


@dataclass(frozen=True)
class Request:
    """A validated request: the model asked for (None: the server's own), the state, named questions."""

    state: Text
    questions: dict[str, Question]
    model: str | None = None
    calibration: CalibrationMethod | None = None  # x_calibration; None: the server's default
    order_reads: int | None = None  # x_order_reads; None: the server's default
    handover: Handover = Handover()  # x_coverage, x_min_accuracy


def _is_text(value: Any) -> bool:
    return isinstance(value, (str, dict, list))


def _optional_text(value: Any, loc: tuple[str | int, ...]) -> Text | None:
    if value is None or _is_text(value):
        return value
    raise InvalidRequest(f"must be a string, an object or an array, not {type(value).__name__}", loc)


def parse_state(value: Any) -> Text:
    if value is None:
        raise InvalidRequest("state is required: send the document as a string, an object or an array", ("state",))
    if not _is_text(value):
        raise InvalidRequest(f"state must be a string, an object or an array, not {type(value).__name__}", ("state",))
    return value


def parse_question(raw: Any, loc: tuple[str | int, ...]) -> Question:
    """One question object → a typed question, or `InvalidRequest`."""
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"a question must be an object, not {type(raw).__name__}", loc)
    kind = raw.get("type")
    instructions = _optional_text(raw.get("instructions"), (*loc, "instructions"))
    criteria = raw.get("criteria")
    if kind == "noul":
        return _parse_noul(instructions, criteria, (*loc, "criteria"))
    if kind == "choice":
        return _parse_choice(instructions, criteria, (*loc, "criteria"))
    if kind == "score":
        return _parse_score(instructions, criteria, (*loc, "criteria"))
    if kind == "box":
        raise InvalidRequest("box questions need a vision model; this model reads text only", (*loc, "type"))
    raise InvalidRequest(f"unknown question type {kind!r}; use one of {', '.join(QUESTION_TYPES)}", (*loc, "type"))


def _parse_noul(instructions: Text | None, criteria: Any, loc: tuple[str | int, ...]) -> NoulQuestion:
    if criteria is None:
        return NoulQuestion(instructions)
    if not isinstance(criteria, Mapping):
        raise InvalidRequest('noul criteria must be an object like {"true": "...", "false": "..."}', loc)
    true = _optional_text(criteria.get("true"), (*loc, "true"))
    false = _optional_text(criteria.get("false"), (*loc, "false"))
    return NoulQuestion(instructions, true, false)


def _parse_choice(instructions: Text | None, criteria: Any, loc: tuple[str | int, ...]) -> ChoiceQuestion:
    if not isinstance(criteria, Mapping):
        raise InvalidRequest("choice criteria must be an object mapping option names to descriptions", loc)
    if not MIN_OPTIONS <= len(criteria) <= MAX_OPTIONS:
        raise InvalidRequest(
            f"a choice needs {MIN_OPTIONS} to {MAX_OPTIONS} options, got {len(criteria)}; "
            + (
                "add options, or ask a noul question"
                if len(criteria) < MIN_OPTIONS
                else "split it into several questions"
            ),
            loc,
        )
    options = tuple(
        (str(name), _optional_text(description, (*loc, str(name)))) for name, description in criteria.items()
    )
    return ChoiceQuestion(options, instructions)


def _parse_score(instructions: Text | None, criteria: Any, loc: tuple[str | int, ...]) -> ScoreQuestion:
    if isinstance(criteria, Mapping):
        raise InvalidRequest(
            "score criteria must be an array of level descriptions (level i scores i), not an object", loc
        )
    if not isinstance(criteria, list):
        raise InvalidRequest("score criteria must be an array of level descriptions", loc)
    if not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
        raise InvalidRequest(f"a score needs {MIN_LEVELS} to {MAX_LEVELS} levels, got {len(criteria)}", loc)
    for i, level in enumerate(criteria):
        if not _is_text(level):
            raise InvalidRequest(
                f"a level description must be a string, an object or an array, not {type(level).__name__}", (*loc, i)
            )
    return ScoreQuestion(tuple(criteria), instructions)


def parse_questions(raw: Any) -> dict[str, Question]:
    if not isinstance(raw, Mapping):
        raise InvalidRequest("questions must be an object mapping question ids to questions", ("questions",))
    if not raw:
        raise InvalidRequest("questions must hold at least one question", ("questions",))
    questions = {}
    for qid, question in raw.items():
        if not isinstance(qid, str) or not qid:
            raise InvalidRequest("a question id must be a non-empty string", ("questions",))
        questions[qid] = parse_question(question, ("questions", qid))
    return questions


def parse_request(body: Any) -> Request:
    """A decoded `/v1/systemone` body → `Request`. Unknown top-level fields are ignored.

    Raises:
        InvalidRequest: with `loc` and a message saying what to change.
    """
    if not isinstance(body, Mapping):
        raise InvalidRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model must be a string", ("model",))
    if body.get("assets"):
        raise InvalidRequest("image assets need a vision model; this model reads text only", ("assets",))
    if "questions" not in body:
        raise InvalidRequest("questions is required", ("questions",))
    calibration = body.get("x_calibration")
    if calibration is not None and calibration not in CALIBRATION_METHODS:
        raise InvalidRequest(f"x_calibration must be one of {', '.join(CALIBRATION_METHODS)}", ("x_calibration",))
    order_reads = body.get("x_order_reads")
    if isinstance(order_reads, float) and order_reads.is_integer():
        order_reads = int(order_reads)  # JSON has one number type: 2.0 is the integer 2 (as JSON Schema reads it)
    if order_reads is not None and (
        isinstance(order_reads, bool) or not isinstance(order_reads, int) or not 1 <= order_reads <= MAX_ORDER_READS
    ):
        raise InvalidRequest(f"x_order_reads must be an integer from 1 to {MAX_ORDER_READS}", ("x_order_reads",))
    method = CalibrationMethod(calibration) if calibration is not None else None
    state, questions = parse_state(body.get("state")), parse_questions(body["questions"])
    return Request(state, questions, model, method, order_reads, parse_handover(body))


def _share(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise InvalidRequest(f"{name} must be a number between 0 and 1 (exclusive), like 0.9", (name,))
    return float(value)


def parse_handover(body: Mapping[str, Any]) -> Handover:
    """`x_coverage` and `x_min_accuracy` of a request body (each a number in (0, 1), or absent)."""
    return Handover(_share(body, "x_coverage"), _share(body, "x_min_accuracy"))


def question_to_wire(question: Question) -> dict[str, Any]:
    """A question as a request would send it (`parse_question` reads it back as an equal question)."""
    wire: dict[str, Any] = {"type": question.kind.value}
    if question.instructions is not None:
        wire["instructions"] = question.instructions
    if isinstance(question, NoulQuestion):
        criteria = {"true": question.true, "false": question.false}
        if any(value is not None for value in criteria.values()):
            wire["criteria"] = {key: value for key, value in criteria.items() if value is not None}
    elif isinstance(question, ChoiceQuestion):
        wire["criteria"] = dict(question.options)
    else:
        wire["criteria"] = list(question.levels)
    return wire


@dataclass(frozen=True)
class FeedbackRequest:
    """A validated feedback post: the request as `/v1/systemone` reads it, each labeled question's gold answer as
    an index into its probabilities, and the client's idempotency id (None: every post counts)."""

    request: Request
    gold: dict[str, int]
    feedback_id: str | None = None
    sample: str = "random"  # x_sample: "random" (a fair sample of the traffic) or "chosen" (a correction, a hard case)


def parse_feedback(body: Any) -> FeedbackRequest:
    """A decoded `/v1/systemone/feedback` body: a `/v1/systemone` body plus `gold` ({question id: answer}; noul
    true/false, choice an option's name, score a level index) and an optional `x_feedback_id`.

    Raises:
        InvalidRequest: as `parse_request`, or naming the gold answer (`("gold", id)`) or the id that is wrong.
    """
    request = parse_request(body)
    gold = body.get("gold")
    if not isinstance(gold, Mapping) or not gold:
        raise InvalidRequest(
            'gold must be an object mapping question ids to their right answers, like {"billing": true}', ("gold",)
        )
    indexes = {}
    for qid, answer in gold.items():
        if qid not in request.questions:
            raise InvalidRequest(f"{qid!r} is not one of this request's questions", ("gold", qid))
        question = request.questions[qid]
        try:
            indexes[qid] = question.gold_index(answer)
        except ValueError as exc:
            raise InvalidRequest(f"a {question.kind} question's gold answer must be {exc}", ("gold", qid)) from None
    return FeedbackRequest(request, indexes, *parse_post_options(body))


def parse_post_options(body: Mapping[str, Any]) -> tuple[str | None, str]:
    """A feedback post's `x_feedback_id` (None: absent) and `x_sample` ("random" where absent), whatever its form.

    Raises:
        InvalidRequest: naming the field that is wrong.
    """
    feedback_id = body.get("x_feedback_id")
    if feedback_id is not None and (
        not isinstance(feedback_id, str) or not 0 < len(feedback_id) <= MAX_FEEDBACK_ID_CHARS
    ):
        raise InvalidRequest(
            f"x_feedback_id must be a string of 1 to {MAX_FEEDBACK_ID_CHARS} characters", ("x_feedback_id",)
        )
    sample = body.get("x_sample", "random")
    if sample not in SAMPLES:
        raise InvalidRequest(
            'x_sample must be "random" (these labels are a fair sample of the traffic: they feed the guarantees) or '
            '"chosen" (picked for a reason: a correction, a hard case; learned from, never counted in a guarantee)',
            ("x_sample",),
        )
    return feedback_id, sample
