"""A labeled answer as the feedback store keeps it (`Label`), how one is checked, and its row in the labels table.

Contract:
- `label_problem(fields)` says what makes `fields` (a label's, by name, as a dataclass or a JSON line gives them)
  not a label, or None: every label the store writes or imports passes it first.
- `to_row(label)` gives a label's values in `COLUMNS` order, its JSON fields (question, masses, priors, lengths)
  encoded exactly (floats written by repr); `from_row(row)` reads one back, `id` included where the row has it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import sqlite3
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from typedlm.core.questions import QUESTION_TYPES

COLUMNS = (  # the labels table's columns a label fills, in `to_row`'s order
    "uid, created, feedback_id, question_id, model, fingerprint, prompt_version, reading, kind, exact, family, "
    "question, masses, priors, lengths, gold, sample, features, features_version"
)
MAX_FEATURE_BYTES = 512  # a label's features: at most 256 float16 values
SAMPLES = ("random", "chosen")  # how a label was picked: a fair sample of the traffic, or chosen for a reason
_JSON_FIELDS = ("question", "masses", "priors", "lengths")


@dataclass(kw_only=True)
class Label:
    """One labeled answer: the question as posted, what the model read for it, and the gold answer's index."""

    uid: str = field(default_factory=lambda: uuid.uuid4().hex)  # import dedupes by it
    created: float = field(default_factory=time.time)  # unix time
    feedback_id: str | None = None  # the post's client-chosen idempotency id
    question_id: str  # the question's id in the request
    model: str
    fingerprint: str
    prompt_version: str
    reading: str  # how choices were read: "letters", "names", "names_per_token"
    kind: str  # "noul", "choice" or "score"
    exact: str  # hash key of the question exactly as asked
    family: str  # hash key of the questions it belongs with
    question: dict  # the question as posted (wire JSON)
    masses: list[list[float]]  # per read, per answer
    priors: list[list[float]] | None = None  # per read, per answer
    lengths: list[int] | None = None
    gold: int  # the gold answer's index
    sample: str = "random"  # "random": a fair sample of the traffic (counted in guarantees); "chosen": picked
    features: str | None = None  # the read's features (its decision row projected), float16 bytes in base64
    features_version: str | None = None  # how they were made (`typedlm.calibrate.projection.FEATURES_VERSION`)
    id: int | None = None  # the row id once stored


_FIELDS = {f.name: f for f in dataclasses.fields(Label)}
_REQUIRED = {n for n, f in _FIELDS.items() if f.default is f.default_factory is dataclasses.MISSING}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_matrix(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(row, list) and all(map(_is_number, row)) for row in value)


def label_problem(fields: dict[str, Any]) -> str | None:
    """What makes `fields` (a label's, by name) not a label, or None."""
    if missing := sorted(_REQUIRED - fields.keys()):
        return f"missing {', '.join(missing)}"
    if unknown := sorted(fields.keys() - _FIELDS.keys()):
        return f"unknown field {', '.join(unknown)}"
    strings = ("uid", "question_id", "model", "fingerprint", "prompt_version", "reading", "kind", "exact", "family")
    for name in strings:
        if not isinstance(fields.get(name, "x"), str) or not fields.get(name, "x"):
            return f"{name} must be a non-empty string"
    if not isinstance(fields.get("feedback_id"), (str, type(None))):
        return "feedback_id must be a string or null"
    if not _is_number(fields.get("created", 0)):
        return "created must be a number (unix time)"
    if fields["kind"] not in QUESTION_TYPES:
        return f"kind must be one of {', '.join(QUESTION_TYPES)}"
    if not isinstance(fields["question"], dict):
        return "question must be an object"
    masses = fields["masses"]
    if not _is_matrix(masses) or not masses or not masses[0]:
        return "masses must be a non-empty list of lists of numbers"
    if fields.get("priors") is not None and not _is_matrix(fields["priors"]):
        return "priors must be a list of lists of numbers or null"
    lengths = fields.get("lengths")
    if lengths is not None and not (isinstance(lengths, list) and all(type(n) is int for n in lengths)):
        return "lengths must be a list of integers or null"
    gold = fields["gold"]
    if type(gold) is not int or not 0 <= gold < len(masses[0]):
        return f"gold must be an answer's index, 0..{len(masses[0]) - 1}"
    if fields.get("sample", "random") not in SAMPLES:
        return f"sample must be one of {', '.join(SAMPLES)}"
    if (problem := _features_problem(fields.get("features"), fields.get("features_version"))) is not None:
        return problem
    if not isinstance(fields.get("id"), (int, type(None))):
        return "id must be an integer or null"
    return None


def _features_problem(features: Any, version: Any) -> str | None:
    if features is None:
        return None if version is None else "features_version without features"
    if not isinstance(version, str) or not version:
        return "features need their features_version (a non-empty string)"
    try:
        size = len(base64.b64decode(features, validate=True)) if isinstance(features, str) else -1
    except (binascii.Error, ValueError):
        size = -1
    if size <= 0 or size % 2 or size > MAX_FEATURE_BYTES:
        return f"features must be base64 of 1 to {MAX_FEATURE_BYTES // 2} float16 values, or null"
    return None


def to_row(label: Label) -> tuple:
    """A label's column values, its JSON fields encoded (exactly: floats are written by repr)."""
    values = []
    for name in COLUMNS.split(", "):
        value = getattr(label, name)
        is_json = name in _JSON_FIELDS and value is not None
        values.append(json.dumps(value, ensure_ascii=False, allow_nan=False) if is_json else value)
    return tuple(values)


def from_row(row: sqlite3.Row) -> Label:
    fields = {name: row[name] for name in row.keys()}  # noqa: SIM118 (a Row is not a mapping)
    for name in _JSON_FIELDS:
        if fields[name] is not None:
            fields[name] = json.loads(fields[name])
    return Label(**fields)
