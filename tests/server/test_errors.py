"""The one error table (`hosting.status.status_of`) as the routes answer it. An error raised while answering gets
the table's status, type, message and headers on /v1/systemone (Jev's shape) and on /v1/chat/completions (OpenAI's
shape: a 400 where Jev answers 422, every refused request an invalid_request_error, `param` the field at fault); a
failure (a 5xx that is not an APIError's) goes to the app's handlers on both routes, in Jev's shape."""

from __future__ import annotations

import json

import httpx
import pytest

from typedlm.core.errors import InvalidRequest, LimitExceeded, ModelError, StoreError
from typedlm.hosting.status import APIError, error_status, status_of
from typedlm.server import ServerSettings, create_app

from ..conftest import FakeDecider, ServerThread

QUESTIONS = {"billing": {"type": "noul", "instructions": "Is this message about billing?"}}
STATE = "I was charged twice."
SYSTEMONE = {"state": STATE, "questions": QUESTIONS}
CHAT = {"messages": [{"role": "system", "content": json.dumps(QUESTIONS)}, {"role": "user", "content": STATE}]}


@pytest.fixture(scope="module")
def failing():
    decider = FakeDecider()
    with ServerThread(create_app(decider, ServerSettings())) as url:
        yield decider, url
    decider.fail_with = None


REFUSED = "invalid_request_error"
# the error raised; Jev's status; the chat route's status, type and param; the headers both answer with
REFUSALS = [
    (LimitExceeded("the prompt has 9000 tokens; the context is 8192", ("state",)), 413, 413, REFUSED, None, {}),
    (InvalidRequest("not an option", ("questions", "billing"), "enum"), 422, 400, REFUSED, "questions.billing", {}),
    (InvalidRequest("the state is empty"), 422, 400, REFUSED, None, {}),
    (APIError(503, "overloaded", "busy", {"Retry-After": "3"}), 503, 503, "overloaded", None, {"retry-after": "3"}),
    (APIError(504, "timeout", "the request took longer than 1 s"), 504, 504, "timeout", None, {}),
    (APIError(404, "model_not_found", "unknown model 'gpt-9'"), 404, 404, "model_not_found", None, {}),
]  # fmt: skip
FAILURES = [
    (StoreError("the feedback database is locked"), 503, "feedback_unavailable"),
    (ModelError("the tokenizer cannot be read"), 500, "model_error"),
    (RuntimeError("a bug"), 500, "internal_error"),
]


@pytest.mark.parametrize(("error", "status", "chat_status", "chat_type", "param", "headers"), REFUSALS)
def test_a_refusal_answers_by_the_table_on_both_routes(failing, error, status, chat_status, chat_type, param, headers):
    decider, url = failing
    decider.fail_with = error
    jev = httpx.post(url + "/v1/systemone", json=SYSTEMONE, timeout=30)
    chat = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert (jev.status_code, jev.json()) == error_status(error) and jev.status_code == status, jev.text
    table = status_of(error)
    expected = {"message": table.message, "type": chat_type, "param": param, "code": None}
    assert chat.status_code == chat_status and chat.json() == {"error": expected}, chat.text
    for resp in (jev, chat):
        assert {k: resp.headers.get(k) for k in headers} == headers and "connection" not in resp.headers


@pytest.mark.parametrize(("error", "status", "error_type"), FAILURES)
def test_a_failure_answers_in_jevs_shape_and_closes_the_connection_on_both_routes(failing, error, status, error_type):
    decider, url = failing
    decider.fail_with = error
    for path, body in (("/v1/systemone", SYSTEMONE), ("/v1/chat/completions", CHAT)):
        resp = httpx.post(url + path, json=body, timeout=30)
        assert resp.status_code == status and resp.headers["connection"] == "close", (path, resp.text)
        assert resp.json()["detail"]["error_type"] == error_type == status_of(error).error_type, (path, resp.text)
