"""Order-debiased reads and contextual calibration in the decider, checked against independent requests."""

from __future__ import annotations

import numpy as np
import pytest

from typedlm.calibrate.calibration import CalibrationFile, contextual, normalised
from typedlm.calibrate.reads import rotations
from typedlm.core.errors import InvalidRequest, ModelError
from typedlm.core.questions import ChoiceQuestion, NoulQuestion, ScoreQuestion
from typedlm.decide.decider import Decider
from typedlm.decide.prepare import CONTENT_FREE_STATE
from typedlm.runtime.models import LoadedModel
from typedlm.text.prompt import PROMPT_VERSION

from ..conftest import tiny_model

STATE = "The parcel arrived broken and the customer wants a new one sent today."
TOPIC = ChoiceQuestion((("billing", None), ("shipping", "parcels"), ("account", None), ("other", None)), "Topic?")
URGENCY = ScoreQuestion(("low", "medium", "high"), "How urgent?")
QUESTIONS = {"late": NoulQuestion("Is it late?"), "topic": TOPIC, "urgency": URGENCY}


@pytest.fixture(scope="module")
def decider(tokenizer):
    return Decider(LoadedModel(tiny_model("qwen3", len(tokenizer), seed=5), tokenizer, "tiny-qwen3"), calibration="raw")


def test_rotations_cover_every_option_in_every_position():
    versions = rotations(TOPIC, 4)
    assert [order for _, order in versions] == [[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2]]
    assert versions[1][0].options[0] == TOPIC.options[1]
    assert len(rotations(URGENCY, 8)) == 3  # no more versions than levels
    assert [order for _, order in rotations(TOPIC, 2)] == [[0, 1, 2, 3], [2, 3, 0, 1]]
    assert len(rotations(QUESTIONS["late"], 4)) == 1


def test_each_read_equals_the_rotated_question_asked_alone(decider):
    reads = decider.read(STATE, QUESTIONS, order_reads=3).reads
    assert len(reads["late"].masses) == 1 and len(reads["topic"].masses) == 3 and len(reads["urgency"].masses) == 3
    for qid in ("topic", "urgency"):
        for (version, order), masses in zip(rotations(QUESTIONS[qid], 3), reads[qid].masses, strict=True):
            alone = decider.read(STATE, {"q": version}).reads
            # alone's masses are by position; the read maps position j back to option order[j]
            assert masses == pytest.approx([alone["q"].masses[0][order.index(i)] for i in range(len(order))], abs=1e-6)
    # the unrotated read is the plain one
    plain = decider.read(STATE, QUESTIONS).reads
    assert reads["topic"].masses[0] == pytest.approx(plain["topic"].masses[0], abs=1e-6)


def test_order_reads_answers_average_and_report_spread(decider):
    response = decider.decide(STATE, QUESTIONS, order_reads=4)
    topic = response.answers["topic"].to_wire()
    reads = decider.read(STATE, QUESTIONS, order_reads=4).reads
    mean = np.mean([normalised(m) for m in reads["topic"].masses], axis=0)
    assert list(topic["probabilities"].values()) == pytest.approx(list(mean), abs=1e-9)
    assert topic["x_reads"] == 4 and topic["x_stderr"] >= 0 and 0.25 <= topic["x_agreement"] <= 1
    assert "x_stderr" not in response.answers["late"].to_wire()  # a noul question is read once
    assert response.to_wire()["x_order_reads"] == 4


def test_contextual_prior_is_the_content_free_documents_masses(decider):
    reads = decider.read(STATE, QUESTIONS, contextual=True).reads
    free = decider.read(CONTENT_FREE_STATE, QUESTIONS).reads
    for qid in QUESTIONS:
        assert reads[qid].priors[0] == pytest.approx(free[qid].masses[0], abs=1e-6)
    answer = decider.decide(STATE, QUESTIONS, calibration="contextual").answers["topic"]
    want = contextual(reads["topic"].masses[0], reads["topic"].priors[0])
    assert list(answer.probabilities.values()) == pytest.approx(list(want), abs=1e-9)
    assert decider.decide(STATE, QUESTIONS, calibration="contextual").to_wire()["x_calibration"] == "contextual"


