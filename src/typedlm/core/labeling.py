"""Labels by answer id: a feedback post that names answers the server gave instead of sending their state and
questions again, and the ids themselves. Plain data, no model.

Every answer of a server that keeps feedback carries an id (`x_id`, `answer_id`): 22 url-safe characters, 128
random bits from `secrets` (not guessable, so that one client cannot label another's answers by trying ids), after
the replica that gave it and a dot where replicas serve (`origin_of` reads it back: the ingress sends a label to
the replica that holds its answer).

A post to /v1/systemone/feedback takes one of three forms (`parse_post`), each with a post's optional
`x_feedback_id` and `x_sample` (`questions.parse_post_options`):

    {"x_id": ID, "gold": ANSWER}                         one answer, labeled by its id
    {"labels": [{"x_id": ID, "gold": ANSWER}, ...]}      several answers (at most MAX_LABELS)
    {"state": ..., "questions": {...}, "gold": {QID: ANSWER}, "x_ids": {QID: ID}}
                                                         the post of old with its answers' ids: by id where every
                                                         labeled answer is held, else the request answered again

The first two give `LabelsById`; the third a `LabelsById` whose `fallback` is the post of old (`FeedbackRequest`),
and without `x_ids` just that. A gold answer named by id is checked against the question its answer was given for,
once the answer is found (`gold_index`), not here.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from typedlm.core.errors import InvalidRequest
from typedlm.core.questions import FeedbackRequest, parse_feedback, parse_post_options

MAX_LABELS = 1000  # answers one post may label by id
MAX_SUGGESTIONS = 1000  # answers a suggestion of what to label next lists, of each kind
MAX_FAMILY_CHARS = 64  # a question family's key (a hash) as a suggestion is asked for it
MAX_ANSWER_ID_CHARS = 100  # an origin (a replica's id), a dot and the random part
ANSWER_ID_BYTES = 16  # random bytes per id: 22 url-safe characters
ANSWER_ID = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)?")  # [origin.]random
ORIGIN = re.compile(r"[A-Za-z0-9_-]+")


def answer_id(origin: str | None = None) -> str:
    """A new answer id: random, after `origin` and a dot where one is given (a replica's id)."""
    token = secrets.token_urlsafe(ANSWER_ID_BYTES)
    return token if origin is None else f"{origin}.{token}"


def origin_of(answer: str) -> str | None:
    """The origin an answer id names (the replica that gave it), or None (one server, or not an id)."""
    origin, dot, _ = answer.partition(".")
    return origin if dot and ORIGIN.fullmatch(origin) else None


@dataclass(frozen=True)
class AnswerLabel:
    """One answer's gold answer, by the answer's id."""

    answer_id: str
    gold: Any  # as posted; checked against the answer's own question where it is held
    loc: tuple[str | int, ...]  # where the gold answer is in the body (a refusal names it)
    question_id: str | None = None  # the question it answers, where the body sent it too (x_ids)


@dataclass(frozen=True)
class LabelsById:
    """A feedback post by answer ids (see the module)."""

    labels: tuple[AnswerLabel, ...]
    feedback_id: str | None = None
    sample: str = "random"  # as the post says; an answer handed out to teach is stored "chosen" whatever it says
    model: str | None = None
    fallback: FeedbackRequest | None = None  # the state and questions too: answered again where an id is not held

    @property
    def answer_ids(self) -> list[str]:
        return [label.answer_id for label in self.labels]


FeedbackPost = FeedbackRequest | LabelsById


def _checked_id(value: Any, loc: tuple[str | int, ...]) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ANSWER_ID_CHARS or not ANSWER_ID.fullmatch(value):
        raise InvalidRequest(
            f"an answer id must be the x_id of an answer, a string of 1 to {MAX_ANSWER_ID_CHARS} letters, digits, "
            "'-', '_' (and one '.')",
            loc,
        )
    return value


def _checked_model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model must be a string", ("model",))
    return model


def _by_id(body: Mapping[str, Any]) -> tuple[AnswerLabel, ...]:
    """The labels of a post by id: its one `x_id` and `gold`, or its `labels`."""
    if "labels" in body and "x_id" in body:
        raise InvalidRequest("send one answer's x_id and gold, or labels, not both", ("labels",))
    for field in ("state", "questions"):
        if field in body:
            raise InvalidRequest(
                f"a post by x_id takes no {field}; to send the state and questions too, post them with gold by "
                'question id and the answers\' ids as x_ids: {"billing": "<x_id>"}',
                (field,),
            )
    if "x_id" in body:
        if "gold" not in body:
            raise InvalidRequest("gold is required: the right answer of the answer x_id names", ("gold",))
        return (AnswerLabel(_checked_id(body["x_id"], ("x_id",)), body["gold"], ("gold",)),)
    labels = body["labels"]
    if not isinstance(labels, list) or not 0 < len(labels) <= MAX_LABELS:
        raise InvalidRequest(
            f'labels must be a list of 1 to {MAX_LABELS} objects like {{"x_id": "...", "gold": true}}', ("labels",)
        )
    parsed, seen = [], {}
    for i, label in enumerate(labels):
        if not isinstance(label, Mapping) or "x_id" not in label or "gold" not in label:
            raise InvalidRequest('a label must be an object like {"x_id": "...", "gold": true}', ("labels", i))
        answer = _checked_id(label["x_id"], ("labels", i, "x_id"))
        if answer in seen:
            raise InvalidRequest(f"labels the answer labels[{seen[answer]}] labels", ("labels", i, "x_id"))
        seen[answer] = i
        parsed.append(AnswerLabel(answer, label["gold"], ("labels", i, "gold")))
    return tuple(parsed)


def _with_ids(posted: FeedbackRequest, gold: Mapping[str, Any], ids: Any) -> tuple[AnswerLabel, ...] | None:
    """The labels of a post of old that sends its answers' ids too (`x_ids`), or None where it does not name one
    for every labeled question (it is then answered again)."""
    if not isinstance(ids, Mapping):
        raise InvalidRequest("x_ids must be an object mapping question ids to their answers' x_id", ("x_ids",))
    for qid, answer in ids.items():
        if qid not in posted.request.questions:
            raise InvalidRequest(f"{qid!r} is not one of this request's questions", ("x_ids", qid))
        _checked_id(answer, ("x_ids", qid))
    if any(qid not in ids for qid in posted.gold):
        return None
    if len({ids[qid] for qid in posted.gold}) < len(posted.gold):
        raise InvalidRequest("two labeled questions name one answer", ("x_ids",))
    return tuple(AnswerLabel(ids[qid], gold[qid], ("gold", qid), qid) for qid in posted.gold)


def parse_post(body: Any) -> FeedbackPost:
    """A decoded /v1/systemone/feedback body in any of its forms (see the module).

    Raises:
        InvalidRequest: naming the field that is wrong (a gold answer named by id is checked later).
    """
    if not isinstance(body, Mapping):
        raise InvalidRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    if "x_id" not in body and "labels" not in body:
        posted = parse_feedback(body)
        if body.get("x_ids") is None:
            return posted
        labels = _with_ids(posted, body["gold"], body["x_ids"])
        if labels is None:
            return posted
        return LabelsById(labels, posted.feedback_id, posted.sample, posted.request.model, posted)
    model = _checked_model(body)
    labels = _by_id(body)
    return LabelsById(labels, *parse_post_options(body), model)
