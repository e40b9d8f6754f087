"""Labels by answer id over real HTTP, on the real embedded model: answers carry ids where the server keeps
feedback; a post by id is stored with no forward; an id not held (never given, let go of for its bytes or its age)
is a 404 naming it; what to label next; hostile bodies get a 4xx, never a 5xx; the gauges in /metrics; the same
through the model's own process (`typedlm serve`'s default)."""

from __future__ import annotations

import functools
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from typedlm.core.labeling import MAX_LABELS, MAX_SUGGESTIONS
from typedlm.decide.decider import Decider
from typedlm.hosting.model_process import ModelProcess
from typedlm.runtime.models import load_model
from typedlm.server import ServerSettings, create_app
from typedlm.store.feedback import FeedbackStore

from ..conftest import ServerThread

BILLING = {"type": "noul", "instructions": "Is this message about billing?"}
TEAM = {"type": "choice", "instructions": "Which team should handle it?", "criteria": {"billing": None, "tech": None}}


def body(document: str) -> dict:
    return {"state": document, "questions": {"billing": BILLING, "team": TEAM}}


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, "cpu", "float32")


@pytest.fixture(scope="module")
def served(loaded, tmp_path_factory):
    decider = Decider(loaded, feedback_db=tmp_path_factory.mktemp("by-id") / "f.sqlite")
    with ServerThread(create_app(decider, ServerSettings())) as url:
        yield url, decider


def ask(url: str, document: str) -> dict[str, str]:
    """A request answered: {question id: its answer's id}."""
    reply = httpx.post(f"{url}/v1/systemone", json=body(document), timeout=60)
    assert reply.status_code == 200, reply.text
    return {qid: answer["x_id"] for qid, answer in reply.json()["answers"].items()}


