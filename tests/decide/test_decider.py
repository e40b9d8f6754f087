"""The real embedded model (SmolLM2-135M-Instruct) end to end: exactness, independence, wire shape, limits."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from typesafe_sdk._schemas.models import SystemOneResponse

from typedlm import Decider
from typedlm.core.confidence import normalise
from typedlm.core.errors import InvalidRequest, LimitExceeded
from typedlm.core.options import EngineOptions
from typedlm.core.questions import ChoiceQuestion, NoulQuestion, ScoreQuestion, parse_questions
from typedlm.runtime.models import LoadedModel

from ..conftest import reference_masses

STATE = "Order 1182: the customer paid twice for one pair of shoes and asks for a refund of the second charge."
BODY = {
    "model": "jev-latest",
    "state": STATE,
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "topic": {
            "type": "choice",
            "instructions": "What is the message about?",
            "criteria": {"billing": "payments and charges", "shipping": None, "ünïcode 名前": "other"},
        },
        "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]},
    },
}


def test_every_question_type_answers_with_well_formed_probabilities(real_decider):
    wire = real_decider.respond(BODY)
    parsed = SystemOneResponse.model_validate(wire)  # the official SDK's own response model
    assert parsed.model == "smollm2-135m-instruct"
    assert wire["usage"]["input_tokens"] > 0 and wire["usage"]["output_tokens"] == 0
    answers = wire["answers"]
    assert list(answers) == list(BODY["questions"])
    assert 0 <= answers["refund"]["noul"] <= 1
    topic = answers["topic"]
    assert list(topic["probabilities"]) == ["billing", "shipping", "ünïcode 名前"]
    assert math.isclose(sum(topic["probabilities"].values()), 1, abs_tol=1e-9)
    assert topic["choice"] == max(topic["probabilities"], key=topic["probabilities"].get)
    urgency = answers["urgency"]
    assert urgency["legend"] == {"0": "low", "1": "medium", "2": "high"}
    assert math.isclose(urgency["score"], sum(int(k) * p for k, p in urgency["probabilities"].items()))
    for answer in answers.values():
        assert 0 < answer["x_raw_mass"] <= 1
        assert 0 <= answer.get("confidence", 0) <= 1


def test_packed_readout_equals_full_forward_on_the_real_model(real_decider):
    questions = {
        "refund": NoulQuestion("Does the customer ask for a refund?"),
        "topic": ChoiceQuestion((("billing", "payments"), ("shipping", None), ("other", None))),
        # two-letter labels past 26 options (A-Z, then AA, AB, ...); 255 options run on the tiny models (test_engine)
        "many": ChoiceQuestion(tuple((f"p{i}", None) for i in range(30))),
        "urgency": ScoreQuestion(tuple(f"level {i}" for i in range(10)), "How urgent is it?"),
    }
    response = real_decider.decide(STATE, questions)
    prefix_text = real_decider.layout.prefix_text(STATE)
    assert real_decider.labeler.for_question(questions["many"]).inner_nodes, "30 options include multi-token labels"
    for qid, question in questions.items():
        whole = real_decider.layout.encode(prefix_text + real_decider.layout.suffix_text(question))
        probs, raw_mass = normalise(
            reference_masses(real_decider.engine.model, whole, real_decider.labeler.for_question(question))
        )
        answer = response.answers[qid]
        if isinstance(question, NoulQuestion):
            got = [answer.p_yes, 1 - answer.p_yes]
        elif isinstance(question, ChoiceQuestion):
            got = list(answer.probabilities.values())
        else:
            got = list(answer.probabilities)
        assert max(abs(a - b) for a, b in zip(got, probs, strict=True)) < 1e-5, qid
        assert abs(answer.raw_mass - raw_mass) < 1e-5, qid


def test_options_read_by_name_equal_a_full_forward_and_fall_back_to_letters(real_decider):
    """Choice options answered by their own names (multi-token labels), with and without length normalisation,
    against brute force; options whose names begin one another are read by letter."""
    names = Decider(
        LoadedModel(real_decider.engine.model, real_decider.tokenizer, real_decider.name), choice_answers="names"
    )
    topic = ChoiceQuestion((("billing", "payments"), ("shipping", None), ("technical support", None)))
    overlapping = ChoiceQuestion((("billing", None), ("billing address", None)))
    reading = names.read(STATE, {"topic": topic, "overlapping": overlapping}, order_reads=2)
    assert reading.reads["overlapping"].lengths is None, "read by letter"
    read = replace(topic, by_name=True)
    assert "- technical support" in names.layout.suffix_text(read)
    whole = names.layout.encode(names.layout.prefix_text(STATE) + names.layout.suffix_text(read))
    expected = reference_masses(names.engine.model, whole, names.labeler.for_question(read))
    reads = reading.reads["topic"]
    assert max(abs(a - b) for a, b in zip(reads.masses[0], expected, strict=True)) < 1e-6
    assert reads.lengths == [len(forms[0]) for forms in names.labeler.for_question(read).groups]
    assert max(reads.lengths) > 1
    answer = names.decide(STATE, {"topic": topic}, calibration="raw").answers["topic"]
    assert list(answer.probabilities.values()) == pytest.approx(normalise(expected)[0], abs=1e-5)
    assert answer.raw_mass == pytest.approx(sum(expected), abs=1e-6)
    per_token = Decider(
        LoadedModel(real_decider.engine.model, real_decider.tokenizer, real_decider.name),
        choice_answers="names_per_token",
    )
    answer = per_token.decide(STATE, {"topic": topic}, calibration="raw").answers["topic"]
    geometric = [m ** (1 / n) for m, n in zip(expected, reads.lengths, strict=True)]
    assert list(answer.probabilities.values()) == pytest.approx(normalise(geometric)[0], abs=1e-5)
    assert answer.raw_mass == pytest.approx(sum(expected), abs=1e-6), "the raw mass stays the labels' own"
    loaded = LoadedModel(real_decider.engine.model, real_decider.tokenizer, real_decider.name)
    shipped = Decider(loaded)
    assert shipped.config.choice_answers == shipped.calibration_file.data["choice_answers"], "the shipped file's way"
    by_name = replace(shipped.calibration_file, data={**shipped.calibration_file.data, "choice_answers": "names"})
    assert Decider(loaded, calibration_file=by_name).config.choice_answers == "names", "a file's way is the default"
    # ... unless one is asked for: readouts recorded "by letter" must not follow the file (they did once)
    assert Decider(loaded, calibration_file=by_name, choice_answers="letters").config.choice_answers == "letters"
    with pytest.raises(InvalidRequest, match="choice answers"):
        Decider(
            LoadedModel(real_decider.engine.model, real_decider.tokenizer, real_decider.name), choice_answers="words"
        )


def test_other_questions_do_not_change_an_answer(real_decider):
    """Exact up to float32 rounding: 30 layers of attention whose key blocks split differently when the
    packed sequence is longer (measured: up to 1.2e-6 here; tiny models hold 1e-6)."""
    alone = real_decider.respond({**BODY, "questions": {"x": BODY["questions"]["topic"]}})["answers"]["x"]
    together = real_decider.respond(BODY)["answers"]["topic"]
    for name, p in alone["probabilities"].items():
        assert abs(p - together["probabilities"][name]) <= 1e-5


def test_limits_are_checked_before_any_model_work(real_decider, monkeypatch):
    def no_model_work(*args, **kwargs):
        raise AssertionError("the model ran on an over-long request")

    monkeypatch.setattr(real_decider.engine, "run", no_model_work)
    monkeypatch.setattr(real_decider.engine, "prefill", no_model_work)
    long_state = "word " * 9000  # SmolLM2 reads 8192 positions
    with pytest.raises(LimitExceeded, match="at most 8192"):
        real_decider.respond({**BODY, "state": long_state})
    monkeypatch.setattr(real_decider.preparer, "max_input_tokens", 50)
    with pytest.raises(LimitExceeded, match="at most 50"):
        real_decider.respond(BODY)


def test_text_no_tokenization_could_fit_is_refused_before_tokenizing(real_decider, monkeypatch):
    def no_tokenizing(*args, **kwargs):
        raise AssertionError("an 8 MB state was tokenized only to be refused")

    monkeypatch.setattr(real_decider.layout, "tokenize", no_tokenizing)
    with pytest.raises(LimitExceeded, match="characters"):
        real_decider.respond({**BODY, "state": "new text " * 900_000})
    many_reads = {"q": {"type": "choice", "criteria": {f"option {i} " + "x" * 2000: None for i in range(40)}}}
    with pytest.raises(LimitExceeded, match="every order read"):  # 40 options of 2 KB, read in 8 orders
        real_decider.respond({**BODY, "questions": many_reads, "x_order_reads": 8})


def test_more_questions_than_the_tokens_could_hold_are_refused_before_anything_is_kept(real_decider, monkeypatch):
    def no_rendering(*args, **kwargs):
        raise AssertionError("a request with too many questions was rendered only to be refused")

    monkeypatch.setattr(real_decider.layout, "render_suffix", no_rendering)
    held = {cache.name: cache.stats()["bytes"] for cache in real_decider.caches()}
    most = real_decider.preparer.max_reads
    questions = {f"q{i}": {"type": "noul"} for i in range(most + 1)}
    with pytest.raises(LimitExceeded, match=f"send at most {most} questions"):
        real_decider.respond({**BODY, "questions": questions})
    choice = {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}
    reads = {f"q{i}": choice for i in range(most // 3 + 1)}  # each read in 3 orders: the reads count
    with pytest.raises(LimitExceeded, match="reads"):
        real_decider.respond({**BODY, "questions": reads, "x_order_reads": 3})
    assert {cache.name: cache.stats()["bytes"] for cache in real_decider.caches()} == held


def test_a_forward_over_the_memory_budget_is_refused_naming_it(real_decider, monkeypatch):
    # One long question among many short ones: the cascade's own part groups questions by length, so the short
    # ones are not padded to the long one's rows (padded, this request's estimate was 6x the long one's alone).
    big = {"type": "choice", "criteria": {f"option number {i}": None for i in range(200)}}
    short = {f"q{i}": {"type": "noul", "instructions": f"Is it about {i}?"} for i in range(40)}
    monkeypatch.setattr(real_decider.preparer, "max_forward_bytes", 1 << 40)
    alone = real_decider.preparer.prepare(STATE, parse_questions({"big": big}))
    together = real_decider.preparer.prepare(STATE, parse_questions({"big": big, **short}))
    estimate = real_decider.engine.budget.bytes
    need_alone = estimate(len(alone.prompt.prefix_ids), [item.rows for item in alone.items])
    need_together = estimate(len(together.prompt.prefix_ids), [item.rows for item in together.items])
    assert need_alone < need_together < 1.5 * need_alone and together.tokens < 1.5 * alone.tokens
    monkeypatch.setattr(real_decider.preparer, "max_forward_bytes", (need_alone + need_together) // 2)
    with pytest.raises(LimitExceeded, match=r"would hold about \d+ MiB; this server allows \d+ MiB per request"):
        real_decider.respond({**BODY, "questions": {"big": big, **short}})
    assert real_decider.respond({**BODY, "questions": {"big": big}})["answers"]["big"]["probabilities"]


def test_long_distinct_option_names_leave_only_bounded_caches(real_decider):
    # ten requests with distinct 30,000-character option names (refused: they pass the model's context) kept
    # about 1.2 GB each when every prefix of a name's tokens was built and remembered
    before = sum(cache.nbytes for cache in real_decider.caches())
    for i in range(10):
        name = " ".join(f"w{i}x{j}" for j in range(4_000))[:30_000]
        with pytest.raises(LimitExceeded, match="the model reads at most"):
            real_decider.respond({**BODY, "questions": {"q": {"type": "choice", "criteria": {name: None, "b": None}}}})
    # what stays is each question's text and token ids (its suffix, tokenized after the cut: ~1 MB each), within
    # every cache's budget in bytes
    assert sum(cache.nbytes for cache in real_decider.caches()) - before < 16 << 20
    assert all(cache.nbytes <= cache.max_bytes for cache in real_decider.caches())


def test_invalid_bodies_raise_invalid_request(real_decider):
    with pytest.raises(InvalidRequest):
        real_decider.respond({**BODY, "questions": {"q": {"type": "choice", "criteria": {"only": None}}}})


def test_requests_decided_together_equal_each_alone(real_decider):
    """Batch invariance: prepared requests answered from one static forward (several documents, one of them asked
    twice, order reads, contextual calibration) equal each request decided alone, within 1e-5 in float32 (measured:
    3.2e-6; the padded shapes differ, so the kernels sum in another order; the tiny models stay within 1e-6)."""
    loaded = LoadedModel(real_decider.engine.model, real_decider.tokenizer, real_decider.name)
    batched = Decider(loaded, engine=EngineOptions(cuda_graphs=True, attention_kernel=False), calibration="contextual")
    assert batched.features.static
    other = "The package arrived crushed; the courier left it in the rain."
    requests = [
        (STATE, {"refund": NoulQuestion("Does the customer ask for a refund?")}, None, None),
        (other, {"urgency": ScoreQuestion(("low", "medium", "high"), "How urgent?")}, "raw", 2),
        (STATE, {"topic": ChoiceQuestion((("billing", None), ("shipping", None), ("other", None)))}, None, 3),
        ("Short.", {"spam": NoulQuestion("Is this spam?")}, None, None),
    ]
    together = batched.launch_prepared([batched.prepare_request(*request) for request in requests])()
    for request, response in zip(requests, together, strict=True):
        alone = batched.decide(*request)
        # decided alone after the batch, a document is a prefix-cache hit: the same tokens, more of them cached
        assert response.usage.input_tokens == alone.usage.input_tokens and response.extras == alone.extras
        for qid, question in request[1].items():
            got, want = response.answers[qid], alone.answers[qid]
            assert abs(got.raw_mass - want.raw_mass) < 1e-5
            pairs = zip(question.wire_probabilities(got.to_wire()), question.wire_probabilities(want.to_wire()))
            assert max(abs(a - b) for a, b in pairs) < 1e-5


def test_a_forward_launched_before_the_last_is_finished_answers_as_alone(real_decider):
    """`launch_prepared` returns the function that finishes its answers: a second batch launched before the first
    is finished (as the server's pipeline does), a document of the first repeated in it (its prefix was cached at
    launch), answer as each request alone."""
    loaded = LoadedModel(real_decider.engine.model, real_decider.tokenizer, real_decider.name)
    decider = Decider(loaded, engine=EngineOptions(cuda_graphs=True, attention_kernel=False), calibration="raw")
    question = {"refund": NoulQuestion("Does the customer ask for a refund?")}
    first = decider.launch_prepared([decider.prepare_request(STATE, question)])
    second = decider.launch_prepared([decider.prepare_request(s, question) for s in (STATE, "Short.")])
    assert decider.stats()["prefix_cache"]["hits"] == 1, "the second launch found the first's document cached"
    for states, finish in (((STATE,), first), ((STATE, "Short."), second)):
        for state, response in zip(states, finish(), strict=True):
            want = decider.decide(state, question).answers["refund"]
            assert abs(response.answers["refund"].p_yes - want.p_yes) < 1e-5
