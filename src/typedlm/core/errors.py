"""Typed exceptions at the library boundary.

Every error a caller can provoke is a `TypedLMError`. `InvalidRequest` (and its subclass
`LimitExceeded`) mean "the input is wrong, change it"; the HTTP layer maps them to 4xx in one place.
`ModelError` means the model or its tokenizer cannot be served the way typedlm reads answers.
`StoreError` means the feedback database cannot be opened, read or written as typedlm keeps it.
`AnswerNotHeld` means a label names an answer id the server no longer holds (or never gave).
"""

from __future__ import annotations


class TypedLMError(Exception):
    """Base class of every error typedlm raises on purpose."""


class InvalidRequest(TypedLMError):
    """The request is malformed or out of range.

    Args:
        message: what is wrong and what to change.
        loc: path to the offending value, e.g. ("questions", "tone", "criteria").
    """

    def __init__(self, message: str, loc: tuple[str | int, ...] = (), kind: str = "value_error"):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.kind = kind  # a machine-readable code, e.g. "json_invalid"

    def __reduce__(self):  # pickled whole, loc and kind with it (an error from the model's own process)
        return type(self), (self.message, self.loc, self.kind)

    def __str__(self) -> str:
        where = ".".join(str(part) for part in self.loc)
        return f"{where}: {self.message}" if where else self.message


class LimitExceeded(InvalidRequest):
    """The request is well-formed but larger than the model or the configuration allows."""


class ModelError(TypedLMError):
    """The model or tokenizer cannot be loaded, or cannot be read the way typedlm reads answers."""


class StoreError(TypedLMError):
    """The feedback database cannot be opened or is not one typedlm wrote, or a file to import is not labels."""


class AnswerNotHeld(TypedLMError):
    """A label names an answer id that this server does not hold (never given, or let go of: its window of recent
    answers is bounded in bytes and time).

    Args:
        answer_ids: the ids not held, in the post's order.
    """

    def __init__(self, answer_ids: tuple[str, ...] | list[str]):
        self.answer_ids = tuple(answer_ids)
        named = ", ".join(repr(answer_id) for answer_id in self.answer_ids[:10])
        more = f" and {len(self.answer_ids) - 10} more" if len(self.answer_ids) > 10 else ""
        super().__init__(
            f"no answer with x_id {named}{more} is held here: recent answers are kept for a while and up to a size "
            "(--answer-window-s, --answer-window-mb); post the state, the questions and the gold answers instead"
        )

    def __reduce__(self):  # pickled whole (an error from the model's own process)
        return type(self), (self.answer_ids,)