def test_fitted_calibration_needs_a_file_for_this_model(decider, tokenizer):
    with pytest.raises(InvalidRequest, match="calibration file"):
        decider.decide(STATE, QUESTIONS, calibration="fitted")
    file = CalibrationFile("tiny", decider.fingerprint, PROMPT_VERSION, "raw", {"noul": {"a": 0.0, "b": 0.0}})
    loaded = LoadedModel(decider.engine.model, tokenizer, "tiny-qwen3")
    calibrated = Decider(loaded, calibration="fitted", calibration_file=file)
    assert calibrated.decide(STATE, QUESTIONS).answers["late"].p_yes == pytest.approx(0.5)  # σ(0·z + 0)
    other = LoadedModel(tiny_model("qwen3", len(tokenizer), seed=6), tokenizer, "other")
    with pytest.raises(ModelError, match="another model"):
        Decider(other, calibration_file=file)


def test_fingerprint_ignores_dtype_but_not_weights(decider, tokenizer):
    import torch

    from typedlm.runtime.models import model_fingerprint

    model = tiny_model("qwen3", len(tokenizer), seed=5)
    assert model_fingerprint(model) == decider.fingerprint
    assert model_fingerprint(model.to(torch.bfloat16)) == decider.fingerprint
    assert model_fingerprint(tiny_model("qwen3", len(tokenizer), seed=6)) != decider.fingerprint


def test_a_files_calibrator_reads_the_averaged_base_probabilities(decider, tokenizer):
    from typedlm.calibrate.calibration import calibrator_features, combine, feature_scaled

    calibrator = {
        "choice": {"weights": [0.3, -0.5, 0.2, 0.1, 0.4]},
        "noul": {"weights": [0.1, 0.0, 0.0, 0.0, 0.0], "bias": -0.3},
    }
    file = CalibrationFile("tiny", decider.fingerprint, PROMPT_VERSION, "contextual", {}, calibrator=calibrator)
    reads = decider.read(STATE, QUESTIONS, order_reads=3, contextual=True).reads
    for qid in ("topic", "late"):
        r = reads[qid]
        base, _, agreement = combine([contextual(m, p) for m, p in zip(r.masses, r.priors, strict=True)])
        mass = sum(min(1.0, sum(m)) for m in r.masses) / len(r.masses)
        want = feature_scaled(r.kind, base, calibrator[r.kind], calibrator_features(base, mass, 1 - agreement))
        answer = decider.calibrators.fitted(file).answer(QUESTIONS[qid], r)
        got = [answer.p_yes, 1 - answer.p_yes] if qid == "late" else list(answer.probabilities.values())
        assert got == pytest.approx(want, abs=1e-12), qid
    # a kind without a calibrator keeps its base probabilities (the file has no score parameters either)
    score = decider.calibrators.fitted(file).answer(QUESTIONS["urgency"], reads["urgency"])
    base, _, _ = combine([contextual(m, p) for m, p in zip(reads["urgency"].masses, reads["urgency"].priors)])
    assert list(score.probabilities) == pytest.approx(base, abs=1e-12)


def test_a_calibrator_reads_its_kind_by_its_own_base(decider, tokenizer):
    from typedlm.calibrate.calibration import calibrator_features, combine, feature_scaled, normalised

    calibrator = {"choice": {"weights": [0.3, 0, 0, 0, 0], "base": "raw"}, "noul": {"weights": [0.1, 0, 0, 0, 0]}}
    file = CalibrationFile("tiny", decider.fingerprint, PROMPT_VERSION, "contextual", {}, calibrator=calibrator)
    assert (file.base_of("choice"), file.base_of("noul"), file.base_of("score")) == ("raw", "contextual", "contextual")
    assert file.needs_prior
    assert not CalibrationFile("tiny", "f", "1", "raw", {}, calibrator={"noul": calibrator["choice"]}).needs_prior
    reads = decider.read(STATE, QUESTIONS, order_reads=3, contextual=True).reads
    r = reads["topic"]
    base, _, agreement = combine([normalised(m) for m in r.masses])  # raw: the priors are not used
    mass = sum(min(1.0, sum(m)) for m in r.masses) / len(r.masses)
    want = feature_scaled("choice", base, calibrator["choice"], calibrator_features(base, mass, 1 - agreement))
    got = list(decider.calibrators.fitted(file).answer(QUESTIONS["topic"], r).probabilities.values())
    assert got == pytest.approx(want, abs=1e-12)


