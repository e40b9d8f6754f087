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

from typedlm.calibrate.calibration import CalibrationFile
from typedlm.core.errors import InvalidRequest, TypedLMError
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import parse_questions, parse_state
from typedlm.offline.evaldata import DATASETS, Example, read_jsonl, sample, split
from typedlm.offline.metrics import Prediction, summarize

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
            file.check(decider.fingerprint, decider.prompt_version)

    def answers(self, example: Example, methods: Sequence[str], order_reads: int) -> dict[str, WireAnswers]:
        questions = parse_questions(example.questions)
        calibrators = {m: self.decider.calibrators.get(m) for m in methods}
        calibrators |= {label: self.decider.calibrators.fitted(file) for label, file in self.fitted.items()}
        contextual = any(calibrator.needs_prior for calibrator in calibrators.values())
        reads = self.decider.read(parse_state(example.state), questions, order_reads, contextual).reads
        return {
            row: {q: calibrator.answer(questions[q], reads[q]).to_wire() for q in questions}
            for row, calibrator in calibrators.items()
        }


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
    methods: Sequence[str] = (CalibrationMethod.RAW,),
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
                    gold = question.gold_index(example.gold[qid])
                    predictions.setdefault(row, []).append(
                        Prediction(kind, question.wire_probabilities(answer), gold, answer.get("x_raw_mass", 0.0))
                    )
    return {row: summarize(preds) for row, preds in predictions.items()}
