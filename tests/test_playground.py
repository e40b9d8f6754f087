"""The playground page in a real headless Chromium against the real server: it loads, asks, and shows the
server's own numbers (skipped where playwright or a Chromium is not installed)."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import needs_chromium

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
    shown = {
        qid: {
            bar.get_attribute("data-label"): float(bar.get_attribute("data-value"))
            for bar in answer.query_selector_all(".bar")
        }
        for answer in page.query_selector_all(".answer")
        for qid in [answer.get_attribute("data-qid")]
    }
    # the same request, sent by the test, answers with the same numbers
    body = page.evaluate("buildBody()")
    assert body["questions"]["q4"] == {"type": "noul", "instructions": "Does the customer ask for a refund?"}
    direct = httpx.post(server_url + "/v1/systemone", json=body).json()["answers"]
    assert set(shown) == set(direct) == {"billing", "tone", "urgency", "q4"}
    for qid, answer in direct.items():
        if answer["type"] == "noul":
            assert shown[qid]["yes"] == pytest.approx(answer["noul"], abs=1e-12)
        elif answer["type"] == "choice":
            assert shown[qid] == pytest.approx(answer["probabilities"], abs=1e-12)
        else:
            values = [shown[qid][f"{i}: {answer['legend'][i]}"] for i in answer["probabilities"]]
            assert values == pytest.approx(list(answer["probabilities"].values()), abs=1e-12)
    usage = page.inner_text("#usage")
    assert "input tokens" in usage and " ms" in usage
    # the request shown as curl is the request sent
    curl = page.inner_text("#curl")
    assert json.loads(curl.split("-d '", 1)[1].rsplit("'", 1)[0]) == body
    assert "TypeSafeClient" in page.inner_text("#python") and "Noul(" in page.inner_text("#python")
    assert not page.errors


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
