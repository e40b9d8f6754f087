"""The calibrators a decider offers, by method, resolved once from its options.

    calibrators = Calibrators(content_free, file, prompt_version, length_normalised, out_of_fold, requested)
    calibrators.default                   # what a request without x_calibration is answered by
    calibrators.get(request.calibration)  # a request's own method (an InvalidRequest where it cannot be had)
    calibrators.fitted(file)              # another calibration file, read as this decider reads its own

Raw and contextual are always there; fitted where there is a calibration file; feedback where there are fold models
(a feedback database). The default is the method asked for, else feedback, else fitted, else contextual
(`calibration.DEFAULT_CALIBRATION`). Feedback asked for where there is no database answers as the default does.
"""

from __future__ import annotations

from collections.abc import Callable

from typedlm.calibrate.calibration import DEFAULT_CALIBRATION, CalibrationFile
from typedlm.calibrate.calibrators import Calibrator, ContextualCalibrator, FittedCalibrator, RawCalibrator
from typedlm.calibrate.feedback import FeedbackCalibrator
from typedlm.calibrate.out_of_fold import OutOfFold
from typedlm.core.errors import InvalidRequest
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import Question

FITTED_NEEDS_A_FILE = (
    "fitted calibration needs a calibration file for this model (typedlm calibrate, then "
    "typedlm serve --calibration-file FILE)"
)


class Calibrators:
    """Every calibrator of one decider (see the module).

    `content_free(versions)`: the masses of question versions on the content-free document (the contextual
    calibrator's priors); `file`: the decider's calibration file, if any; `length_normalised`: choices read by name
    are length-normalised; `out_of_fold`: the fold models that learn what gold answers teach, where a feedback
    database is open; `requested`: the default method the caller asked for (None: the best there is)."""

    def __init__(
        self,
        content_free: Callable[[list[Question]], list[list[float]]],
        file: CalibrationFile | None,
        prompt_version: str,
        length_normalised: bool,
        out_of_fold: OutOfFold | None = None,
        requested: CalibrationMethod | None = None,
    ):
        self.prompt_version = prompt_version
        self.length_normalised = length_normalised
        self.contextual = ContextualCalibrator(content_free, length_normalised)  # it holds the priors
        self.by_method: dict[CalibrationMethod, Calibrator] = {
            CalibrationMethod.RAW: RawCalibrator(length_normalised),
            CalibrationMethod.CONTEXTUAL: self.contextual,
        }
        if file is not None:
            self.by_method[CalibrationMethod.FITTED] = self.fitted(file)
        # what feedback stands on, and what it answers with where there is no database
        best = CalibrationMethod.FITTED if file is not None else DEFAULT_CALIBRATION
        stands = best if requested in (None, CalibrationMethod.FEEDBACK) else requested
        self.default: Calibrator = self.get(stands, "--calibration")
        self.feedback: FeedbackCalibrator | None = None
        if out_of_fold is not None:
            self.feedback = FeedbackCalibrator(self.default, prompt_version, out_of_fold)
            self.by_method[CalibrationMethod.FEEDBACK] = self.feedback
            if requested in (None, CalibrationMethod.FEEDBACK):
                self.default = self.feedback

    def get(self, method: CalibrationMethod | str | None, where: str = "x_calibration") -> Calibrator:
        """The calibrator of `method` (None: the default).

        Raises:
            InvalidRequest: no such method, or fitted calibration without a calibration file; `where` names the
                option or field that asked for it.
        """
        if method is None:
            return self.default
        try:
            method = CalibrationMethod(method)
        except ValueError:
            raise InvalidRequest(f"{where} must be one of {CalibrationMethod.names()}", (where,)) from None
        if method in self.by_method:
            return self.by_method[method]
        if method == CalibrationMethod.FEEDBACK:  # no database, no labels: the default's answers
            return self.default
        raise InvalidRequest(FITTED_NEEDS_A_FILE, (where,))

    def fitted(self, file: CalibrationFile) -> FittedCalibrator:
        """A calibrator for `file`, reading as this decider reads (its prompt version, its choices' lengths)."""
        return FittedCalibrator(file, self.prompt_version, self.length_normalised)