def test_a_calibrator_with_a_prior_weight_reads_the_priors_of_the_same_reads(decider, tokenizer):
    from typedlm.calibrate.calibration import calibrator_features, combine, combined_prior, feature_scaled

    calibrator = {"choice": {"weights": [0.2, 0, 0, 0, 0], "prior_weight": 0.7, "base": "raw"}}
    file = CalibrationFile("tiny", decider.fingerprint, PROMPT_VERSION, "raw", {}, calibrator=calibrator)
    assert file.needs_prior
    r = decider.read(STATE, QUESTIONS, order_reads=3, contextual=True).reads["topic"]
    base, _, agreement = combine([normalised(m) for m in r.masses])
    prior = combine([normalised(p) for p in r.priors])[0]
    assert combined_prior(r.priors) == pytest.approx(prior)
    mass = sum(min(1.0, sum(m)) for m in r.masses) / len(r.masses)
    phi = calibrator_features(base, mass, 1 - agreement)
    want = feature_scaled("choice", base, calibrator["choice"], phi, prior)
    got = list(decider.calibrators.fitted(file).answer(TOPIC, r).probabilities.values())
    assert got == pytest.approx(want, abs=1e-12)
    # served: a decider with the file reads the content-free priors itself (they are cached per question text)
    model = LoadedModel(tiny_model("qwen3", len(tokenizer), seed=5), tokenizer, "tiny-qwen3")
    served = Decider(model, calibration="fitted", calibration_file=file)
    answer = served.decide(STATE, {"topic": TOPIC}, order_reads=3).answers["topic"]
    assert list(answer.probabilities.values()) == pytest.approx(want, abs=1e-6)


def test_a_file_shipped_for_the_model_is_the_default_only_for_its_own_weights(decider, tokenizer, monkeypatch):
    from typedlm.decide import config as config_module

    calibrator = {"noul": {"weights": [0.5, 0, 0, 0, 0], "bias": 0.0}}
    data = {"order_reads": 3}
    shipped = CalibrationFile("tiny-qwen3", decider.fingerprint, PROMPT_VERSION, "contextual", {}, data, {}, calibrator)
    monkeypatch.setattr(config_module, "shipped_calibration", lambda name: shipped if name == "tiny-qwen3" else None)
    model = decider.engine.model
    served = Decider(LoadedModel(model, tokenizer, "tiny-qwen3"))
    assert served.calibration == "fitted" and served.calibration_file is shipped
    assert served.config.order_reads == 3, "the order reads the file was fitted with"
    assert Decider(LoadedModel(model, tokenizer, "tiny-qwen3"), order_reads=1).config.order_reads == 1
    assert served.decide(STATE, QUESTIONS).to_wire()["x_calibration"] == "fitted"
    assert Decider(LoadedModel(model, tokenizer, "tiny-qwen3"), calibration="raw").calibration_file is shipped
    assert Decider(LoadedModel(model, tokenizer, "another-name")).calibration == "contextual"
    other = LoadedModel(tiny_model("qwen3", len(tokenizer), seed=6), tokenizer, "tiny-qwen3")
    assert Decider(other).calibration == "contextual", "a shipped file fitted on other weights is not used"


def test_the_prompt_version_follows_the_calibration_file_and_a_file_of_another_is_refused(decider, tokenizer):
    model = decider.engine.model
    assert decider.prompt_version == PROMPT_VERSION and decider.describe().prompt_version == PROMPT_VERSION
    other = Decider(LoadedModel(model, tokenizer, "tiny-qwen3"), calibration="raw", prompt_version="2-system")
    assert other.layout.version == "2-system" and other.layout.system_ids != decider.layout.system_ids
    # another wording is another prompt: the model reads other numbers
    mine = decider.decide(STATE, QUESTIONS).to_wire()["answers"]["topic"]["probabilities"]
    theirs = other.decide(STATE, QUESTIONS).to_wire()["answers"]["topic"]["probabilities"]
    assert list(mine.values()) != pytest.approx(list(theirs.values()), abs=1e-6)
    file = CalibrationFile("tiny-qwen3", decider.fingerprint, "2-system", "raw", {"noul": {"a": 1.0, "b": 0.0}})
    assert Decider(LoadedModel(model, tokenizer, "tiny-qwen3"), calibration_file=file).prompt_version == "2-system"
    with pytest.raises(ModelError, match="prompt version 2-system"):
        Decider(LoadedModel(model, tokenizer, "tiny-qwen3"), calibration_file=file, prompt_version="1")
    with pytest.raises(ModelError, match="unknown prompt version"):
        Decider(LoadedModel(model, tokenizer, "tiny-qwen3"), prompt_version="0")
