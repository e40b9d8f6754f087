"""Feedback: gold answers posted back, stored, learned, and used by the answers that follow — on the real embedded
model, through the decider, a real HTTP server, and two deciders sharing one database as replicas do."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from typedlm.core.errors import InvalidRequest
from typedlm.decide.decider import Decider
from typedlm.runtime.models import load_model
from typedlm.server import ServerSettings, create_app
from typedlm.store.feedback import FeedbackStore

from ..conftest import ServerThread, json_leaves


def assert_same_answers(a: dict, b: dict) -> None:
    """The same answers, floats to a relative 1e-5: a document read a second time is read over its cached prefix,
    whose float32 sums may differ from the first read's in the last bits (about 1e-6 on two threads)."""
    leaves_a, leaves_b = dict(json_leaves(a)), dict(json_leaves(b))
    assert leaves_a.keys() == leaves_b.keys()
    for path, value in leaves_a.items():
        assert value == (pytest.approx(leaves_b[path], rel=1e-5) if isinstance(value, float) else leaves_b[path]), path


BILLING = {"type": "noul", "instructions": "Is this message about billing?"}
TEAM = {"type": "choice", "instructions": "Which team should handle it?", "criteria": {"billing": None, "tech": None}}
DOCUMENTS = [
    "I was charged twice for my subscription this month.",
    "The app crashes whenever I open the settings page.",
    "Please refund the extra payment on my card.",
    "My password reset email never arrives.",
]


def answers_of(response: dict) -> dict:
    """A response's answers as {question.field: number} and {question.field: other value}."""
    flat = {}
    for qid, answer in response["answers"].items():
        for field, value in answer.items():
            for key, item in value.items() if isinstance(value, dict) else [("", value)]:
                flat[f"{qid}.{field}.{key}"] = item
    return flat


def same_answers(one: dict, other: dict) -> bool:
    """Equal answers, numbers to 1e-6 (the learner refitted at once or label by label differs by about 1e-11)."""
    a, b = answers_of(one), answers_of(other)
    return a.keys() == b.keys() and all(
        a[k] == pytest.approx(b[k], abs=1e-6) if isinstance(a[k], float) else a[k] == b[k] for k in a
    )


def body(document: str, **more) -> dict:
    return {"state": document, "questions": {"billing": BILLING, "team": TEAM}, **more}


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, "cpu", "float32")


def decider_on(loaded, db, **options) -> Decider:
    return Decider(loaded, feedback_db=db, **options)


def test_without_labels_the_answers_are_the_defaults_bit_for_bit(loaded, tmp_path):
    with_feedback, without = decider_on(loaded, tmp_path / "f.sqlite"), Decider(loaded)
    assert with_feedback.calibration == "feedback"
    for document in DOCUMENTS:
        assert with_feedback.respond(body(document)) == without.respond(body(document))
    with_feedback.close()


def test_a_post_answers_as_before_stores_its_labels_and_moves_later_answers(loaded, tmp_path):
    decider = decider_on(loaded, tmp_path / "f.sqlite")
    before = decider.respond(body(DOCUMENTS[0]))
    posted = decider.respond_feedback(body(DOCUMENTS[0], gold={"billing": True, "team": "billing"}))
    assert_same_answers(posted["answers"], before["answers"])
    assert posted["x_calibration"] == before["x_calibration"]
    in_force = {"level": "exact", "labels": 1, "readout": "calibrated"}
    assert posted["x_feedback"] == {"billing": in_force, "team": in_force}
    assert posted["x_feedback_stored"] == 2
    after = decider.respond(body(DOCUMENTS[0]))
    assert after["x_calibration"] == "feedback"
    assert after["answers"]["billing"]["x_feedback"] == in_force
    assert after["answers"]["billing"]["noul"] > before["answers"]["billing"]["noul"]  # toward the gold yes
    assert after["answers"]["billing"]["x_raw_mass"] == pytest.approx(
        before["answers"]["billing"]["x_raw_mass"], rel=1e-5
    )
    # a request's own method still wins, and gives what it gave before
    raw = decider.respond(body(DOCUMENTS[0], x_calibration="raw"))["answers"]
    fresh = Decider(loaded, calibration="raw").respond(body(DOCUMENTS[0]))["answers"]  # nothing cached: 1e-6 apart
    assert "x_feedback" not in raw["billing"] and raw["billing"]["noul"] == pytest.approx(
        fresh["billing"]["noul"], rel=1e-5
    )
    assert raw["team"]["probabilities"] == pytest.approx(fresh["team"]["probabilities"], rel=1e-5)
    decider.close()


