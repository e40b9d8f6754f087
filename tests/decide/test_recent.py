"""The window of recent answers (`typedlm.decide.recent`) and answer ids (`typedlm.core.labeling`), on made-up
answers: ids, what is held, the bounds in bytes and in time, what to label next, and many threads at once. The
labels it gives the store are tested on the real model in tests/decide/test_by_id.py."""

from __future__ import annotations

import gc
import random
import threading
import tracemalloc

import numpy as np
import pytest

from typedlm.calibrate.reads import Reading, Reads
from typedlm.core.answers import Response, Usage
from typedlm.core.errors import AnswerNotHeld
from typedlm.core.labeling import ANSWER_ID, answer_id, origin_of
from typedlm.core.questions import parse_question
from typedlm.decide.recent import RecentAnswers, probabilities, uncertainty

NOUL = {"type": "noul", "instructions": "Is this message about billing?"}
TEAM = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": "the tech team"}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def response(wires: dict[str, dict], probs: dict[str, list[float]], seed: int = 0) -> tuple[Response, dict]:
    """A response to questions `wires` whose answers have `probs`, with reads (masses, priors, features) of its own."""
    rng = np.random.default_rng(seed)
    questions = {qid: parse_question(wire, ("questions", qid)) for qid, wire in wires.items()}
    answers, reads = {}, {}
    for qid, question in questions.items():
        n = question.size
        answers[qid] = question.answer(probs[qid], 0.5, {})
        reads[qid] = Reads(
            question.kind.value,
            [rng.random(n).tolist()],
            [rng.random(n).tolist()],
            None,
            rng.standard_normal(256).astype(np.float16),
        )
    return Response("m", answers, Usage(10), reading=Reading(reads, 10)), questions


def family(question) -> str:
    return f"family-of-{question.instructions}"


def remember(window: RecentAnswers, probs: float = 0.5, seed: int = 0, wires=None) -> dict[str, str]:
    """One response remembered: {question id: its answer's id}."""
    wires = wires or {"billing": NOUL}
    given = {qid: [probs, 1 - probs] for qid in wires}
    answered, questions = response(wires, given, seed)
    remembered = window.remember(answered, questions, "feedback", family)
    return {qid: answer.extras["id"] for qid, answer in remembered.answers.items()}


def test_answer_ids_are_random_and_name_their_origin():
    ids = {answer_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 22 and ANSWER_ID.fullmatch(i) for i in ids)
    assert all(origin_of(i) is None for i in ids)
    named = answer_id("ab12CD34")
    assert named.startswith("ab12CD34.") and origin_of(named) == "ab12CD34" and ANSWER_ID.fullmatch(named)
    assert origin_of("../x") is None and origin_of("") is None


def test_every_answer_gets_an_id_and_is_held_as_read():
    window = RecentAnswers(1 << 20, 60.0)
    answered, questions = response({"billing": NOUL, "team": TEAM}, {"billing": [0.9, 0.1], "team": [0.5, 0.5]})
    remembered = window.remember(answered, questions, "feedback", family)
    assert remembered.answers["billing"].to_wire()["x_id"] != remembered.answers["team"].to_wire()["x_id"]
    ids = [remembered.answers[q].extras["id"] for q in ("billing", "team")]
    billing, team = window.held(ids)
    assert (billing.question_id, billing.question, billing.method) == ("billing", questions["billing"], "feedback")
    assert billing.family == family(questions["billing"])
    for held, qid in ((billing, "billing"), (team, "team")):
        read, again = answered.reading.reads[qid], held.reads()
        assert (again.kind, again.masses, again.priors, again.lengths) == (
            read.kind,
            read.masses,
            read.priors,
            read.lengths,
        )  # the same floats
        assert again.features.dtype == np.float16 and np.array_equal(again.features, read.features)
    assert team.uncertainty == pytest.approx(1.0) and billing.uncertainty == pytest.approx(uncertainty([0.9, 0.1]))
    assert window.stats()["entries"] == 2


def test_uncertainty_is_normalised_entropy():
    assert uncertainty([1.0, 0.0]) == 0.0 and uncertainty([0.25] * 4) == pytest.approx(1.0)
    question = parse_question(TEAM, ("q",))
    assert probabilities(question.answer([0.3, 0.7], 1.0, {})) == (0.3, 0.7)


@pytest.mark.parametrize("wires", [{"billing": NOUL}, {"team": TEAM}])
def test_the_bytes_counted_are_what_the_answers_take(wires):
    """The window's count of its bytes against tracemalloc's of what it holds (the answers' questions too), within
    25% either way: the bound in bytes is a bound on memory."""
    window = RecentAnswers(1 << 40, 1e9)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seed in range(2000):
            remember(window, seed=seed, wires=wires)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.75 < window.nbytes / held < 1.25, (window.nbytes, held)


