"""Answers and the response envelope, as plain data with their Jev wire shape (`to_wire`).

Every answer carries `raw_mass`: the total probability the model put on any answer label before
normalisation. A low raw_mass says the answer format did not land (the model wanted to say something
else), whatever the normalised probabilities look like. On the wire it is the extension `x_raw_mass`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Text = str | dict | list  # JSON text: a string, or an object/array rendered as JSON (questions' text fields too)


def _extensions(extras: dict[str, Any]) -> dict[str, Any]:
    return {f"x_{key}": value for key, value in extras.items()}


@dataclass(frozen=True)
class NoulAnswer:
    p_yes: float
    raw_mass: float
    extras: dict[str, Any] = field(default_factory=dict)  # x_-prefixed extensions (stderr, agreement)

    def to_wire(self) -> dict[str, Any]:
        return {"type": "noul", "noul": self.p_yes, "x_raw_mass": self.raw_mass, **_extensions(self.extras)}


@dataclass(frozen=True)
class ChoiceAnswer:
    probabilities: dict[str, float]  # keyed by the exact option names, in request order
    confidence: float
    raw_mass: float
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def choice(self) -> str:
        return max(self.probabilities, key=self.probabilities.__getitem__)

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": "choice",
            "choice": self.choice,
            "probabilities": dict(self.probabilities),
            "confidence": self.confidence,
            "x_raw_mass": self.raw_mass,
            **_extensions(self.extras),
        }


@dataclass(frozen=True)
class ScoreAnswer:
    probabilities: tuple[float, ...]  # level i → probability
    legend: tuple[Text, ...]  # level i → its description, as sent
    confidence: float
    raw_mass: float
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        return sum(i * p for i, p in enumerate(self.probabilities))

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": "score",
            "score": self.score,
            "legend": {str(i): level for i, level in enumerate(self.legend)},
            "probabilities": {str(i): p for i, p in enumerate(self.probabilities)},
            "confidence": self.confidence,
            "x_raw_mass": self.raw_mass,
            **_extensions(self.extras),
        }


Answer = NoulAnswer | ChoiceAnswer | ScoreAnswer


@dataclass(frozen=True)
class Usage:
    input_tokens: int  # the request's whole prompt: system prompt, state, every question's suffix and label tokens
    output_tokens: int = 0  # nothing is generated
    cached_tokens: int = 0  # of input_tokens, those served from the prefix cache instead of run through the model

    def to_wire(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "x_cached_tokens": self.cached_tokens,
        }


@dataclass(frozen=True)
class Response:
    model: str
    answers: dict[str, Answer]
    usage: Usage
    extras: dict[str, Any] = field(default_factory=dict)  # x_-prefixed extensions
    reading: Any = field(default=None, repr=False, compare=False)  # what the model read, where a feedback post
    # asked to keep it (`typedlm.calibrate.reads.Reading`); never on the wire

    def to_wire(self) -> dict[str, Any]:
        body = {
            "model": self.model,
            "answers": {qid: answer.to_wire() for qid, answer in self.answers.items()},
            "usage": self.usage.to_wire(),
        }
        body.update(_extensions(self.extras))
        return body