def post(url: str, payload, **options) -> httpx.Response:
    return httpx.post(f"{url}/v1/systemone/feedback", json=payload, timeout=60, **options)


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_a_label_by_id_is_stored_with_no_forward(served):
    url, decider = served
    ids = ask(url, "I was charged twice for my subscription.")
    before, stored = metrics(url), decider.feedback.store.count()
    reply = post(url, {"x_id": ids["team"], "gold": "billing"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["x_feedback_stored"] == 1 and reply.json()["x_labels"][ids["team"]]["question"] == "team"
    after = metrics(url)
    assert after["typedlm_batch_requests_count"] == before["typedlm_batch_requests_count"]  # no forward ran
    assert after["typedlm_answer_window_labeled_by_id_total"] == before["typedlm_answer_window_labeled_by_id_total"] + 1
    assert after["typedlm_answer_window_entries"] >= 2 and after["typedlm_answer_window_bytes"] > 0
    assert decider.feedback.store.count() == stored + 1
    with FeedbackStore(decider.feedback.store.path) as store:
        label = store.labels()[-1]
    assert (label.question_id, label.gold, label.sample, label.question) == ("team", 0, "random", TEAM)


def test_an_id_not_held_is_a_404_naming_it(served):
    url, _ = served
    before = metrics(url)["typedlm_answer_window_not_held_total"]
    reply = post(url, {"labels": [{"x_id": "nope-never-given", "gold": True}]})
    assert reply.status_code == 404
    detail = reply.json()["detail"]
    assert detail["error_type"] == "answer_not_held" and detail["x_ids"] == ["nope-never-given"]
    assert "nope-never-given" in detail["message"]
    assert metrics(url)["typedlm_answer_window_not_held_total"] == before + 1


@pytest.mark.parametrize("bound", ["bytes", "age"])
def test_an_answer_let_go_of_is_a_404_and_the_state_and_questions_still_label_it(loaded, tmp_path, bound):
    window = {"answer_window_bytes": 6000} if bound == "bytes" else {"answer_window_s": 0.5}
    decider = Decider(loaded, feedback_db=tmp_path / "f.sqlite", **window)
    with ServerThread(create_app(decider, ServerSettings())) as url:
        first = ask(url, "The app crashes when I open settings.")
        held = post(url, {"x_id": first["billing"], "gold": False})  # held now
        assert held.status_code == 200, held.text
        if bound == "bytes":
            for i in range(4):
                ask(url, f"Message {i}: where is my parcel?")
        else:
            time.sleep(1.0)
        reply = post(url, {"x_id": first["team"], "gold": "tech"})
        assert reply.status_code == 404 and reply.json()["detail"]["x_ids"] == [first["team"]]
        assert metrics(url)["typedlm_answer_window_evictions_total"] >= 1
        fallback = body("The app crashes when I open settings.") | {
            "gold": {"team": "tech"},
            "x_ids": {"team": first["team"]},
        }
        answered = post(url, fallback)
        assert answered.status_code == 200 and answered.json()["x_feedback_stored"] == 1
        assert "answers" in answered.json()  # answered again, as a post of old
    decider.close()


def test_what_to_label_next(served):
    url, decider = served
    for i in range(6):
        ask(url, f"Ticket {i}: please refund invoice {100 + i}.")
    family = decider.recent.held([ask(url, "One more ticket.")["billing"]])[0].family
    reply = httpx.get(f"{url}/v1/systemone/feedback/suggest", params={"family": family, "n": 2})
    assert reply.status_code == 200, reply.text
    suggested = reply.json()
    assert suggested["family"] == family and suggested["teach_by"] == "entropy" and suggested["answers"] >= 7
    assert len(suggested["random"]) == len(suggested["teach"]) == 2
    assert not set(suggested["random"]) & set(suggested["teach"])
    for key in suggested["random"] + suggested["teach"]:
        assert decider.recent.held([key])[0].question_id == "billing"
    labels = [{"x_id": key, "gold": True} for key in suggested["random"] + suggested["teach"]]
    posted = post(url, {"labels": labels}).json()  # posted as random
    samples = [posted["x_labels"][key]["sample"] for key in suggested["random"] + suggested["teach"]]
    assert samples == ["random", "random", "chosen", "chosen"]
    every = httpx.get(f"{url}/v1/systemone/feedback/suggest").json()  # any family, 10 of each
    assert every["family"] is None and not set(every["random"]) & set(suggested["random"] + suggested["teach"])


HOSTILE = [
    ["not", "an", "object"],
    {"x_id": 7, "gold": True},
    {"x_id": "", "gold": True},
    {"x_id": "a" * 101, "gold": True},
    {"x_id": "../../etc/passwd", "gold": True},
    {"x_id": "abc"},
    {"x_id": "abc", "gold": True, "labels": []},
    {"x_id": "abc", "gold": True, "state": "x", "questions": {"q": BILLING}},
    {"labels": "abc"},
    {"labels": []},
    {"labels": [{"x_id": "abc", "gold": True}] * (MAX_LABELS + 1)},
    {"labels": [{"x_id": "abc"}]},
    {"labels": [["abc", True]]},
    {"labels": [{"x_id": "abc", "gold": True}, {"x_id": "abc", "gold": False}]},
    {"x_id": "abc", "gold": True, "x_sample": "sometimes"},
    {"x_id": "abc", "gold": True, "x_feedback_id": 5},
    {"x_id": "abc", "gold": True, "model": 3},
    {"x_id": "abc", "gold": True, "model": "another-model"},
    body("x") | {"gold": {"billing": True}, "x_ids": ["abc"]},
    body("x") | {"gold": {"billing": True}, "x_ids": {"nobody": "abc"}},
    body("x") | {"gold": {"billing": True}, "x_ids": {"billing": {"id": 1}}},
    body("x") | {"gold": {"billing": True, "team": "tech"}, "x_ids": {"billing": "abc", "team": "abc"}},
]


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_body_gets_a_4xx_in_json_and_stores_nothing(served, hostile):
    url, decider = served
    stored = decider.feedback.store.count()
    reply = post(url, hostile)
    other_model = isinstance(hostile, dict) and hostile.get("model") == "another-model"
    assert reply.status_code == (404 if other_model else 422), reply.text
    assert reply.headers["content-type"] == "application/json" and "detail" in reply.json()
    assert decider.feedback.store.count() == stored


def test_a_gold_answer_not_of_its_answer_is_a_422_naming_it(served):
    url, decider = served
    ids = ask(url, "My password reset email never arrives.")
    stored = decider.feedback.store.count()
    for payload, loc in (
        ({"x_id": ids["team"], "gold": "sales"}, ["body", "gold"]),
        ({"x_id": ids["billing"], "gold": "yes"}, ["body", "gold"]),
        (
            {"labels": [{"x_id": ids["billing"], "gold": True}, {"x_id": ids["team"], "gold": 1}]},
            ["body", "labels", 1, "gold"],
        ),
    ):
        reply = post(url, payload)
        assert reply.status_code == 422 and reply.json()["detail"][0]["loc"] == loc, reply.text
    assert decider.feedback.store.count() == stored


@pytest.mark.parametrize("query", [{"n": 0}, {"n": MAX_SUGGESTIONS + 1}, {"n": "many"}, {"family": "f" * 65}])
def test_a_bad_suggestion_query_is_a_422(served, query):
    reply = httpx.get(f"{served[0]}/v1/systemone/feedback/suggest", params=query)
    assert reply.status_code == 422 and reply.json()["detail"][0]["loc"][0] == "query"


def test_a_server_without_feedback_gives_no_ids_and_refuses_labels_by_id(server_url):
    answers = httpx.post(f"{server_url}/v1/systemone", json=body("Hello."), timeout=60).json()["answers"]
    assert all("x_id" not in answer for answer in answers.values())
    for reply in (
        post(server_url, {"x_id": "abc", "gold": True}),
        httpx.get(f"{server_url}/v1/systemone/feedback/suggest"),
    ):
        assert reply.status_code == 404 and reply.json()["detail"]["error_type"] == "feedback_off"
    spec = httpx.get(f"{server_url}/openapi.json").json()
    assert "/v1/systemone/feedback/suggest" in spec["paths"]
    assert {"FeedbackById", "FeedbackLabels"} <= set(spec["components"]["schemas"])


def load_with_feedback(path: str) -> Decider:
    """A decider with a feedback database, loaded in the model process."""
    return Decider(load_model(None, "cpu", "float32"), feedback_db=path)


def test_labels_by_id_through_the_models_own_process(tmp_path):
    model = ModelProcess(functools.partial(load_with_feedback, str(tmp_path / "f.sqlite")), ServerSettings())
    try:
        with ServerThread(create_app(model, ServerSettings())) as url:
            ids = ask(url, "Please refund the extra payment on my card.")
            reply = post(
                url, {"labels": [{"x_id": ids["billing"], "gold": True}, {"x_id": ids["team"], "gold": "billing"}]}
            )
            assert reply.status_code == 200 and reply.json()["x_feedback_stored"] == 2, reply.text
            missing = post(url, {"x_id": "gone", "gold": True})
            assert missing.status_code == 404 and missing.json()["detail"]["x_ids"] == ["gone"]
            suggested = httpx.get(f"{url}/v1/systemone/feedback/suggest", params={"n": 5}).json()
            assert suggested["answers"] == 0  # both answers labeled
            window = httpx.get(f"{url}/health").json()["answer_window"]  # the counters of the last post
            assert (window["entries"], window["labeled_by_id"], window["not_held"]) == (2, 2, 1)
        with FeedbackStore(tmp_path / "f.sqlite") as store:
            assert [label.question_id for label in store.labels()] == ["billing", "team"]
    finally:
        model.close()
