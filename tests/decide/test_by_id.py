"""Labels by answer id through the decider, on the real embedded model: a label by id stores what a post of the state
and questions stores, with no second forward; ids only where labels can be posted; the forms of a post by id, its
refusals and its fallback; what a suggestion hands out to teach is stored chosen. Over HTTP: tests/server/."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from typedlm.calibrate.projection import decode
from typedlm.core.errors import AnswerNotHeld, InvalidRequest
from typedlm.core.questions import parse_request
from typedlm.decide.decider import Decider
from typedlm.store.feedback import FeedbackStore

from .test_feedback import BILLING, DOCUMENTS, TEAM, body, loaded  # noqa: F401 (the module's model fixture)

SCORE = {"type": "score", "instructions": "How urgent is it?", "criteria": ["can wait", "soon", "now"]}
GOLD = {"billing": True, "team": "tech", "urgency": 2}


def asked(document: str, **more) -> dict:
    return body(document, **more) | {"questions": {"billing": BILLING, "team": TEAM, "urgency": SCORE}}


def answer(decider: Decider, request: dict, remember: bool = True) -> dict:
    r = parse_request(request)
    return decider.decide(r.state, r.questions, r.calibration, r.order_reads, remember=remember).to_wire()


def ids_of(response: dict) -> dict[str, str]:
    return {qid: a["x_id"] for qid, a in response["answers"].items()}


def stored(decider: Decider) -> list:
    with FeedbackStore(decider.feedback.store.path) as store:
        return store.labels()


def comparable(label) -> dict:
    """A stored label's fields that a label by id and a post of the state and questions must share."""
    fields = dataclasses.asdict(label)
    for own in ("uid", "created", "id", "feedback_id"):
        fields.pop(own)
    return fields


def same_floats(a, b) -> bool:
    return np.allclose(a, b, rtol=1e-5, atol=0) if a is not None else b is None


@pytest.mark.parametrize("calibration", [None, "raw", "contextual"])
def test_a_label_by_id_stores_what_a_post_of_the_request_stores(loaded, tmp_path, calibration):  # noqa: F811
    """Two deciders on databases of their own, the same request: one labels its answers by id, the other posts the
    state, questions and gold answers. Every field of every label is the same (masses, priors and features to a
    relative 1e-5: each read its document in its own forward), and the post by id ran no forward."""
    options = {} if calibration is None else {"x_calibration": calibration}
    by_id, by_body = (Decider(loaded, feedback_db=tmp_path / f"{name}.sqlite") for name in ("id", "body"))
    request = asked(DOCUMENTS[0], **options)
    ids = ids_of(answer(by_id, request))
    forwards = by_id.scheduler.prefix_cache.stats()
    posted = by_id.respond_feedback({"labels": [{"x_id": ids[q], "gold": GOLD[q]} for q in GOLD]})
    assert by_id.scheduler.prefix_cache.stats() == forwards  # no forward: the prefix cache was not even asked
    assert posted["x_feedback_stored"] == 3 and set(posted["x_labels"]) == set(ids.values())
    assert posted["x_labels"][ids["team"]] == {
        "question": "team",
        "sample": "random",
        "x_feedback": {"level": "exact", "labels": 1, "readout": "calibrated"},
    }
    by_body.respond_feedback(request | {"gold": GOLD})
    labels, wanted = stored(by_id), stored(by_body)
    assert [label.question_id for label in labels] == [label.question_id for label in wanted] == list(GOLD)
    for label, want in zip(labels, wanted):
        got, expected = comparable(label), comparable(want)
        for floats in ("masses", "priors"):
            assert same_floats(got.pop(floats), expected.pop(floats)), floats
        features = [decode(fields.pop("features")) for fields in (got, expected)]
        assert np.allclose(*features, rtol=1e-2, atol=1e-3)  # float16: to its own precision
        assert got == expected
    assert all(label.features is not None for label in labels)
    assert all(label.priors is not None for label in labels) == (calibration == "contextual")  # read where used
    by_id.close()
    by_body.close()


def test_answers_carry_ids_only_where_labels_can_be_posted(loaded, tmp_path):  # noqa: F811
    plain = Decider(loaded)
    answer(plain, asked(DOCUMENTS[1]))  # the document cached: every answer below is read over the same prefix
    assert answer(plain, asked(DOCUMENTS[1])) == answer(plain, asked(DOCUMENTS[1]), remember=False)
    assert "answer_window" not in plain.stats()
    off = Decider(loaded, feedback_db=tmp_path / "off.sqlite", answer_window_bytes=0)
    assert "x_id" not in answer(off, asked(DOCUMENTS[1]))["answers"]["billing"]
    with pytest.raises(AnswerNotHeld):
        off.respond_feedback({"x_id": "abc", "gold": True})
    off.close()
    kept = Decider(loaded, feedback_db=tmp_path / "kept.sqlite")
    answer(kept, asked(DOCUMENTS[1]), remember=False)
    with_ids = answer(kept, asked(DOCUMENTS[1]))
    for a in with_ids["answers"].values():
        assert len(a.pop("x_id")) == 22
    assert with_ids == answer(kept, asked(DOCUMENTS[1]), remember=False)  # the answers otherwise the same
    assert (
        answer(kept, asked(DOCUMENTS[1]))["answers"]["billing"]["x_id"]
        != answer(kept, asked(DOCUMENTS[1]))["answers"]["billing"]["x_id"]
    )  # an id per answer given, never per question
    assert kept.stats()["answer_window"]["entries"] == 9  # three answers of three requests asked to remember
    kept.close()


