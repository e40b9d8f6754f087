"""The first hour: the model a newcomer meets (`make serve`'s default, `catalog.DEFAULT_ORDER`'s first) answers
obvious questions right, with confidence. Run where that model is installed (`typedlm models install
qwen2.5-coder-1.5b`), skipped with a message elsewhere; a future default that answered 0.5 to these fails here."""

from __future__ import annotations

import pytest

from typedlm.runtime.catalog import DEFAULT_ORDER

NEWCOMERS_MODEL = DEFAULT_ORDER[0]
CONFIDENT = 0.7  # the probability the right answer must get

pytestmark = pytest.mark.skipif(
    not NEWCOMERS_MODEL.installed(),
    reason=f"{NEWCOMERS_MODEL.name} is not installed: `{NEWCOMERS_MODEL.install_command}` runs these checks",
)

# (document, question, the right answer): yes/no, sentiment, topic and routing, each beyond doubt for a reader
OBVIOUS = [
    (
        "Hi, I was charged twice for my March invoice. Please refund the second payment as soon as possible.",
        {"type": "noul", "instructions": "Is this message about billing?"},
        True,
    ),
    (
        "The new stadium opens on Saturday with a football match between the two city rivals.",
        {"type": "noul", "instructions": "Is this text about cooking?"},
        False,
    ),
    (
        "Absolutely loved it. The best film I have seen this year; I laughed and cried and want to watch it again.",
        {"type": "choice", "instructions": "What is the sentiment of this review?",
         "criteria": {"positive": None, "negative": None}},
        "positive",
    ),
    (
        "Terrible. The battery died after two days, support never answered, and I want my money back.",
        {"type": "choice", "instructions": "What is the sentiment of this review?",
         "criteria": {"positive": None, "negative": None}},
        "negative",
    ),
    (
        "The striker scored twice in the second half and the team won the championship final 3-1.",
        {"type": "choice", "instructions": "What is the topic of this article?",
         "criteria": {"sports": None, "politics": None, "technology": None}},
        "sports",
    ),
    (
        "My password reset link does not work and I cannot log in to my account.",
        {"type": "choice", "instructions": "Which team should handle this ticket?",
         "criteria": {"billing": "payments, invoices, refunds", "technical support": "log-in, bugs, errors",
                      "sales": "new purchases and quotes"}},
        "technical support",
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def newcomers_decider():
    from typedlm import Decider

    return Decider.load(NEWCOMERS_MODEL.aliases[0], feedback_db="none")


@pytest.mark.parametrize(("state", "question", "right"), OBVIOUS, ids=[q["instructions"] for _, q, _ in OBVIOUS])
def test_the_default_model_answers_an_obvious_question_right_with_confidence(newcomers_decider, state, question, right):
    answer = newcomers_decider.respond({"state": state, "questions": {"q": question}})["answers"]["q"]
    if question["type"] == "noul":
        p_right = answer["noul"] if right else 1 - answer["noul"]
    else:
        p_right = answer["probabilities"][right]
    assert p_right >= CONFIDENT, f"{right!r} got {p_right:.3f}: {answer}"
