"""Pydantic models of the wire format, for the OpenAPI document at /docs.

Requests are validated by `typedlm.core.questions` (one source of truth for the rules and their messages);
these models describe the same shapes for readers and client generators.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

JSONText = str | dict[str, Any] | list[Any]


class NoulCriteria(BaseModel):
    true: JSONText | None = Field(None, description="What counts as yes.")
    false: JSONText | None = Field(None, description="What counts as no.")


class NoulQuestion(BaseModel):
    type: Literal["noul"]
    instructions: JSONText | None = Field(None, examples=["Is this message about billing?"])
    criteria: NoulCriteria | None = None


class ChoiceQuestion(BaseModel):
    type: Literal["choice"]
    instructions: JSONText | None = Field(None, examples=["What is the tone of this message?"])
    criteria: dict[str, JSONText | None] = Field(
        ...,
        description="2 to 255 option names → descriptions (or null).",
        examples=[{"angry": "upset", "calm": None}],
        min_length=2,
        max_length=255,
    )


class ScoreQuestion(BaseModel):
    type: Literal["score"]
    instructions: JSONText | None = Field(None, examples=["How urgent is this message?"])
    criteria: list[JSONText] = Field(
        ...,
        description="2 to 10 ordered levels; level i scores i.",
        examples=[["low", "high"]],
        min_length=2,
        max_length=10,
    )


class SystemOneRequest(BaseModel):
    model: str | None = Field(
        None,
        description="The served model's name or an alias (jev-latest); any other is a 404.",
        examples=["jev-latest"],
    )
    state: JSONText = Field(..., description="The document every question refers to.")
    questions: dict[Annotated[str, Field(min_length=1)], NoulQuestion | ChoiceQuestion | ScoreQuestion] = Field(
        ..., description="Named questions, at least one.", min_length=1
    )
    x_calibration: Literal["raw", "contextual", "fitted", "feedback"] | None = Field(
        None, description="Calibration method for this request (default: the server's)."
    )
    x_order_reads: int | None = Field(
        None, ge=1, le=8, description="Option orders read per choice/score question and averaged (default: 1)."
    )
    x_coverage: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Each answer carries its answer set (x_set) at this coverage: the answers that hold the right "
        "one at least this often, from the question's fair labels (docs/feedback.md).",
        examples=[0.9],
    )
    x_min_accuracy: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Each answer says whether it abstains (x_abstain): false only where its labels certify that "
        "answers whose top probability is this high are right at least this often (x_threshold).",
        examples=[0.95],
    )


class AnswerSet(BaseModel):
    answers: list[bool | str] = Field(
        ...,
        description="The set: noul true/false, choice option names, score level keys; never empty: the top answer "
        "shown is always in it.",
    )
    coverage: float = Field(..., description="The coverage asked for (x_coverage).")
    labels: int = Field(..., description="The fair labels the set rests on.")
    level: Literal["exact", "family", "kind", "default"] = Field(
        ..., description="Whose labels: the question's, its family's, its kind's, or none (default)."
    )
    guaranteed: bool = Field(..., description="True where a finite-sample guarantee holds for this answer (CV+).")
    guarantee: Literal["cv+", "long-run", "none"] = Field(
        ...,
        description="cv+: CV+ over the fold models that give the answer shown, for every answer (proven at "
        "proven_coverage whatever the fit, measured near coverage: docs/handover.md); long-run: adaptive conformal "
        "inference on a drifting stream, on average over many answers; none: too few labels, every answer in the "
        "set.",
    )
    proven_coverage: float | None = Field(
        ..., description="cv+: the coverage CV+ is proven to give with these labels, whatever the fit; else null."
    )


class Threshold(BaseModel):
    top_probability: float = Field(
        ..., description="Answers whose top probability (as shown) is at least this are committed."
    )
    answer: bool | str = Field(..., description="The answer it speaks of: the top answer shown.")
    labels: int = Field(..., description="Fair labels at or above it.")
    right: int = Field(..., description="Of those, right.")
    lower_bound: float = Field(
        ..., description="The exact (Clopper-Pearson) lower bound at 1 - delta on those answers' rate of rightness."
    )
    level: Literal["exact", "family", "kind"]
    min_accuracy: float
    delta: float = Field(..., description="The certificate holds with probability 1 - delta.")


class HandedOver(BaseModel):
    """What a server adds to an answer: its id where it keeps feedback, and what x_coverage and x_min_accuracy add."""

    x_id: str | None = Field(
        None,
        description="With a feedback database: the answer's id, to label it by (POST /v1/systemone/feedback with "
        "x_id and gold) while the server holds it.",
    )
    x_set: AnswerSet | None = Field(None, description="With x_coverage: the answer set.")
    x_abstain: bool | None = Field(None, description="With x_min_accuracy: whether to send it to a person.")
    x_threshold: Threshold | None = Field(
        None, description="With x_min_accuracy: the certified threshold it was held to; null: none certified."
    )


class NoulAnswer(HandedOver):
    type: Literal["noul"]
    noul: float = Field(..., description="P(yes).")
    x_raw_mass: float = Field(..., description="Mass on any answer label before normalisation.")


class ChoiceAnswer(HandedOver):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: float
    x_raw_mass: float


class ScoreAnswer(HandedOver):
    type: Literal["score"]
    score: float = Field(..., description="Expected level, Σ i·p_i.")
    legend: dict[str, JSONText]
    probabilities: dict[str, float]
    confidence: float
    x_raw_mass: float


class Usage(BaseModel):
    input_tokens: int = Field(description="the request's whole prompt, however much of it was cached")
    output_tokens: int
    x_cached_tokens: int = Field(0, description="of input_tokens, those served from the prefix cache")


class SystemOneResponse(BaseModel):
    model: str
    answers: dict[str, NoulAnswer | ChoiceAnswer | ScoreAnswer]
    usage: Usage


class FeedbackRequest(SystemOneRequest):
    gold: dict[str, bool | str | int] = Field(
        ...,
        description="The right answer of each labeled question, by its id: noul true/false, choice an option's "
        "name, score a level index. Questions without one are answered, not stored.",
        examples=[{"billing": True}],
        min_length=1,
    )
    x_feedback_id: str | None = Field(
        None, min_length=1, max_length=200, description="The post's idempotency id: a retried post counts once."
    )
    x_sample: Literal["random", "chosen"] = Field(
        "random",
        description="How these labels were picked: random (a fair sample of the traffic: they feed the answer sets' "
        "and selective answers' guarantees) or chosen (a correction, a hard case: learned from, never counted in a "
        "guarantee). An answer handed out to teach (GET /v1/systemone/feedback/suggest) is stored chosen.",
    )
    x_ids: dict[str, str] | None = Field(
        None,
        description="The answers' ids (x_id) by question id: where the server holds every labeled answer, its "
        "labels are stored from them and the request is not answered again.",
    )


class FeedbackById(BaseModel):
    model: str | None = None
    x_id: str = Field(..., description="The labeled answer's id (its x_id).", max_length=100)
    gold: bool | str | int = Field(
        ..., description="Its right answer: noul true/false, choice an option's name, score a level index."
    )
    x_feedback_id: str | None = Field(None, min_length=1, max_length=200)
    x_sample: Literal["random", "chosen"] = "random"


class AnswerLabel(BaseModel):
    x_id: str = Field(..., max_length=100)
    gold: bool | str | int


class FeedbackLabels(BaseModel):
    model: str | None = None
    labels: list[AnswerLabel] = Field(..., description="Answers labeled by their ids.", min_length=1, max_length=1000)
    x_feedback_id: str | None = Field(None, min_length=1, max_length=200)
    x_sample: Literal["random", "chosen"] = "random"


class FeedbackLevel(BaseModel):
    level: Literal["exact", "family", "kind", "default"] = Field(
        ...,
        description="The most specific level of the question with labels: the question itself, its family "
        "(type and instructions), its kind (type), or none (the default calibration).",
    )
    labels: int
    readout: Literal["calibrated", "learned"] | None = Field(
        None,
        description="calibrated: the label logits, calibrated by the labels; learned: a readout learned from the "
        "model's hidden state at the decision row corrects them too (where cross-validation on the labels says it "
        "predicts better). Absent at the default level.",
    )


class FeedbackResponse(SystemOneResponse):
    x_feedback: dict[str, FeedbackLevel] = Field(
        ..., description="Per labeled question, the calibration in force for it now that its label is learned."
    )
    x_feedback_stored: int = Field(..., description="Labels stored by this post (0: its x_feedback_id was seen).")


FEEDBACK_POSTS = (FeedbackRequest, FeedbackById, FeedbackLabels)  # the forms of POST /v1/systemone/feedback's body


class LabeledById(BaseModel):
    question: str = Field(..., description="The question id the answer was given for.")
    sample: Literal["random", "chosen"] = Field(..., description="How the label was stored.")
    x_feedback: FeedbackLevel


class FeedbackByIdResponse(BaseModel):
    model: str
    x_labels: dict[str, LabeledById] = Field(..., description="Per answer id labeled: what was stored for it.")
    x_feedback_stored: int = Field(..., description="Labels stored by this post (0: its x_feedback_id was seen).")


class FeedbackSuggestions(BaseModel):
    object: Literal["feedback_suggestions"]
    family: str | None = Field(..., description="The family asked for (null: any).")
    answers: int = Field(..., description="Answers held (of the family) that no label by id has named.")
    drawable: int = Field(..., description="Of them, those no earlier random draw gave: what this draw was drawn from.")
    random: list[str] = Field(
        ..., description="Answer ids drawn at random: label every one, as posted (x_sample random): a fair sample."
    )
    teach: list[str] = Field(
        ..., description="Other answer ids, the most unsure: labels of these are stored chosen (never certified from)."
    )
    teach_by: Literal["entropy"] = Field(
        ..., description="How unsure: the entropy of the answer's probabilities over the log of their number."
    )
    teach_uncertainty: list[float] = Field(..., description="Of each answer to teach: 0 sure, 1 uniform.")


class FamilyScores(BaseModel):
    accuracy: float
    log_loss: float
    ece: float = Field(..., description="Expected calibration error of the top answers (15 bins).")
    ece_floor90: float = Field(
        ...,
        description="The 90th percentile of the ECE a perfectly calibrated model with these confidences would "
        "measure on this many labels: an ECE under it is within sampling noise.",
    )
    reliability: list[dict[str, float]] = Field(..., description="Non-empty bins: lo, hi, count, confidence, accuracy.")


class Automation(BaseModel):
    min_accuracy: float
    share: float = Field(..., description="The share of the family's fair labeled answers committed at it.")
    threshold: float | None = Field(..., description="The certified confidence threshold; null: none.")
    labels: int = Field(..., description="Fair labels at or above the threshold.")


class SetSize(BaseModel):
    coverage: float
    mean_size: float = Field(..., description="The mean answer set size on the family's fair labels.")
    guaranteed: bool = Field(..., description="False: too few labels, every answer in the set.")


class CurvePoint(BaseModel):
    confidence: float
    share: float = Field(..., description="The share of labeled answers at least this confident.")
    accuracy: float = Field(..., description="Their accuracy.")


class FamilyHandover(BaseModel):
    fair_labels: int = Field(..., description="Labels posted with x_sample random, scored out of fold.")
    answers: float = Field(..., description="The mean number of answers of its questions.")
    automation: list[Automation] = Field(..., description="At 90, 95 and 99% accuracy.")
    sets: list[SetSize] = Field(..., description="At 80, 90 and 95% coverage.")
    curve: list[CurvePoint] = Field(..., description="Accuracy against the share committed, over thresholds.")


class FeedbackFamily(BaseModel):
    family: str = Field(..., description="The family's key: a hash of its type and instructions.")
    kind: Literal["noul", "choice", "score"]
    instructions: JSONText | None
    labels: int
    measured_on: int = Field(..., description="The latest labels the scores are measured on (at most 2,000).")
    default: FamilyScores = Field(..., description="The default calibration's answers on the family's labels.")
    feedback: FamilyScores | None = Field(
        ..., description="Calibration learned from its labels, cross-validated (5 folds); null under 10 labels."
    )
    handover: FamilyHandover | None = Field(
        ..., description="What its fair labels say may be handed over; null under 10 fair labels."
    )


class FeedbackReport(BaseModel):
    object: Literal["feedback_report"]
    model: str
    database: str
    labels: int
    not_learned: int = Field(..., description="Stored labels that cannot be learned under this server's options.")
    families_labeled: int = Field(..., description="Question families with labels; the 100 most labeled are listed.")
    families: list[FeedbackFamily]


class ModelInfo(BaseModel):
    name: str
    description: str
    release_date: str


class ModelList(BaseModel):
    models: list[ModelInfo]


class ErrorDetail(BaseModel):
    error_type: str
    message: str


class ErrorBody(BaseModel):
    detail: ErrorDetail


class ValidationItem(BaseModel):
    loc: list[str | int] = Field(..., description='Where: ["body", field, ...].')
    msg: str
    type: str


class ValidationBody(BaseModel):
    detail: list[ValidationItem]


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] = Field(..., description="Text, or content parts of type text.")


class ChatRequest(BaseModel):
    model: str | None = Field(None, examples=["jev-latest"])
    messages: list[ChatMessage] = Field(
        ...,
        description="A system message holding the questions object of /v1/systemone as JSON, and one user message "
        "holding the document.",
    )
    stream: bool | None = Field(None, description="Server-sent events: one chunk with the whole answer, then [DONE].")
    n: Literal[1] | None = Field(None, description="Only 1: a decision has one answer.")


class ChatError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ChatErrorBody(BaseModel):
    error: ChatError


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[dict[str, Any]] = Field(..., description="One choice; its message content is the answers as JSON.")
    usage: dict[str, Any]
