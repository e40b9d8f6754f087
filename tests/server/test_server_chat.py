"""POST /v1/chat/completions with the official `openai` client: decisions in, answers as JSON out.

The end-to-end test (real answers, equal to /v1/systemone's) runs on the real embedded model (`client`); the
request forms and error shapes of the chat route run on a `FakeDecider` (`fake_client`).
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this message about billing?"},
    "tone": {"type": "choice", "criteria": {"angry": None, "calm": None}},
    "urgency": {"type": "score", "criteria": ["low", "high"]},
}
STATE = "I was charged twice. Please refund me."


@pytest.fixture
def client(server_url):
    with openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture
def fake_client(fake_server_url):
    with openai.OpenAI(base_url=fake_server_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_a_question_schema_gets_answers_as_json_and_matches_systemone(client, server_url):
    completion = client.chat.completions.create(
        model="jev-latest",
        messages=[{"role": "system", "content": json.dumps(QUESTIONS)}, {"role": "user", "content": STATE}],
    )
    assert completion.object == "chat.completion" and completion.model == "smollm2-135m-instruct"
    assert completion.choices[0].finish_reason == "stop" and completion.usage.completion_tokens == 0
    answers = json.loads(completion.choices[0].message.content)
    direct = httpx.post(
        server_url + "/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": QUESTIONS}
    )
    assert answers == direct.json()["answers"]


def test_the_wrapped_form_and_text_parts_are_accepted(fake_client, fake_decider):
    completion = fake_client.chat.completions.create(
        model=fake_decider.name,
        messages=[
            {"role": "system", "content": json.dumps({"questions": {"q": QUESTIONS["billing"]}})},
            {"role": "user", "content": [{"type": "text", "text": STATE}]},
        ],
    )
    assert json.loads(completion.choices[0].message.content)["q"]["type"] == "noul"
    assert completion.model == fake_decider.name
    assert fake_decider.calls[-1].state == STATE and list(fake_decider.calls[-1].questions) == ["q"]


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ([{"role": "user", "content": "Write me a poem."}], "does not generate"),
        ([{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"}], "does not generate"),
        ([{"role": "system", "content": json.dumps(QUESTIONS)}], "one user message"),
        (
            [
                {"role": "system", "content": json.dumps({"q": {"type": "choice", "criteria": {"a": None}}})},
                {"role": "user", "content": STATE},
            ],
            "2 to 255",
        ),
    ],
)
def test_anything_else_is_a_clear_400(fake_client, messages, words):
    with pytest.raises(openai.BadRequestError) as caught:
        fake_client.chat.completions.create(model="jev-latest", messages=messages)
    assert words in caught.value.message


def test_unknown_model_is_404(fake_client):
    with pytest.raises(openai.NotFoundError) as caught:
        fake_client.chat.completions.create(
            model="gpt-9",
            messages=[{"role": "system", "content": json.dumps(QUESTIONS)}, {"role": "user", "content": "x"}],
        )
    assert "gpt-9" in caught.value.message and caught.value.body["type"] == "model_not_found"


def test_stream_true_gets_server_sent_events_the_openai_client_reads(fake_client, fake_decider):
    messages = [{"role": "system", "content": json.dumps(QUESTIONS)}, {"role": "user", "content": STATE}]
    plain = fake_client.chat.completions.create(model="jev-latest", messages=messages)
    stream = fake_client.chat.completions.create(
        model="jev-latest", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(content) == json.loads(plain.choices[0].message.content)
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, "stop"]
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens and chunks[-1].usage.completion_tokens == 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == plain.usage.prompt_tokens_details.cached_tokens
    without_usage = list(fake_client.chat.completions.create(model="jev-latest", messages=messages, stream=True))
    assert all(c.usage is None for c in without_usage) and len(without_usage) == 2


def test_n_above_one_and_a_bad_stream_flag_are_400(fake_client):
    messages = [{"role": "system", "content": json.dumps(QUESTIONS)}, {"role": "user", "content": STATE}]
    with pytest.raises(openai.BadRequestError) as caught:
        fake_client.chat.completions.create(model="jev-latest", messages=messages, n=2)
    assert caught.value.body["param"] == "n" and "n must be 1" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        fake_client.chat.completions.create(model="jev-latest", messages=messages, extra_body={"stream": "yes"})
    assert caught.value.body["param"] == "stream"


def test_bad_bodies_get_openai_shaped_400s_without_a_made_up_param(fake_server_url):
    url = fake_server_url + "/v1/chat/completions"
    resp = httpx.post(url, content=b'{"messages": [', headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] is None, resp.text  # was "14": a byte offset
    deep = "[" * 1000 + "]" * 1000
    for system in (deep, '{"q": {"type": "noul", "instructions": "\\ud800"}}'):
        body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": STATE}]}
        resp = httpx.post(url, json=body)
        error = resp.json()["error"]
        assert resp.status_code == 400 and "system message" in error["message"], resp.text
    raw = '{"messages": [{"role": "user", "content": "hi \\udc00"}]}'
    resp = httpx.post(url, content=raw.encode(), headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "surrogate" in resp.json()["error"]["message"]


def test_auth_errors_on_the_chat_route_use_openai_shape(fake_keyed_server_url):
    client = openai.OpenAI(base_url=fake_keyed_server_url + "/v1", api_key="wrong", max_retries=0)
    with client, pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="jev-latest", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["type"] == "authentication_error" and "not valid" in caught.value.message
    assert caught.value.response.headers["www-authenticate"] == "Bearer"
