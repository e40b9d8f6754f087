"""`typedlm fit-shipped --sets SET... --readouts DIR --out REPORT`: the calibration files typedlm ships for its
named models, fitted leave-one-set-out on recorded readouts (`typedlm.offline.shipped`, whose docstring is this
command's --help: the readout folders it reads, the report and calibration file it writes). offline/ cannot load a
model; this command loads the decider it reads with."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from typedlm.core.names import CalibrationMethod
from typedlm.offline import shipped

if TYPE_CHECKING:
    from typedlm.decide.decider import Decider


def add_parser(commands: argparse._SubParsersAction) -> None:
    fit = commands.add_parser(
        "fit-shipped",
        help="fit the shipped calibration files leave-one-set-out on recorded readouts",
        description=shipped.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shipped.add_arguments(fit)


def load_decider(model: str | None, choice_answers: str, prompt_version: str) -> Decider:
    """The decider whose readouts every variant starts from: raw probabilities, choices read by `choice_answers`
    whatever the model's shipped file reads them by."""
    from typedlm.decide.decider import Decider

    return Decider.load(
        model, calibration=CalibrationMethod.RAW, choice_answers=choice_answers, prompt_version=prompt_version
    )


def run(args: argparse.Namespace) -> int:
    return shipped.main(args, load_decider)
