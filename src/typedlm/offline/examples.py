"""A labeled example: one `/v1/systemone` request (`state` + named `questions`) with the right answer per question
in `gold`: `True`/`False` for noul, the option name for choice, the 0-based level index for score. On disk it is
one JSON object per line:

    {"id": "rt-00123", "source": "rotten_tomatoes", "state": "...",
     "questions": {"positive": {"type": "noul", "instructions": "...", "criteria": {"true": "...", "false": "..."}}},
     "gold": {"positive": true}}

`validate` checks an example as `Example.from_json` does. Plain data: the corpora's loaders (`evaldata`,
`corpora`) build these, and everything offline reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from typedlm.core.errors import InvalidRequest
from typedlm.core.questions import Text, parse_request

MAX_ARTICLE_CHARS = 1500  # headline + body of a BBC article; about 350 tokens, so a request stays well under 600


@dataclass(frozen=True)
class Example:
    """One request with its right answers: `gold[qid]` is a bool (noul), option name (choice) or level index (score)."""

    id: str
    source: str
    state: Text
    questions: dict[str, dict[str, Any]]  # question objects exactly as in a /v1/systemone request
    gold: dict[str, bool | str | int]

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one JSONL line."""
        return {
            "id": self.id,
            "source": self.source,
            "state": self.state,
            "questions": self.questions,
            "gold": self.gold,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Example:
        """A decoded JSON object → a validated `Example`.

        Raises:
            ValueError: a field is missing or mistyped, a question is invalid, or a gold answer is not one of its
                question's answers.
        """
        if not isinstance(obj, Mapping):
            raise ValueError(f"an example must be a JSON object, not {type(obj).__name__}")
        missing = [key for key in ("id", "source", "state", "questions", "gold") if key not in obj]
        if missing:
            raise ValueError(f"an example needs {', '.join(missing)}")
        if not isinstance(obj["id"], str) or not isinstance(obj["source"], str):
            raise ValueError("id and source must be strings")
        if not isinstance(obj["questions"], dict) or not isinstance(obj["gold"], dict):
            raise ValueError("questions and gold must be objects")
        example = cls(obj["id"], obj["source"], obj["state"], obj["questions"], obj["gold"])
        validate(example)
        return example


def validate(example: Example) -> None:
    """Check that the example is a valid request and that every question has exactly one valid gold answer.

    Raises:
        ValueError: naming the example id and the question.
    """
    try:
        request = parse_request({"state": example.state, "questions": example.questions})
    except InvalidRequest as exc:
        raise ValueError(f"{example.id}: invalid request: {exc}") from exc
    if set(example.gold) != set(request.questions):
        raise ValueError(
            f"{example.id}: gold answers {sorted(example.gold)} do not match questions {sorted(request.questions)}"
        )
    for qid, question in request.questions.items():
        gold = example.gold[qid]
        try:
            question.gold_index(gold)
        except ValueError as exc:
            raise ValueError(f"{example.id}: gold for {qid!r} is {gold!r}; it must be {exc}") from None
