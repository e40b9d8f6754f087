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