def test_over_its_bytes_the_oldest_go_first_and_are_not_held():
    window = RecentAnswers(1 << 20, 60.0)
    first = remember(window)["billing"]
    size = window.nbytes
    window = RecentAnswers(3 * size, 60.0)
    ids = [remember(window, seed=i)["billing"] for i in range(5)]
    assert window.stats()["entries"] == 3 and window.stats()["evictions"] == 2 and window.nbytes <= 3 * size
    assert len(window.held(ids[2:])) == 3
    with pytest.raises(AnswerNotHeld) as refused:
        window.held([ids[4], ids[0], first, ids[1]])
    assert refused.value.answer_ids == (ids[0], first, ids[1])
    assert ids[0] in str(refused.value) and window.stats()["not_held"] == 3


def test_past_its_age_an_answer_is_not_held_even_before_it_is_let_go():
    clock = Clock()
    window = RecentAnswers(1 << 20, 10.0, clock=clock)
    old = remember(window)["billing"]
    clock.now = 6.0
    new = remember(window)["billing"]
    clock.now = 10.5
    assert [h.question_id for h in window.held([new])] == ["billing"]
    with pytest.raises(AnswerNotHeld):
        window.held([old])
    assert window.stats()["entries"] == 1 and window.stats()["evictions"] == 1
    clock.now = 16.5
    assert window.suggest(None, 5).answers == 0  # a suggestion finds none either


def test_a_suggestion_draws_at_random_and_apart_the_most_unsure():
    window = RecentAnswers(1 << 20, 60.0, rng=random.Random(3))
    sure = {remember(window, probs=0.99, seed=i)["billing"] for i in range(20)}
    unsure = [remember(window, probs=p, seed=100 + i)["billing"] for i, p in enumerate((0.5, 0.6, 0.7))]
    other = remember(window, probs=0.5, wires={"team": TEAM})["team"]
    suggested = window.suggest(family(parse_question(NOUL, ("q",))), 3)
    assert suggested.answers == 23 and len(suggested.random) == 3 and len(set(suggested.random)) == 3
    assert other not in suggested.random + suggested.teach  # another family
    assert not set(suggested.random) & set(suggested.teach)
    # the most unsure of those not drawn, most unsure first
    rest = [i for i in unsure if i not in suggested.random]
    assert suggested.teach[: len(rest)] == rest
    assert set(suggested.teach[len(rest) :]) <= sure
    wire = suggested.to_wire()
    assert wire["object"] == "feedback_suggestions" and wire["teach_by"] == "entropy"
    # handed out once: the next suggestion gives others; a label by id takes an answer out of both
    again = window.suggest(None, 30)
    assert not set(again.random) & set(suggested.random) and not set(again.teach) & set(suggested.teach)
    window.labeled(window.held([other]))
    assert window.suggest(None, 30).answers == 23


def test_labels_of_answers_given_to_teach_are_chosen_and_of_a_fair_draw_as_posted():
    window = RecentAnswers(1 << 20, 60.0, rng=random.Random(0))
    for i in range(6):
        remember(window, probs=0.1 * i + 0.4, seed=i)
    suggested = window.suggest(None, 2)
    (teach, *_), (drawn, *_) = window.held(suggested.teach), window.held(suggested.random)
    assert (teach.sample("random"), teach.sample("chosen")) == ("chosen", "chosen")
    assert (drawn.sample("random"), drawn.sample("chosen")) == ("random", "chosen")
    # an answer given to teach that a later fair draw gives is a fair draw's: its label as posted
    window = RecentAnswers(1 << 20, 60.0, rng=random.Random(0))
    only = remember(window)["billing"]
    assert window.suggest(None, 1).random == [only]  # drawn first
    window = RecentAnswers(1 << 20, 60.0, rng=random.Random(0))
    first, second = remember(window, seed=1)["billing"], remember(window, seed=2)["billing"]
    given = window.suggest(None, 1)
    assert given.teach == [second if given.random == [first] else first]
    redrawn = window.suggest(None, 1)
    assert redrawn.random == given.teach and window.held(redrawn.random)[0].sample("random") == "random"


def test_the_random_draw_is_uniform():
    """Each of 10 answers is drawn 3 at a time in 3,000 fresh windows: each drawn 900 ± 4 binomial sds."""
    counts = [0] * 10
    rng = random.Random(7)
    for _ in range(3000):
        window = RecentAnswers(1 << 20, 60.0, rng=rng)
        ids = [remember(window, probs=0.05 * i + 0.5, seed=i)["billing"] for i in range(10)]
        for drawn in window.suggest(None, 3).random:
            counts[ids.index(drawn)] += 1
    sd = (3000 * 0.3 * 0.7) ** 0.5
    assert all(abs(count - 900) < 4 * sd for count in counts), counts


def test_many_threads_remember_and_take_at_once():
    window = RecentAnswers(40_000, 60.0)
    found, missing = [], []

    def work(seed: int) -> None:
        for i in range(200):
            key = remember(window, seed=seed * 1000 + i)["billing"]
            try:
                found.extend(window.held([key]))
            except AnswerNotHeld:  # let go of by another thread's answers meanwhile
                missing.append(key)
            window.suggest(None, 2)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = window.stats()
    assert stats["entries"] + stats["evictions"] == 800 and stats["bytes"] <= 40_000
    assert stats["bytes"] == sum(held.nbytes for held in window._held.values())
    assert len(found) + len(missing) == 800
