"""typedlm: typed decisions (yes/no, choice, score) read from one forward pass of an instruct LLM.

from typedlm import Decider
decider = Decider.load()  # the embedded SmolLM2-135M-Instruct; Decider.load("Qwen/Qwen3-0.6B") with internet
decider.respond({"state": "...", "questions": {"q": {"type": "noul", "instructions": "..."}}})

The package is layered; each folder imports only from the ones below it (docs/architecture.md, "Layers"):
cli → jobs | replicas → server | offline → decide → runtime → ops | text | store → core. The exports below load
lazily, so that `import typedlm.server` or `import typedlm.core` never imports torch or transformers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ChoiceAnswer": "typedlm.core.answers",
    "NoulAnswer": "typedlm.core.answers",
    "Response": "typedlm.core.answers",
    "ScoreAnswer": "typedlm.core.answers",
    "Usage": "typedlm.core.answers",
    "InvalidRequest": "typedlm.core.errors",
    "LimitExceeded": "typedlm.core.errors",
    "ModelError": "typedlm.core.errors",
    "TypedLMError": "typedlm.core.errors",
    "EngineOptions": "typedlm.core.options",
    "ChoiceQuestion": "typedlm.core.questions",
    "NoulQuestion": "typedlm.core.questions",
    "ScoreQuestion": "typedlm.core.questions",
    "parse_request": "typedlm.core.questions",
    "Decider": "typedlm.decide.decider",
}
__all__ = [
    "ChoiceAnswer",
    "ChoiceQuestion",
    "Decider",
    "EngineOptions",
    "InvalidRequest",
    "LimitExceeded",
    "ModelError",
    "NoulAnswer",
    "NoulQuestion",
    "Response",
    "ScoreAnswer",
    "ScoreQuestion",
    "TypedLMError",
    "Usage",
    "parse_request",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from typedlm.core.answers import ChoiceAnswer, NoulAnswer, Response, ScoreAnswer, Usage
    from typedlm.core.errors import InvalidRequest, LimitExceeded, ModelError, TypedLMError
    from typedlm.core.options import EngineOptions
    from typedlm.core.questions import ChoiceQuestion, NoulQuestion, ScoreQuestion, parse_request
    from typedlm.decide.decider import Decider


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'typedlm' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
