"""`typedlm calibrate DATA...`: calibration files fitted on labeled training data (Platt scaling, temperatures) on
top of one or more base methods, from one pass over the data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from typedlm.cli.common import add_eval_options, add_model_options, progress


def add_parser(commands: argparse._SubParsersAction) -> None:
    calibrate = commands.add_parser("calibrate", help="fit Platt/temperature calibration on labeled training data")
    calibrate.add_argument("data", nargs="+", help="datasets or JSONL files (their train split is used)")
    add_eval_options(calibrate, "train")
    calibrate.add_argument(
        "--base",
        nargs="+",
        choices=("raw", "contextual"),
        default=["raw"],
        help="method(s) fitted on top of, from one pass over the data (default raw)",
    )
    calibrate.add_argument("--out", required=True, help="calibration file; with several bases, OUT.<base>.json")
    add_model_options(calibrate)


def run(args: argparse.Namespace) -> int:
    from typedlm.decide.decider import Decider
    from typedlm.offline.evaluate import load_examples
    from typedlm.offline.fitting import fit_calibrations

    examples = [e for data in args.data for e in load_examples(data, args.split, args.limit, args.seed)]
    from typedlm.decide.startup import chosen_default

    decider = Decider.load(args.model or chosen_default(), args.device, args.dtype)
    data = {"sets": args.data, "split": args.split, "seed": args.seed, "limit": args.limit, "examples": len(examples)}
    files = fit_calibrations(decider, examples, args.base, data, progress("calibrate"))
    out = Path(args.out)
    for base, fitted in files.items():
        path = out if len(files) == 1 else out.with_name(f"{out.stem}.{base}{out.suffix or '.json'}")
        fitted.save(path)
        print(f"{base}: {json.dumps(fitted.params)}")
        print(f"wrote {path} for {decider.name} (fingerprint {decider.fingerprint})", file=sys.stderr)
    return 0
