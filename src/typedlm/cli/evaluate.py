"""`typedlm eval DATA`: labeled examples (a built-in dataset or a JSONL file) scored through a model in process or
a running server (--url): accuracy, ECE, Brier, NLL and coverage per method and order reads, as a table; with
--out, a JSON report and reliability diagrams beside it."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from typedlm.cli.common import add_eval_options, add_model_options, progress
from typedlm.core.names import CalibrationMethod
from typedlm.core.questions import CALIBRATION_METHODS
from typedlm.offline.evaldata import DATASETS

DEFAULT_METHODS = (CalibrationMethod.RAW, CalibrationMethod.CONTEXTUAL)  # the rows without --methods


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("eval", help="score labeled examples: accuracy, ECE, Brier, NLL, coverage")
    evaluate.add_argument("data", help=f"a dataset ({', '.join(DATASETS)}) or a JSONL file of examples")
    add_eval_options(evaluate, "held_out")
    evaluate.add_argument(
        "--methods", nargs="+", choices=CALIBRATION_METHODS, default=None, help="default: all available"
    )
    evaluate.add_argument("--order-reads", nargs="+", type=int, default=[1], help="one row per value (default 1)")
    evaluate.add_argument("--url", default=None, help="evaluate a running server instead of a model in process")
    evaluate.add_argument("--api-key", default=None, help="Bearer key for --url")
    evaluate.add_argument("--out", default=None, help="JSON report path; reliability PNGs beside it")
    evaluate.add_argument(
        "--calibration-file",
        nargs="+",
        default=[],
        help="in process: one row per file, fitted on its base (over --url, use --methods fitted)",
    )
    add_model_options(evaluate)


def run(args: argparse.Namespace) -> int:
    from typedlm.offline.evaluate import HttpBackend, LocalBackend, evaluate, load_examples
    from typedlm.offline.metrics import format_table, reliability_plot

    examples = load_examples(args.data, args.split, args.limit, args.seed)
    if args.url:
        backend = HttpBackend(args.url, args.api_key)
        methods = args.methods or list(DEFAULT_METHODS)
    else:
        from typedlm.calibrate.calibration import CalibrationFile
        from typedlm.decide.decider import Decider

        files = {f"fitted ({Path(path).stem})": CalibrationFile.load(path) for path in args.calibration_file}
        if len(files) == 1:
            files = {f"fitted ({file.base})": file for file in files.values()}
        from typedlm.decide.startup import chosen_default

        decider = Decider.load(args.model or chosen_default(), args.device, args.dtype)
        if not files and not args.methods and decider.calibration_file is not None:
            files = {"fitted (shipped default)": decider.calibration_file}  # the model's default, beside raw/contextual
        backend = LocalBackend(decider, files)
        methods = [m for m in (args.methods or DEFAULT_METHODS) if m != CalibrationMethod.FITTED]
    rows = evaluate(backend, examples, methods, args.order_reads, progress(f"eval {args.data}"))
    print(format_table({f"{args.data} · {row}": summary for row, summary in rows.items()}))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "data": args.data,
            "split": args.split,
            "seed": args.seed,
            "examples": len(examples),
            "model": backend.name,
            "rows": rows,
        }
        out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        for row, summary in rows.items():
            slug = re.sub(r"[^A-Za-z0-9]+", "-", row).strip("-")
            reliability_plot(summary, out.with_name(f"{out.stem}-{slug}.png"), title=f"{args.data} · {row}")
        print(f"wrote {out} and its reliability diagrams", file=sys.stderr)
    return 0
