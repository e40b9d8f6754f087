"""Evaluation: labeled examples through a decider (in process) or a running server (by URL), scored.

    examples = load_examples("rotten_tomatoes", split="held_out", limit=300)
    reports = evaluate(LocalBackend(decider), examples, methods=["raw", "contextual"], order_reads=[1, 3])

Each (calibration method, order reads) pair is one row of results: accuracy, ECE, Brier, NLL, coverage
and mean raw mass per question type and overall (see `metrics`). In process, one forward per example
serves every method (calibration only re-reads the same masses); over HTTP each method is one request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from typedlm.calibration import (
    MIN_QUESTION_EXAMPLES,
    CalibrationFile,
    calibrate_read,
    fit_platt,
    fit_scaling,
    fit_temperature,
    signature,
)
from typedlm.errors import InvalidRequest, TypedLMError
from typedlm.evaldata import DATASETS, Example, read_jsonl, sample, split
from typedlm.metrics import Prediction, summarize
from typedlm.prompt import PROMPT_VERSION
from typedlm.questions import ChoiceQuestion, NoulQuestion, Question, parse_questions, parse_state

SPLITS = ("train", "held_out", "all")
WireAnswers = dict[str, dict[str, Any]]  # question id → answer as on the wire


def load_examples(data: str, split_name: str = "held_out", limit: int | None = None, seed: int = 0) -> list[Example]:
    """A dataset by name (see `evaldata.DATASETS`) or a JSONL file; its fixed split; a class-balanced sample."""
    if data in DATASETS:
        examples = DATASETS[data]()
    elif Path(data).is_file():
        examples = read_jsonl(data)
    else:
        raise InvalidRequest(f"{data!r} is neither a dataset ({', '.join(DATASETS)}) nor a JSONL file")
    if split_name not in SPLITS:
        raise InvalidRequest(f"split must be one of {', '.join(SPLITS)}")
    if split_name != "all":
        train, held_out = split(examples, seed=seed)
        examples = train if split_name == "train" else held_out
    if limit is not None and limit < len(examples):
        examples = sample(examples, limit, seed=seed)
    return examples


def gold_index(question: Question, gold: Any) -> int:
    """The gold answer as a class index: noul 1 = yes, choice the option's position, score the level."""
    if isinstance(question, NoulQuestion):
        return int(bool(gold))
    if isinstance(question, ChoiceQuestion):
        return [name for name, _ in question.options].index(gold)
    return int(gold)


def probabilities(question: Question, answer: Mapping[str, Any]) -> tuple[float, ...]:
    """A wire answer's probabilities in class order (noul: (p_no, p_yes))."""
    if isinstance(question, NoulQuestion):
        return (1 - answer["noul"], answer["noul"])
    if isinstance(question, ChoiceQuestion):
        return tuple(answer["probabilities"][name] for name, _ in question.options)
    return tuple(answer["probabilities"][str(i)] for i in range(len(question.levels)))


class LocalBackend:
    """A decider in this process: one forward per example and order-read count, every method from it.

    `fitted` files (row label → CalibrationFile, each checked against the model) add one row each, so that
    files fitted on different bases compare on the same reads.
    """

    def __init__(self, decider, fitted: Mapping[str, CalibrationFile] | None = None):
        self.decider = decider
        self.name = decider.name
        self.fitted = dict(fitted or {})
        for file in self.fitted.values():
            file.check(decider.fingerprint, PROMPT_VERSION)

    def answers(self, example: Example, methods: Sequence[str], order_reads: int) -> dict[str, WireAnswers]:
        questions = parse_questions(example.questions)
        contextual = any(self.decider.needs_prior(m) for m in methods)
        contextual |= any(file.base == "contextual" for file in self.fitted.values())
        reads, _ = self.decider.read(parse_state(example.state), questions, order_reads, contextual)
        answer = self.decider.answer
        rows = {m: {q: answer(questions[q], reads[q], m).to_wire() for q in questions} for m in methods}
        for label, file in self.fitted.items():
            rows[label] = {q: answer(questions[q], reads[q], "fitted", file).to_wire() for q in questions}
        return rows


