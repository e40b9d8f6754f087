"""Answer sets and selective answers (x_coverage, x_min_accuracy) through the decider and a real HTTP server, on the
real embedded model: what they carry with no labels and with fair labels, that chosen labels feed no guarantee,
that the probabilities are those of a request that asks neither, the refusals, and the official SDK's parsing."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import BaseModel
from typesafe_sdk import Noul, TypeSafeClient
from typesafe_sdk._schemas.models import SystemOneResponse

from typedlm.core.errors import InvalidRequest
from typedlm.decide.decider import Decider
from typedlm.server import ServerSettings, create_app

from ..conftest import ServerThread
from .test_feedback import BILLING, DOCUMENTS, TEAM, assert_same_answers, body, loaded  # noqa: F401 (the module's model fixture)


class Kept(BaseModel):
    """A caller's own response model for the SDK's response_model: every answer's fields, x_ ones included."""

    answers: dict[str, dict]


SCORE = {"type": "score", "instructions": "How urgent is it?", "criteria": ["not", "somewhat", "very"]}
ASKED = {"x_coverage": 0.8, "x_min_accuracy": 0.9}


def without_handover(answers: dict) -> dict:
    return {
        q: {k: v for k, v in a.items() if k not in ("x_set", "x_abstain", "x_threshold")} for q, a in answers.items()
    }


def test_without_labels_every_set_is_every_answer_and_every_answer_abstains(loaded):  # noqa: F811
    decider = Decider(loaded)
    questions = {"billing": BILLING, "team": TEAM, "urgency": SCORE}
    plain = decider.respond({"state": DOCUMENTS[0], "questions": questions})
    asked = decider.respond({"state": DOCUMENTS[0], "questions": questions, **ASKED})
    assert_same_answers(without_handover(asked["answers"]), plain["answers"])
    want = {"billing": [True, False], "team": ["billing", "tech"], "urgency": ["0", "1", "2"]}
    for qid, answer in asked["answers"].items():
        assert answer["x_set"] == {"answers": want[qid], "coverage": 0.8, "labels": 0, "level": "default",
                                   "guaranteed": False, "guarantee": "none", "proven_coverage": None}  # fmt: skip
        assert answer["x_abstain"] is True and answer["x_threshold"] is None
    SystemOneResponse.model_validate(asked)  # the official SDK's own response model parses it


def test_fair_labels_give_a_guaranteed_set_and_chosen_ones_count_for_nothing(loaded, tmp_path):  # noqa: F811
    decider = Decider(loaded, feedback_db=tmp_path / "f.sqlite")
    golds = [True, False, True, False]
    for i, document in enumerate(DOCUMENTS * 2):  # 8 fair labels: enough for 0.8 (4), not to settle it (62)
        decider.respond_feedback(body(document, gold={"billing": golds[i % 4]}))
    for document in DOCUMENTS[:3]:
        decider.respond_feedback(body(document, gold={"billing": False}, x_sample="chosen"))
    answer = decider.respond(body(DOCUMENTS[0], **ASKED))["answers"]
    chosen = answer["billing"]["x_set"]
    assert (chosen["labels"], chosen["level"], chosen["guaranteed"], chosen["guarantee"]) == (8, "exact", True, "cv+")
    assert 0 < chosen["proven_coverage"] < 0.8 and set(chosen["answers"]) <= {True, False}
    assert (answer["billing"]["noul"] >= 0.5) in chosen["answers"]  # the answer shown is always in its set
    assert answer["billing"]["x_feedback"]["labels"] == 11  # the chosen labels are learned all the same
    # 8 labels are too few to certify anything at 0.9 (0.9^8 > 0.1): the answer abstains, said by its threshold
    assert answer["billing"]["x_abstain"] is True and answer["billing"]["x_threshold"] is None
    assert answer["team"]["x_set"]["guarantee"] == "none"  # no labels for the team question
    decider.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("x_coverage", 1.0), ("x_coverage", 0), ("x_coverage", "0.9"), ("x_min_accuracy", True), ("x_min_accuracy", 2)],
)
def test_a_share_outside_zero_one_is_refused_naming_its_field(loaded, field, value):  # noqa: F811
    with pytest.raises(InvalidRequest) as caught:
        Decider(loaded).respond(body(DOCUMENTS[0], **{field: value}))
    assert caught.value.loc == (field,)


def test_over_http_the_sets_the_chat_route_and_a_bad_sample_answer_as_documented(loaded, tmp_path):  # noqa: F811
    decider = Decider(loaded, feedback_db=tmp_path / "f.sqlite")
    with ServerThread(create_app(decider, ServerSettings())) as url:
        answered = httpx.post(f"{url}/v1/systemone", json=body(DOCUMENTS[1], x_coverage=0.9), timeout=60)
        assert answered.status_code == 200 and "x_set" in answered.json()["answers"]["team"]
        bad = httpx.post(f"{url}/v1/systemone", json=body(DOCUMENTS[1], x_coverage=1.5), timeout=60)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "x_coverage"]
        post = body(DOCUMENTS[1], gold={"team": "tech"}, x_sample="picked")
        refused = httpx.post(f"{url}/v1/systemone/feedback", json=post, timeout=60)
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "x_sample"]
        system = json.dumps({"questions": {"team": TEAM}, "x_min_accuracy": 0.95})
        chat = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": DOCUMENTS[1]}]}
        completion = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).json()
        content = json.loads(completion["choices"][0]["message"]["content"])
        assert content["team"]["x_abstain"] is True and content["team"]["x_threshold"] is None
        # the official SDK sends them as its extra_body; its typed answers parse (and drop x_ fields, as they drop
        # x_raw_mass), and its response_model keeps them
        with TypeSafeClient(api_key="local", base_url=url) as client:
            asked = ({"billing": Noul(instructions=BILLING["instructions"])},)
            extra = {"x_coverage": 0.9, "x_min_accuracy": 0.95}
            typed = client.system_one(DOCUMENTS[1], *asked, extra_body=extra)
            kept = client.system_one(DOCUMENTS[1], *asked, extra_body=extra, response_model=Kept)
        assert 0 <= typed.answers["billing"].noul <= 1
        assert kept.answers["billing"]["x_set"]["coverage"] == 0.9 and kept.answers["billing"]["x_abstain"] is True
        schema = httpx.get(f"{url}/openapi.json", timeout=30).json()["components"]["schemas"]
        assert {"x_coverage", "x_min_accuracy"} <= schema["SystemOneRequest"]["properties"].keys()
        assert "x_sample" in schema["FeedbackRequest"]["properties"]
    decider.close()