def test_a_retried_post_counts_once(loaded, tmp_path):
    decider = decider_on(loaded, tmp_path / "f.sqlite")
    post = body(DOCUMENTS[1], gold={"team": "tech"}, x_feedback_id="ticket-7")
    assert decider.respond_feedback(post)["x_feedback_stored"] == 1
    again = decider.respond_feedback(post)
    assert again["x_feedback_stored"] == 0 and again["x_feedback"]["team"]["labels"] == 1
    assert decider.feedback.store.count() == 1
    decider.close()


@pytest.mark.parametrize(
    ("gold", "loc"),
    [
        ({"billing": "yes"}, ["body", "gold", "billing"]),
        ({"team": "sales"}, ["body", "gold", "team"]),
        ({"nobody": True}, ["body", "gold", "nobody"]),
        ({}, ["body", "gold"]),
        ("billing", ["body", "gold"]),
    ],
)
def test_a_bad_gold_answer_is_refused_naming_it_and_nothing_is_stored(loaded, tmp_path, gold, loc):
    decider = decider_on(loaded, tmp_path / "f.sqlite")
    with pytest.raises(InvalidRequest) as refused:
        decider.respond_feedback(body(DOCUMENTS[0], gold=gold))
    assert ["body", *refused.value.loc] == loc
    assert decider.feedback.store.count() == 0
    decider.close()


def test_labels_survive_a_restart_and_give_the_same_answers(loaded, tmp_path):
    db = tmp_path / "f.sqlite"
    first = decider_on(loaded, db)
    for document, yes in zip(DOCUMENTS, (True, False, True, False)):
        first.respond_feedback(body(document, gold={"billing": yes}))
    answers = first.respond(body(DOCUMENTS[2]))
    first.close()
    restarted = decider_on(loaded, db)
    assert restarted.feedback.learned == 4
    assert same_answers(restarted.respond(body(DOCUMENTS[2])), answers)
    restarted.close()


def test_labels_posted_to_one_decider_are_used_by_another_on_the_same_database(loaded, tmp_path):
    db = tmp_path / "f.sqlite"
    one, two = decider_on(loaded, db, feedback_poll_s=0.05), decider_on(loaded, db, feedback_poll_s=0.05)
    one.respond_feedback(body(DOCUMENTS[0], gold={"billing": True}))
    deadline = time.monotonic() + 10
    while two.feedback.learned < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert same_answers(two.respond(body(DOCUMENTS[0])), one.respond(body(DOCUMENTS[0])))
    one.close()
    two.close()


def test_labels_of_another_reading_are_not_learned(loaded, tmp_path):
    db = tmp_path / "f.sqlite"
    letters = decider_on(loaded, db, choice_answers="letters")
    letters.respond_feedback(body(DOCUMENTS[0], gold={"team": "billing"}))
    names = decider_on(loaded, db, choice_answers="names")
    assert names.feedback.learned == 0  # its choices are read another way: those masses mean something else
    letters.close()
    names.close()


def test_without_a_database_feedback_calibration_is_the_default_and_a_post_is_refused(loaded):
    decider = Decider(loaded)
    asked = decider.respond(body(DOCUMENTS[0], x_calibration="feedback"))  # no labels: the default's answers
    assert_same_answers(asked["answers"], decider.respond(body(DOCUMENTS[0]))["answers"])
    assert asked["x_calibration"] == decider.calibration
    with pytest.raises(InvalidRequest, match="feedback database"):
        decider.respond_feedback(body(DOCUMENTS[0], gold={"billing": True}))


def test_the_report_scores_each_family_default_and_learned(loaded, tmp_path):
    decider = decider_on(loaded, tmp_path / "f.sqlite")
    for i in range(12):
        decider.respond_feedback(body(f"{DOCUMENTS[i % 4]} (case {i})", gold={"billing": i % 4 in (0, 2)}))
    report = decider.feedback_report()
    assert report["labels"] == 12 and report["families_labeled"] == 1
    (family,) = report["families"]
    assert family["kind"] == "noul" and family["labels"] == family["measured_on"] == 12
    assert family["instructions"] == BILLING["instructions"]
    for scores in (family["default"], family["feedback"]):
        assert 0 <= scores["accuracy"] <= 1 and scores["log_loss"] > 0
        assert 0 <= scores["ece"] <= 1 and 0 <= scores["ece_floor90"] <= 1
        assert sum(b["count"] for b in scores["reliability"]) == 12
    stats = decider.stats()["feedback"]
    assert stats["labels"] == stats["held"] == 12 and stats["bytes"] > 0
    decider.close()


