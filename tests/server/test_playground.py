"""The playground page in a real headless Chromium against the real server: it loads, asks, and shows the
server's own numbers; it posts right answers as feedback and shows the feedback report (skipped where playwright or a
Chromium is not installed)."""

from __future__ import annotations

import json

import httpx
import pytest

from typedlm.decide.decider import Decider
from typedlm.runtime.models import load_model

from ..conftest import ServerThread, needs_chromium

pytest.importorskip("playwright.sync_api")
pytestmark = needs_chromium  # the page: conftest's Chromium page, one per module


def test_the_page_asks_and_shows_the_servers_numbers(page, server_url):
    for path in ("/", "/playground"):
        assert httpx.get(server_url + path).headers["content-type"].startswith("text/html")
    page.goto(server_url + "/")
    page.wait_for_selector("text=serving smollm2-135m-instruct")
    assert "http" not in "".join(
        page.eval_on_selector_all("script[src], link[href]", "els => els.map(e => e.src || e.href)")
    )
    page.fill("#state", "The parcel never arrived and I want my money back today.")
    page.click("[data-add=noul]")  # a fourth question, filled in
    page.fill("#questions .question:nth-child(4) .instructions", "Does the customer ask for a refund?")
    page.click("#ask")
    page.wait_for_selector(".answer[data-qid=q4]")
    shown = shown_numbers(page)
    # the same request, sent by the test, answers with the same numbers
    body = page.evaluate("buildBody()")
    assert body["questions"]["q4"] == {"type": "noul", "instructions": "Does the customer ask for a refund?"}
    direct = httpx.post(server_url + "/v1/systemone", json=body).json()["answers"]
    assert set(shown) == set(direct) == {"billing", "tone", "urgency", "q4"}
    assert_shown_as_answered(shown, direct)
    usage = page.inner_text("#usage")
    assert "input tokens" in usage and " ms" in usage
    # the request shown as curl is the request sent
    curl = page.inner_text("#curl")
    assert json.loads(curl.split("-d '", 1)[1].rsplit("'", 1)[0]) == body
    assert "TypeSafeClient" in page.inner_text("#python") and "Noul(" in page.inner_text("#python")
    assert not page.errors


def shown_numbers(page) -> dict[str, dict[str, float]]:
    """The numbers on the page's bars: {question id: {bar label: value}}."""
    return {
        qid: {
            bar.get_attribute("data-label"): float(bar.get_attribute("data-value"))
            for bar in answer.query_selector_all(".bar")
        }
        for answer in page.query_selector_all(".answer")
        for qid in [answer.get_attribute("data-qid")]
    }


def assert_shown_as_answered(shown: dict[str, dict[str, float]], answers: dict, abs: float = 1e-12) -> None:
    for qid, answer in answers.items():
        if answer["type"] == "noul":
            assert shown[qid]["yes"] == pytest.approx(answer["noul"], abs=abs)
        elif answer["type"] == "choice":
            assert shown[qid] == pytest.approx(answer["probabilities"], abs=abs)
        else:
            values = [shown[qid][f"{i}: {answer['legend'][i]}"] for i in answer["probabilities"]]
            assert values == pytest.approx(list(answer["probabilities"].values()), abs=abs)


def test_a_refused_request_shows_the_servers_message(page, server_url):
    page.goto(server_url + "/playground")
    page.wait_for_selector("#questions .question")
    page.select_option("#questions .question:nth-child(2) .qtype", "choice")
    page.fill("#questions .question:nth-child(2) .criteria", "only one option")
    page.click("#ask")
    error = page.wait_for_selector("#answers .error")
    assert "422" in error.inner_text() and "2 to 255" in error.inner_text()


def test_two_questions_with_one_id_are_reported_and_nothing_is_sent(page, fake_server_url):
    page.goto(fake_server_url + "/playground")
    page.wait_for_selector("#questions .question")
    sent: list[str] = []

    def note(request) -> None:
        if "/v1/systemone" in request.url:
            sent.append(request.url)

    page.on("request", note)
    page.fill("#questions .question:nth-child(3) .qid", " billing ")  # the first question's id, typed again
    page.click("#ask")
    error = page.wait_for_selector("#questions .question:nth-child(3) .qid-error", timeout=5_000)
    assert "billing" in error.inner_text() and "already" in error.inner_text()
    assert len(page.query_selector_all("#questions .qid-error")) == 1  # on the later question only
    page.wait_for_timeout(300)
    assert not sent and "not sent" in page.inner_text("#answers")
    # a fixed id: the error goes and the request is sent
    page.fill("#questions .question:nth-child(3) .qid", "urgency")
    page.click("#ask")
    page.wait_for_selector(".answer[data-qid=urgency]")
    assert not page.query_selector_all("#questions .qid-error") and len(sent) == 1
    # a question added after one was removed gets an id of its own (not the count's, q4 again)
    page.click("[data-add=noul]")
    page.click("#questions .question:nth-child(1) .remove")
    page.click("[data-add=score]")
    ids = page.eval_on_selector_all("#questions .qid", "els => els.map(e => e.value)")
    assert ids[:3] == ["tone", "urgency", "q4"] and len(set(ids)) == 4
    page.remove_listener("request", note)


