"""A readout learned from the model's hidden state, end to end on the real embedded model: posts store each read's
features, the readout earns its place by cross-validation, answers say they used it and are more right, and the sets
and certificates speak of the answer the readout gives (the one shown)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from typedlm.calibrate.projection import FEATURE_DIMS, decode
from typedlm.core.questions import Handover, parse_question
from typedlm.decide.decider import Decider
from typedlm.runtime.models import load_model

QUESTION = {"type": "noul", "instructions": "Is this message about a payment?"}
PAYMENT = [
    "I was charged twice for",
    "Please refund the payment for",
    "The invoice is wrong for",
    "My card was billed for",
]
OTHER = ["The app crashes when I open", "I cannot log in to", "The page never loads for", "Notifications stopped for"]
THINGS = ["my subscription", "the family plan", "order 1182", "the yearly account", "the team workspace"]
MOODS = ["", " Please help.", " This is urgent.", " Thanks in advance.", " It started yesterday."]


def _messages() -> list[tuple[str, bool]]:
    """Messages that are about a payment or not, in a fixed shuffled order (a fair sample of the traffic)."""
    rows = [
        (f"{opening} {thing}.{mood}", opening in PAYMENT)
        for opening, thing, mood in itertools.product(PAYMENT + OTHER, THINGS, MOODS)
    ]
    order = np.random.default_rng(0).permutation(len(rows))
    return [rows[i] for i in order]


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, "cpu", "float32")


def test_posted_features_teach_a_readout_that_answers_more_right(loaded, tmp_path):
    decider = Decider(loaded, feedback_db=tmp_path / "f.sqlite")
    messages = _messages()
    train, held_out = messages[:80], messages[80:120]
    for text, gold in train:
        decider.respond_feedback({"state": text, "questions": {"q": QUESTION}, "gold": {"q": gold}})
    decider.feedback.settle()  # the fold models' readouts learn on a thread of their own
    stored = decider.feedback.store.labels(limit=3)
    assert all(label.features_version == "gauss-1" for label in stored)
    assert decode(stored[0].features).shape == (FEATURE_DIMS,)
    question = parse_question(QUESTION, ("questions", "q"))
    right = {"learned": 0, "calibrated": 0}
    for text, gold in held_out:
        prepared = decider.prepare_request(
            text, {"q": question}, keep_reading=True, handover=Handover(coverage=0.9, min_accuracy=0.7)
        )
        response = decider.launch_prepared([prepared])()[0]
        answer = response.to_wire()["answers"]["q"]
        assert answer["x_feedback"] == {"level": "exact", "labels": len(train), "readout": "learned"}
        right["learned"] += (answer["noul"] > 0.5) == gold
        _, calibrated = decider.calibrators.feedback.served(question, response.reading.reads["q"], readouts=False)
        right["calibrated"] += (calibrated.probs[0] > 0.5) == gold  # the same labels' calibration alone (yes first)
        # the set and the certificate speak of the answer shown, the readout's
        shown = answer["noul"] >= 0.5
        assert shown in answer["x_set"]["answers"] and answer["x_set"]["guarantee"] == "cv+"
        if answer["x_threshold"] is not None:
            assert answer["x_threshold"]["answer"] is shown
            assert answer["x_abstain"] is (
                max(answer["noul"], 1 - answer["noul"]) < answer["x_threshold"]["top_probability"]
            )
    decider.close()
    # the embedded model's label logits barely tell these apart; what it held at the decision row does
    assert right["learned"] >= right["calibrated"] + 0.1 * len(held_out), right