# -- over HTTP --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def feedback_server(loaded, tmp_path_factory):
    db = tmp_path_factory.mktemp("feedback") / "f.sqlite"
    decider = decider_on(loaded, db)
    with ServerThread(create_app(decider, ServerSettings(max_queue=32))) as url:
        yield url, decider


def test_sixteen_clients_posting_at_once_lose_nothing(feedback_server):
    url, decider = feedback_server
    before = decider.feedback.store.count()

    def post(i: int) -> httpx.Response:
        gold = {"billing": i % 2 == 0, "team": "billing" if i % 2 == 0 else "tech"}
        document = f"Ticket {i}: {DOCUMENTS[i % 4]}"
        return httpx.post(f"{url}/v1/systemone/feedback", json=body(document, gold=gold), timeout=120)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(post, range(16)))
    assert [r.status_code for r in replies] == [200] * 16, [r.text for r in replies if r.status_code != 200]
    assert sum(r.json()["x_feedback_stored"] for r in replies) == 32
    assert decider.feedback.store.count() == before + 32
    report = httpx.get(f"{url}/v1/systemone/feedback").json()
    assert report["labels"] == before + 32
    assert {f["kind"] for f in report["families"]} == {"noul", "choice"}


def test_a_bad_post_over_http_is_a_422_naming_the_field(feedback_server):
    url, decider = feedback_server
    before = decider.feedback.store.count()
    reply = httpx.post(f"{url}/v1/systemone/feedback", json=body(DOCUMENTS[0], gold={"team": "sales"}))
    assert reply.status_code == 422
    assert reply.json()["detail"][0]["loc"] == ["body", "gold", "team"]
    reply = httpx.post(f"{url}/v1/systemone/feedback", json=body(DOCUMENTS[0], gold={"team": "tech"}, x_feedback_id=5))
    assert reply.status_code == 422 and reply.json()["detail"][0]["loc"] == ["body", "x_feedback_id"]
    assert decider.feedback.store.count() == before


def test_a_server_without_feedback_answers_404_and_documents_the_routes(server_url):
    reply = httpx.post(f"{server_url}/v1/systemone/feedback", json=body(DOCUMENTS[0], gold={"billing": True}))
    assert reply.status_code == 404 and reply.json()["detail"]["error_type"] == "feedback_off"
    assert httpx.get(f"{server_url}/v1/systemone/feedback").status_code == 404
    spec = httpx.get(f"{server_url}/openapi.json").json()
    assert {"post", "get"} <= set(spec["paths"]["/v1/systemone/feedback"])
    assert "gold" in spec["components"]["schemas"]["FeedbackRequest"]["properties"]


def test_the_store_holds_what_the_model_read(feedback_server):
    url, decider = feedback_server
    reply = httpx.post(f"{url}/v1/systemone/feedback", json=body(DOCUMENTS[3], gold={"billing": False}))
    assert reply.status_code == 200
    with FeedbackStore(decider.feedback.store.path) as store:
        label = store.labels()[-1]
    assert label.kind == "noul" and label.gold == 1 and label.question == BILLING
    read = decider.read(DOCUMENTS[3], {"q": decider_question(BILLING)}, contextual=True).reads["q"]
    assert label.masses[0] == pytest.approx(read.masses[0], abs=1e-5) and len(label.masses) == len(read.masses)


def decider_question(wire: dict):
    from typedlm.core.questions import parse_question

    return parse_question(wire, ("q",))


def test_a_batch_job_posts_its_gold_column_and_answers_later_rows_with_it(loaded, tmp_path):
    from typedlm.jobs.batch import run_batch

    rows = [body(d, gold={"billing": d in (DOCUMENTS[0], DOCUMENTS[2])}) for d in DOCUMENTS]
    rows.append(body("Where is my invoice for March?"))
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    decider = decider_on(loaded, tmp_path / "f.sqlite")
    summary = run_batch(decider, source, tmp_path / "out.jsonl")
    assert summary.answered == 5 and summary.errors == 0
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["response"].get("x_feedback_stored") for r in records] == [1, 1, 1, 1, None]
    assert records[-1]["response"]["answers"]["billing"]["x_feedback"]["labels"] == 4
    assert decider.feedback.store.count() == 4
    decider.close()
    # without a database, a row with gold answers is an error record naming it
    summary = run_batch(Decider(loaded), source, tmp_path / "plain.jsonl")
    records = [json.loads(line) for line in (tmp_path / "plain.jsonl").read_text().splitlines()]
    assert summary.errors == 4 and records[0]["error"]["status"] == 422
    assert records[0]["error"]["detail"][0]["loc"] == ["body", "gold"]
