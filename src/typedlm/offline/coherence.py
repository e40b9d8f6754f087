"""Coherence: do a model's probabilities agree with each other where logic says they must?

Three kinds of question sets are derived from labeled examples, each asked in one request so that, as always,
no question sees another:

    negation     a yes/no question and its negation (criteria swapped): P(q) + P(not q) should be 1
    partition    a choice question asked as one yes/no question per option: the P(yes) should sum to 1
    conjunction  a yes/no question and the same question "and" a condition every document meets:
                 the conjunction should not be more probable than the question alone

`derive` builds them (as `Example`s with gold answers, so they are labeled yes/no sets too) and `coherence`
scores answers: mean |sum − 1| for negations and partitions, mean excess P(q and T) − P(q) (and how often it
exceeds 0.02) for conjunctions. Answering 0.5 to everything scores 0 on negations and conjunctions but
|k/2 − 1| on a k-way partition: `baseline` gives those numbers for the same questions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from typedlm.core.names import Kind
from typedlm.offline.evaldata import Example

NEGATED = "not"  # qid of a question's negation: "<qid>.not"
CONJOINED = "and_true"  # qid of a question conjoined with a condition that always holds
OPTION = "is"  # qid of a partition's yes/no question for one option: "<qid>.is.<option>"
ALWAYS_TRUE = "the document above is not empty"  # the conjoined condition: every document meets it
EXCESS_TOLERANCE = 0.02  # a conjunction more probable than its question by more than this is a violation


def _yes_no_questions(example: Example) -> Iterable[tuple[str, dict[str, Any], bool]]:
    for qid, question in example.questions.items():
        if question["type"] == Kind.NOUL:
            yield qid, question, bool(example.gold[qid])


def negation(question: Mapping[str, Any]) -> dict[str, Any]:
    """The question asking whether `question`'s answer is no; its criteria (if any) swapped."""
    negated = {
        "type": "noul",
        "instructions": f'Is the answer to this question "no"? {question.get("instructions", "")}'.strip(),
    }
    criteria = question.get("criteria")
    if isinstance(criteria, Mapping):
        negated["criteria"] = {"true": criteria.get("false", ""), "false": criteria.get("true", "")}
    return negated


def conjunction(question: Mapping[str, Any]) -> dict[str, Any]:
    """`question` and a condition that every document meets: never more probable than `question` alone."""
    conjoined = {
        "type": "noul",
        "instructions": f"{question.get('instructions', '')} Answer yes only if that is so and {ALWAYS_TRUE}.".strip(),
    }
    criteria = question.get("criteria")
    if isinstance(criteria, Mapping):
        conjoined["criteria"] = {
            "true": f"{criteria.get('true', '')} And {ALWAYS_TRUE}.".strip(),
            "false": f"{criteria.get('false', '')} Or the document is empty.".strip(),
        }
    return conjoined


def partition(question: Mapping[str, Any], option: str, description: str) -> dict[str, Any]:
    """One option of a choice question asked as a yes/no question."""
    text = f'{question.get("instructions", "")} Is the answer "{option}"'.strip()
    return {"type": "noul", "instructions": f"{text} ({description})?" if description else f"{text}?"}


def derive(examples: Iterable[Example]) -> list[Example]:
    """Per example, one derived example holding every yes/no question with its negation and its conjunction, and
    every choice question as one yes/no question per option. Examples with nothing to derive are skipped."""
    derived = []
    for example in examples:
        questions: dict[str, dict[str, Any]] = {}
        gold: dict[str, bool] = {}
        for qid, question, answer in _yes_no_questions(example):
            questions[qid], gold[qid] = dict(question), answer
            questions[f"{qid}.{NEGATED}"], gold[f"{qid}.{NEGATED}"] = negation(question), not answer
            questions[f"{qid}.{CONJOINED}"], gold[f"{qid}.{CONJOINED}"] = conjunction(question), answer
        for qid, question in example.questions.items():
            if question["type"] != Kind.CHOICE:
                continue
            criteria = question["criteria"]
            options = criteria.items() if isinstance(criteria, Mapping) else ((name, "") for name in criteria)
            for option, description in options:
                key = f"{qid}.{OPTION}.{option}"
                questions[key], gold[key] = partition(question, option, description), option == example.gold[qid]
        if questions:
            derived.append(Example(f"{example.id}.coherence", example.source, example.state, questions, gold))
    return derived


def negations(examples: Iterable[Example]) -> list[Example]:
    """`derive` kept to its negation pairs: per example, its yes/no questions and their negations (what a
    calibrator for yes/no questions is chosen on: it sees one question at a time, so of the three checks only a
    pair's sum is one it can keep whatever the question)."""
    kept = []
    for example in derive(examples):
        asked = [qid for qid in example.questions if f"{qid}.{NEGATED}" in example.questions]
        pairs = [qid for question in asked for qid in (question, f"{question}.{NEGATED}")]
        if pairs:
            questions = {qid: example.questions[qid] for qid in pairs}
            kept.append(
                Example(example.id, example.source, example.state, questions, {q: example.gold[q] for q in pairs})
            )
    return kept


def coherence(p_yes: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
    """Scores from P(yes) keyed by (example id, qid) of derived examples' answers.

    Returns {"negation" | "partition" | "conjunction": {"n", "mean_gap" (negation, partition: mean |sum − 1|;
    conjunction: mean max(0, P(q and T) − P(q))), "violations" (share of gaps above EXCESS_TOLERANCE)}}; a kind
    with no complete group is left out."""
    by_example: dict[str, dict[str, float]] = {}
    for (example, qid), p in p_yes.items():
        by_example.setdefault(example, {})[qid] = p
    gaps: dict[str, list[float]] = {"negation": [], "partition": [], "conjunction": []}
    for answers in by_example.values():
        partitions: dict[str, list[float]] = {}
        for qid, p in answers.items():
            parts = qid.split(".", 2)
            if len(parts) == 1:
                if f"{qid}.{NEGATED}" in answers:
                    gaps["negation"].append(abs(p + answers[f"{qid}.{NEGATED}"] - 1.0))
                if f"{qid}.{CONJOINED}" in answers:
                    gaps["conjunction"].append(max(0.0, answers[f"{qid}.{CONJOINED}"] - p))
            elif len(parts) >= 3 and parts[1] == OPTION:
                partitions.setdefault(parts[0], []).append(p)
        gaps["partition"].extend(abs(sum(ps) - 1.0) for ps in partitions.values())
    return {
        kind: {
            "n": len(values),
            "mean_gap": float(np.mean(values)),
            "violations": float(np.mean(np.asarray(values) > EXCESS_TOLERANCE)),
        }
        for kind, values in gaps.items()
        if values
    }


def baseline(keys: Sequence[tuple[str, str]]) -> dict[str, dict[str, float]]:
    """The same scores for answering 0.5 to every question."""
    return coherence({key: 0.5 for key in keys})