def in_viewport(page, selector: str) -> bool:
    """Whether the element's top line is on screen."""
    return page.eval_on_selector(
        selector, "e => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.top < innerHeight; }"
    )


def test_answers_and_errors_arrive_in_view_of_a_scrolled_page(page, fake_server_url):
    page.set_viewport_size({"width": 1100, "height": 600})
    page.goto(fake_server_url + "/playground")
    page.wait_for_selector("#questions .question")
    for _ in range(3):
        page.click("[data-add=noul]")
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    assert not in_viewport(page, "#answers"), "the page is scrolled past the answers"
    page.click("#ask")
    page.wait_for_selector(".answer[data-qid=q6]")
    assert in_viewport(page, ".answer")
    # a refused request, asked from the bottom of the page again: its message is in view
    page.select_option("#questions .question:nth-child(2) .qtype", "choice")
    page.fill("#questions .question:nth-child(2) .criteria", "only one option")
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    assert not in_viewport(page, "#answers")
    page.click("#ask")
    page.wait_for_selector("#answers .error")
    assert in_viewport(page, "#answers .error")
    page.set_viewport_size({"width": 1280, "height": 720})


# -- feedback: right answers posted from the answers, and the report ------------------------------------------------

BILLING = "Is this message about billing?"  # the page's first example question


@pytest.fixture(scope="module")
def feedback_url(tmp_path_factory):
    from typedlm.server import ServerSettings, create_app

    decider = Decider(load_model(None, "cpu", "float32"), feedback_db=tmp_path_factory.mktemp("fb") / "f.sqlite")
    with ServerThread(create_app(decider, ServerSettings())) as url:
        yield url
    decider.close()


def meta(page, qid: str) -> str:
    return page.inner_text(f".answer[data-qid={qid}] .meta")


def family_card(page, instructions: str):
    return next(
        card for card in page.query_selector_all("#families .family") if card.inner_text().startswith(instructions)
    )


def only_failed_loads(errors: list[str]) -> bool:
    """Whether every error the page logged is Chromium's note of a refused request (its 404s and 422s): no
    exception, no other console error."""
    return all("Failed to load resource" in error for error in errors)


def test_a_right_answer_is_posted_stored_and_used_by_the_next_answers(page, feedback_url):
    page.goto(feedback_url + "/playground")
    page.wait_for_selector("text=serving smollm2-135m-instruct")
    page.wait_for_selector("#feedback-summary:has-text('0 labels')")  # loaded at once: this server keeps feedback
    page.click("#ask")
    page.wait_for_selector(".answer[data-qid=billing]")
    assert "calibrated" not in meta(page, "billing")
    page.click(".answer[data-qid=billing] button[data-gold=true]")
    page.wait_for_selector(".answer[data-qid=billing] .meta:has-text('label stored')")
    assert "now calibrated at exact level from 1 label" in meta(page, "billing")
    assert page.get_attribute(".answer[data-qid=billing] button[data-gold=true]", "aria-pressed") == "true"
    # the report, refreshed after the post: the family with its one label, too few to learn from yet
    page.wait_for_selector("#families .family[data-labels='1']")
    card = family_card(page, BILLING)
    assert "noul · 1 label" in card.inner_text()
    assert "10 labels" in card.query_selector("tr[data-row=feedback]").inner_text()
    assert not card.query_selector_all("rect.bin.feedback") and card.query_selector_all("rect.bin.default")
    # asked again: the answer is calibrated from the label, and shows the server's own numbers
    page.click("#ask")
    page.wait_for_selector(".answer[data-qid=billing] .meta:has-text('calibrated from 1 label (exact)')")
    shown = shown_numbers(page)
    direct = httpx.post(feedback_url + "/v1/systemone", json=page.evaluate("buildBody()"), timeout=60).json()
    assert direct["x_calibration"] == "feedback" and direct["answers"]["billing"]["x_feedback"]["labels"] == 1
    assert set(shown) == set(direct["answers"])
    assert_shown_as_answered(shown, direct["answers"], abs=1e-9)
    assert "calibration feedback" in page.inner_text("#usage")
    assert only_failed_loads(page.errors)


