"""Typed exceptions at the library boundary.

Every error a caller can provoke is a `TypedLMError`. `InvalidRequest` (and its subclass
`LimitExceeded`) mean "the input is wrong, change it"; the HTTP layer maps them to 4xx in one place.
`ModelError` means the model or its tokenizer cannot be served the way typedlm reads answers.
`StoreError` means the feedback database cannot be opened, read or written as typedlm keeps it.
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
