"""Readouts record what a decider reads, and give back the probabilities the decider itself answers with."""

from __future__ import annotations

import gzip
import shutil

import pytest

from typedlm.core.questions import parse_questions
from typedlm.offline.evaldata import Example
from typedlm.offline.readouts import Readout, load, record, save

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


def test_readouts_are_read_back_from_gzip_files_as_from_plain_ones(tmp_path):
    readouts = [
        Readout("test", "a", "late", "noul", "sig-noul", [[0.25, 0.5]], [[0.5, 0.25]], 1),
        Readout(
            "test", "a", "topic", "choice", "sig-choice", [[0.1, 0.2, 0.3]] * 3, [[0.3, 0.2, 0.1]] * 3, 2, [1, 2, 1]
        ),
    ]
    save(tmp_path / "r.jsonl", readouts)
    with (tmp_path / "r.jsonl").open("rb") as plain, gzip.open(tmp_path / "r.jsonl.gz", "wb") as packed:
        shutil.copyfileobj(plain, packed)  # compressed by another tool than `save`
    assert load(tmp_path / "r.jsonl.gz") == load(tmp_path / "r.jsonl") == readouts
    save(tmp_path / "s.jsonl.gz", readouts)
    assert gzip.decompress((tmp_path / "s.jsonl.gz").read_bytes()) == (tmp_path / "r.jsonl").read_bytes()
    assert load(tmp_path / "s.jsonl.gz") == readouts
