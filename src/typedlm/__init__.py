"""typedlm: typed decisions (yes/no, choice, score) read from one forward pass of an instruct LLM.

from typedlm import Decider
decider = Decider.load()  # the embedded SmolLM2-135M-Instruct; Decider.load("Qwen/Qwen3-0.6B") with internet
decider.respond({"state": "...", "questions": {"q": {"type": "noul", "instructions": "..."}}})
"""

from typedlm.answers import ChoiceAnswer, NoulAnswer, Response, ScoreAnswer, Usage
from typedlm.decider import Decider
from typedlm.errors import InvalidRequest, LimitExceeded, ModelError, TypedLMError
from typedlm.questions import ChoiceQuestion, NoulQuestion, ScoreQuestion, parse_request

__all__ = [
    "ChoiceAnswer",
    "ChoiceQuestion",
    "Decider",
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
