"""What several subcommands share: the exit codes, the model and calibration options, reading a request body,
the names a model answers to, and progress bars.

Each subcommand's module (`typedlm.cli.ask`, `serve`, `evaluate`, ...) adds its parser with these and reads its
arguments back through them; `typedlm.cli` maps the errors they raise to the exit codes here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from typedlm.cli.options import add_settings_options, feedback_path
from typedlm.core.errors import InvalidRequest
from typedlm.core.settings import DEFAULT_ALIASES, MODEL_ENV
from typedlm.offline.evaluate import SPLITS
from typedlm.runtime.catalog import NAMED_MODELS, short_names
from typedlm.runtime.models import EMBEDDED_MODEL, RECOMMENDED_MODEL

EXIT_BAD_INPUT = 2
EXIT_MODEL = 3
EXIT_CANNOT_LISTEN = 4


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """--model (default: $TYPEDLM_MODEL, else the embedded model), --device and --dtype."""
    add_settings_options(
        parser,
        ("model", "device", "dtype"),
        defaults={"model": os.environ.get(MODEL_ENV)},
        more_help={
            "model": f"named: {', '.join(m.aliases[0] for m in NAMED_MODELS)} (see `typedlm models`); the default is "
            f"the best of them installed, else the embedded {EMBEDDED_MODEL} (${MODEL_ENV} sets another); with "
            f"internet {RECOMMENDED_MODEL} also works"
        },
    )


def add_calibration_options(parser: argparse.ArgumentParser) -> None:
    """--calibration, --calibration-file and --order-reads."""
    add_settings_options(parser, ("calibration", "calibration_file", "order_reads"))


def add_eval_options(parser: argparse.ArgumentParser, split: str) -> None:
    parser.add_argument("--split", default=split, choices=SPLITS, help=f"fixed split to use (default {split})")
    parser.add_argument("--limit", type=int, default=None, help="a class-balanced sample of this many examples")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and the sample (default 0)")


def read_body(path: str | None) -> object:
    try:
        text = sys.stdin.read() if path in (None, "-") else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the request is not valid JSON: {exc}") from exc


def aliases(name: str) -> tuple[str, ...]:
    """The other names a request's `model` may use for the model named `name` (`ask` and `serve` alike): the
    default aliases and, for a named model, its short names (qwen2.5-coder-0.5b)."""
    return (*DEFAULT_ALIASES, *short_names(name))


def calibration_kwargs(args: argparse.Namespace) -> dict:
    # calibration None: the decider's default ("fitted" with a calibration file)
    options = {
        "calibration": args.calibration,
        "calibration_file": args.calibration_file,
        "order_reads": args.order_reads,
    }
    if getattr(args, "feedback_db", None) is not None:  # batch's; serve passes its own through its settings
        options["feedback_db"] = feedback_path(args.feedback_db)
    return options


def progress(description: str):
    from tqdm.auto import tqdm

    return lambda items: tqdm(items, desc=description, unit="example", file=sys.stderr)
