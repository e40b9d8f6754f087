"""Request validation: every bad input is an InvalidRequest that names where and what to change."""

from __future__ import annotations

import pytest

from typedlm.core.errors import InvalidRequest
from typedlm.core.questions import (
    MAX_LEVELS,
    MAX_OPTIONS,
    ChoiceQuestion,
    NoulQuestion,
    ScoreQuestion,
    parse_request,
)


def body(**questions):
    return {"model": "jev-latest", "state": "a document", "questions": questions}


def test_parses_every_question_type_and_keeps_option_order_and_names():
    request = parse_request(
        {
            "model": "jev-latest",
            "state": {"subject": "Duplicate charge", "lines": ["a", "b"]},
            "questions": {
                "spam": {"type": "noul", "instructions": "Is it spam?", "criteria": {"true": "ads"}},
                "bare": {"type": "noul"},
                "tone": {"type": "choice", "criteria": {"ünïcödé 😀": None, "calm": {"x": 1}, "z": "last"}},
                "urgency": {"type": "score", "instructions": ["a", "b"], "criteria": ["low", {"k": "v"}, ["x"]]},
            },
            "unknown_field": 1,
        }
    )
    assert request.model == "jev-latest"
    assert request.questions["spam"] == NoulQuestion("Is it spam?", true="ads")
    assert request.questions["bare"] == NoulQuestion()
    tone = request.questions["tone"]
    assert isinstance(tone, ChoiceQuestion) and [n for n, _ in tone.options] == ["ünïcödé 😀", "calm", "z"]
    assert request.questions["urgency"] == ScoreQuestion(("low", {"k": "v"}, ["x"]), ["a", "b"])


def test_limits_accept_the_extremes():
    names = {f"o{i}": None for i in range(MAX_OPTIONS)}
    request = parse_request(
        body(
            two={"type": "choice", "criteria": {"a": None, "b": None}},
            most={"type": "choice", "criteria": names},
            levels={"type": "score", "criteria": [str(i) for i in range(MAX_LEVELS)]},
            low={"type": "score", "criteria": ["no", "yes"]},
        )
    )
    assert len(request.questions["most"].options) == MAX_OPTIONS


@pytest.mark.parametrize(
    ("raw", "loc", "words"),
    [
        ([], (), "JSON object"),
        ({"questions": {"q": {"type": "noul"}}}, ("state",), "state is required"),
        ({"state": None, "questions": {"q": {"type": "noul"}}}, ("state",), "state is required"),
        ({"state": 3, "questions": {"q": {"type": "noul"}}}, ("state",), "not int"),
        ({"state": "s"}, ("questions",), "questions is required"),
        ({"state": "s", "questions": {}}, ("questions",), "at least one"),
        ({"state": "s", "questions": []}, ("questions",), "object"),
        ({"state": "s", "questions": {"": {"type": "noul"}}}, ("questions",), "non-empty"),
        ({"state": "s", "model": 5, "questions": {"q": {"type": "noul"}}}, ("model",), "string"),
        (body(q={"type": "maybe"}), ("questions", "q", "type"), "unknown question type"),
        (body(q={"criteria": {"a": None}}), ("questions", "q", "type"), "unknown question type"),
        (body(q={"type": "box"}), ("questions", "q", "type"), "text only"),
        (body(q="noul"), ("questions", "q"), "must be an object"),
        (body(q={"type": "noul", "instructions": 3}), ("questions", "q", "instructions"), "string"),
        (body(q={"type": "noul", "criteria": "yes"}), ("questions", "q", "criteria"), "noul criteria"),
        (body(q={"type": "noul", "criteria": {"true": 1}}), ("questions", "q", "criteria", "true"), "string"),
        (body(q={"type": "choice"}), ("questions", "q", "criteria"), "choice criteria"),
        (body(q={"type": "choice", "criteria": {}}), ("questions", "q", "criteria"), "got 0"),
        (body(q={"type": "choice", "criteria": {"a": None}}), ("questions", "q", "criteria"), "got 1"),
        (
            body(q={"type": "choice", "criteria": {f"o{i}": None for i in range(MAX_OPTIONS + 1)}}),
            ("questions", "q", "criteria"),
            "got 256",
        ),
        (body(q={"type": "choice", "criteria": ["a", "b"]}), ("questions", "q", "criteria"), "choice criteria"),
        (body(q={"type": "choice", "criteria": {"a": 1, "b": None}}), ("questions", "q", "criteria", "a"), "string"),
        (body(q={"type": "score"}), ("questions", "q", "criteria"), "array"),
        (body(q={"type": "score", "criteria": []}), ("questions", "q", "criteria"), "got 0"),
        (body(q={"type": "score", "criteria": ["only"]}), ("questions", "q", "criteria"), "got 1"),
        (body(q={"type": "score", "criteria": list("abcdefghijk")}), ("questions", "q", "criteria"), "got 11"),
        (
            body(q={"type": "score", "criteria": {"0": "low", "1": "high"}}),
            ("questions", "q", "criteria"),
            "not an object",
        ),
        (body(q={"type": "score", "criteria": ["a", None]}), ("questions", "q", "criteria", 1), "not NoneType"),
        ({**body(q={"type": "noul"}), "assets": {"img": {"type": "image"}}}, ("assets",), "text only"),
        ({**body(q={"type": "noul"}), "x_calibration": "platt"}, ("x_calibration",), "raw, contextual, fitted"),
        ({**body(q={"type": "noul"}), "x_order_reads": 0}, ("x_order_reads",), "from 1 to 8"),
        ({**body(q={"type": "noul"}), "x_order_reads": True}, ("x_order_reads",), "integer"),
        ({**body(q={"type": "noul"}), "x_order_reads": 2.5}, ("x_order_reads",), "integer"),
    ],
)
def test_bad_input_is_rejected_with_its_location(raw, loc, words):
    with pytest.raises(InvalidRequest) as caught:
        parse_request(raw)
    assert caught.value.loc == loc
    assert words in caught.value.message


def test_extensions_pick_calibration_and_order_reads():
    request = parse_request({**body(q={"type": "noul"}), "x_calibration": "contextual", "x_order_reads": 3})
    assert request.calibration == "contextual" and request.order_reads == 3
    plain = parse_request(body(q={"type": "noul"}))
    assert plain.calibration is None and plain.order_reads is None


def test_an_integral_float_is_an_integer_as_json_schema_reads_it():
    assert parse_request({**body(q={"type": "noul"}), "x_order_reads": 3.0}).order_reads == 3
