"""What a string on the wire or in a file names, as enums: a question's kind, a calibration method, how choice
options are answered. Each member is the string itself (`Kind.NOUL == "noul"`, it hashes, formats and serialises as
"noul"), so a request's or a file's string is turned into its member once, at the edge, and compared by identity
after that."""

from __future__ import annotations

from enum import Enum


class WireName(str, Enum):
    """A name that is also its wire string: `str()`, f-strings and JSON give the string, not the member's name."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def names(cls) -> str:
        """The accepted strings, for an error message: "raw, contextual, ...\""""
        return ", ".join(member.value for member in cls)


class Kind(WireName):
    """A question's type: its `type` on the wire."""

    NOUL = "noul"
    CHOICE = "choice"
    SCORE = "score"


class CalibrationMethod(WireName):
    """How a read's label masses become probabilities (`typedlm.calibrate.calibrators`): `x_calibration`."""

    RAW = "raw"
    CONTEXTUAL = "contextual"
    FITTED = "fitted"
    FEEDBACK = "feedback"


class ChoiceAnswers(WireName):
    """How choice options are answered: by letter (A, B, ...), by their own names, or by their names with each
    name's mass length-normalised (`typedlm.calibrate.calibration.per_token`). A question whose names cannot be read
    (`Labeler.can_name`) is read by letter whatever the setting."""

    LETTERS = "letters"
    NAMES = "names"
    NAMES_PER_TOKEN = "names_per_token"
