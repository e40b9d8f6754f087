"""Readouts record what a decider reads, and give back the probabilities the decider itself answers with."""

from __future__ import annotations

import pytest

from typedlm.core.questions import parse_questions
from typedlm.offline.evaldata import Example
from typedlm.offline.readouts import load, record, save

QUESTIONS = {
    "late": {"type": "noul", "instructions": "Is the parcel late?"},
    "topic": {"type": "choice", "criteria": {"billing": None, "shipping": "parcels", "account": None}},
    "stars": {"type": "score", "criteria": ["bad", "fine", "good", "great"]},
}
EXAMPLES = [
    Example("a", "test", "The parcel came a week late.", QUESTIONS, {"late": True, "topic": "shipping", "stars": 0}),
    Example("b", "test", "Billing was fine.", QUESTIONS, {"late": False, "topic": "billing", "stars": 2}),
]


@pytest.mark.parametrize("reads", [1, 3])
def test_a_readout_gives_the_deciders_own_probabilities(tiny_decider, tmp_path, reads):
    readouts = record(tiny_decider, EXAMPLES, "test", order_reads=reads)
    assert [(r.example, r.question, r.gold) for r in readouts[:3]] == [
        ("a", "late", 0),
        ("a", "topic", 1),
        ("a", "stars", 0),
    ]
    save(tmp_path / "r.jsonl", readouts)
    assert load(tmp_path / "r.jsonl") == readouts
    questions = parse_questions(QUESTIONS)
    for method in ("raw", "contextual"):
        for example in EXAMPLES:
            response = tiny_decider.decide(example.state, questions, calibration=method, order_reads=reads)
            for r in (r for r in readouts if r.example == example.id):
                probs, mass, disagreement = r.base(method)
                answer = response.answers[r.question]
                want = questions[r.question].wire_probabilities(answer.to_wire())
                assert probs == pytest.approx(want, abs=1e-12) and mass == pytest.approx(answer.raw_mass, abs=1e-12)
                assert 0 <= disagreement <= 1 and (reads == 3 or disagreement == 0)
    assert all(len(r.masses) == (1 if r.kind == "noul" else reads) for r in readouts)