def test_the_report_shows_default_and_learned_scores_and_a_reliability_diagram(page, feedback_url):
    documents = [
        "I was charged twice this month.",
        "The app crashes on start.",
        "Refund my card.",
        "Reset my password.",
    ]
    for i in range(12):
        body = {
            "state": f"{documents[i % 4]} (ticket {i})",
            "questions": {"billing": {"type": "noul", "instructions": BILLING}},
            "gold": {"billing": i % 4 in (0, 2)},
        }
        reply = httpx.post(feedback_url + "/v1/systemone/feedback", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
    report = httpx.get(feedback_url + "/v1/systemone/feedback").json()
    (family,) = [f for f in report["families"] if f["instructions"] == BILLING]
    page.goto(feedback_url + "/playground")
    page.click("#refresh")
    page.wait_for_selector(f"#families .family[data-labels='{family['labels']}']")
    card = family_card(page, BILLING)
    assert family["labels"] >= 12 and f"{family['labels']} labels" in card.inner_text()
    for row, scores in (("default", family["default"]), ("feedback", family["feedback"])):
        cells = [td.inner_text() for td in card.query_selector_all(f"tr[data-row={row}] td")]
        ece = f"{scores['ece']:.3f} (noise floor {scores['ece_floor90']:.3f})"
        assert cells[1:] == [f"{scores['accuracy']:.3f}", f"{scores['log_loss']:.3f}", ece]
        # one bar per non-empty bin, in the calibration's own color
        assert len(card.query_selector_all(f"svg rect.bin.{row}")) == len(scores["reliability"]) > 0
    assert card.query_selector("svg line[stroke-dasharray]")  # the diagonal
    assert "default" in card.inner_text() and "learned (cross-validated)" in card.inner_text()  # the legend
    # what may be handed over: the certified shares and set sizes as the report gives them, and the curve
    handover = family["handover"]
    assert handover["fair_labels"] >= 12 and f"{handover['fair_labels']} fair labels" in card.inner_text()
    sizes = [td.inner_text() for td in card.query_selector_all("table.handover tr[data-row=sets] td")][1:]
    assert sizes == [f"{s['mean_size']:.2f}" if s["guaranteed"] else "every answer" for s in handover["sets"]]
    assert len(card.query_selector_all("svg.automation circle")) == len(handover["curve"]) > 0
    # an answer asked with a coverage shows its set and what it rests on
    page.fill("#coverage", "0.8")
    page.click("#ask")
    page.wait_for_selector(".answer[data-qid=billing] .meta:has-text('set {')")
    assert "fair label" in meta(page, "billing") and page.evaluate("buildBody()")["x_coverage"] == 0.8
    # a narrow screen: one column, nothing wider than the window
    page.set_viewport_size({"width": 400, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.set_viewport_size({"width": 1280, "height": 720})
    assert only_failed_loads(page.errors)


def test_a_server_without_feedback_says_how_to_turn_it_on(page, server_url):
    before = len(page.requested)
    page.goto(server_url + "/playground")
    page.wait_for_selector("text=serving smollm2-135m-instruct")
    page.wait_for_load_state("networkidle")
    assert not [url for url in page.requested[before:] if "/feedback" in url]  # no report asked of it on load
    page.click("#ask")
    page.wait_for_selector(".answer[data-qid=tone] button[data-gold]")
    page.click(".answer[data-qid=billing] button[data-gold=false]")
    outcome = page.wait_for_selector(".answer[data-qid=billing] .outcome.error")
    assert "keeps no feedback" in outcome.inner_text() and "typedlm serve --feedback-db PATH" in outcome.inner_text()
    page.click(".answer[data-qid=tone] button[data-gold='\"calm\"']")
    page.wait_for_selector(".answer[data-qid=tone] .outcome.error:has-text('keeps no feedback')")
    page.click("#refresh")
    page.wait_for_selector("#feedback-summary.error:has-text('typedlm serve --feedback-db PATH')")
    assert not page.query_selector_all("#families .family")
    assert page.is_enabled(".answer[data-qid=billing] button[data-gold=true]")  # the page goes on working
    assert only_failed_loads(page.errors)