class HttpBackend:
    """A running typedlm server: one request per example and method (x_calibration, x_order_reads)."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 300.0):
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.name = url

    def answers(self, example: Example, methods: Sequence[str], order_reads: int) -> dict[str, WireAnswers]:
        out = {}
        for method in methods:
            body = {"state": example.state, "questions": example.questions, "x_calibration": method}
            body["x_order_reads"] = order_reads
            response = self.client.post("/v1/systemone", json=body)
            if response.status_code != 200:
                raise TypedLMError(f"{self.name} answered {response.status_code} for {example.id}: {response.text}")
            reply = response.json()
            out[method] = reply["answers"]
            self.name = reply.get("model", self.name)
        return out


def evaluate(
    backend,
    examples: Iterable[Example],
    methods: Sequence[str] = ("raw",),
    order_reads: Sequence[int] = (1,),
    progress: Callable[[Iterable], Iterable] = lambda it: it,
) -> dict[str, dict[str, Any]]:
    """Scores per row: "raw", "contextual", ... for one read, "raw, 3 orders" and so on for more."""
    predictions: dict[str, list[Prediction]] = {}
    for example in progress(list(examples)):
        questions = parse_questions(example.questions)
        for k in order_reads:
            for method, answers in backend.answers(example, methods, k).items():
                row = method if k == 1 else f"{method}, {k} orders"
                for qid, question in questions.items():
                    answer = answers[qid]
                    kind = answer["type"]
                    gold = gold_index(question, example.gold[qid])
                    predictions.setdefault(row, []).append(
                        Prediction(kind, probabilities(question, answer), gold, answer.get("x_raw_mass", 0.0))
                    )
    return {row: summarize(preds) for row, preds in predictions.items()}


def fit_calibrations(
    decider,
    examples: Iterable[Example],
    bases: Sequence[str] = ("raw",),
    data: Mapping[str, Any] | None = None,
    progress=None,
) -> dict[str, CalibrationFile]:
    """Fit calibration files on `examples`, one per base method, from one forward per example.

    Per question type: Platt scaling (noul) or a temperature (choice, score). Per question asked at least
    `MIN_QUESTION_EXAMPLES` times: Platt scaling, or a temperature and a bias per option.
    """
    progress = progress or (lambda it: it)
    # one row per answer: (kind, question signature, probabilities under each base, gold class)
    rows: list[tuple[str, str, dict[str, Any], int]] = []
    for example in progress(list(examples)):
        questions = parse_questions(example.questions)
        reads, _ = decider.read(parse_state(example.state), questions, 1, contextual="contextual" in bases)
        for qid, question in questions.items():
            r = reads[qid]
            prior = r.priors[0] if r.priors else None
            by_base = {base: calibrate_read(r.kind, r.masses[0], base, prior) for base in bases}
            rows.append((r.kind, signature(question), by_base, gold_index(question, example.gold[qid])))
    files = {}
    for base in bases:
        params = {}
        for kind in ("noul", "choice", "score"):
            mine = [(row[2][base], row[3]) for row in rows if row[0] == kind]
            if mine:
                params[kind] = _fit(kind, *zip(*mine, strict=True), per_question=False)
        per_question = {}
        for key in dict.fromkeys(row[1] for row in rows):
            mine = [row for row in rows if row[1] == key]
            if len(mine) >= MIN_QUESTION_EXAMPLES:
                fit = _fit(mine[0][0], [row[2][base] for row in mine], [row[3] for row in mine], per_question=True)
                per_question[key] = {"kind": mine[0][0], "n": len(mine), **fit}
        counts = {kind: sum(row[0] == kind for row in rows) for kind in ("noul", "choice", "score")}
        info = {**(data or {}), "answers": {k: n for k, n in counts.items() if n}}
        files[base] = CalibrationFile(
            decider.name, decider.fingerprint, PROMPT_VERSION, base, params, info, per_question
        )
    return files


def _fit(kind: str, probs: Sequence, gold: Sequence[int], per_question: bool) -> dict[str, Any]:
    if kind == "noul":
        a, b = fit_platt(probs, [g == 1 for g in gold])
        return {"a": a, "b": b}
    if per_question:
        temperature, bias = fit_scaling(probs, gold)
        return {"temperature": temperature, "bias": bias}
    return {"temperature": fit_temperature(probs, gold)}