def test_labels_of_one_question_over_many_answers_and_a_retry(loaded, tmp_path):  # noqa: F811
    """Several answers of one question in one post (each its own label), sampled two ways; retried with its
    x_feedback_id, nothing more is stored."""
    decider = Decider(loaded, feedback_db=tmp_path / "f.sqlite")
    ids = [ids_of(answer(decider, asked(document))) for document in DOCUMENTS]
    suggested = decider.suggest_labels(decider.recent.held([ids[0]["billing"]])[0].family, 1)
    labels = [{"x_id": i["billing"], "gold": n % 2 == 0} for n, i in enumerate(ids)]
    labels.append({"x_id": ids[0]["team"], "gold": "billing"})
    post = {"labels": labels, "x_feedback_id": "batch-1"}
    posted = decider.respond_feedback(post)
    assert posted["x_feedback_stored"] == 5
    samples = {key: label["sample"] for key, label in posted["x_labels"].items()}
    assert [samples[key] for key in suggested["teach"]] == ["chosen"]  # handed out to teach
    assert list(samples.values()).count("random") == 4
    assert decider.respond_feedback(post)["x_feedback_stored"] == 0
    stored_labels = stored(decider)
    assert len(stored_labels) == 5 and [label.gold for label in stored_labels if label.question_id == "billing"]
    assert {label.sample for label in stored_labels} == {"random", "chosen"}
    assert decider.suggest_labels(None, 50)["answers"] == 12 - 5  # labeled by id: suggested no more
    decider.close()


@pytest.mark.parametrize(
    ("post", "loc"),
    [
        ({"gold": "yes"}, ["body", "labels", 0, "gold"]),
        ({"gold": "sales", "question": "team"}, ["body", "labels", 1, "gold"]),
        ({"gold": 3, "question": "urgency"}, ["body", "labels", 1, "gold"]),
        ({"gold": True, "question": "urgency"}, ["body", "labels", 1, "gold"]),
    ],
)
def test_a_gold_answer_not_of_its_answer_is_refused_naming_it_and_nothing_is_stored(loaded, tmp_path, post, loc):  # noqa: F811
    decider = Decider(loaded, feedback_db=tmp_path / "f.sqlite")
    ids = ids_of(answer(decider, asked(DOCUMENTS[2])))
    question = post.get("question", "billing")
    labels = [{"x_id": ids[question], "gold": post["gold"]}]
    if question != "billing":
        labels.insert(0, {"x_id": ids["billing"], "gold": True})
    with pytest.raises(InvalidRequest) as refused:
        decider.respond_feedback({"labels": labels})
    assert ["body", *refused.value.loc] == loc
    assert decider.feedback.store.count() == 0 and decider.stats()["answer_window"]["labeled_by_id"] == 0
    decider.close()


def test_with_the_state_and_questions_too_an_id_not_held_is_answered_again(loaded, tmp_path):  # noqa: F811
    decider = Decider(loaded, feedback_db=tmp_path / "f.sqlite", answer_window_bytes=1)  # holds nothing long
    request = asked(DOCUMENTS[3])
    ids = ids_of(answer(decider, request))
    with pytest.raises(AnswerNotHeld) as refused:
        decider.respond_feedback({"x_id": ids["billing"], "gold": True})
    assert refused.value.answer_ids == (ids["billing"],)
    posted = decider.respond_feedback(request | {"gold": {"billing": True}, "x_ids": {"billing": ids["billing"]}})
    assert posted["x_feedback_stored"] == 1 and "answers" in posted  # answered again, as a post of old
    decider.close()
    decider = Decider(loaded, feedback_db=tmp_path / "g.sqlite")
    ids = ids_of(answer(decider, request))
    both = request | {
        "gold": {"billing": True, "team": "tech"},
        "x_ids": {"billing": ids["billing"], "team": ids["team"]},
    }
    posted = decider.respond_feedback(both)
    assert (
        posted["x_feedback_stored"] == 2
        and "answers" not in posted
        and set(posted["x_labels"])
        == {
            ids["billing"],
            ids["team"],
        }
    )
    # an id sent for a question whose answer it is not: refused where it is
    other = request | {"gold": {"billing": True}, "x_ids": {"billing": ids["team"]}}
    with pytest.raises(InvalidRequest) as refused:
        decider.respond_feedback(other)
    assert refused.value.loc == ("x_ids", "billing")
    decider.close()
