"""`typedlm batch INPUT --out OUT`: a file of /v1/systemone request bodies (JSON Lines or Parquet) answered into
JSON Lines in input order, resumable (`typedlm.jobs.batch`), in process or on Ray Data (--ray). A bad questions
file or an unreadable input fails before the model loads."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from typedlm.cli.common import add_calibration_options, add_model_options, aliases, calibration_kwargs, read_body
from typedlm.core.errors import InvalidRequest


def add_parser(commands: argparse._SubParsersAction) -> None:
    batch = commands.add_parser(
        "batch", help="answer a file of /v1/systemone request bodies (JSON Lines or Parquet) into JSON Lines, resumable"
    )
    batch.add_argument("input", help="JSON Lines (one request body per line) or .parquet (one per row; needs pyarrow)")
    batch.add_argument(
        "--out",
        required=True,
        help="JSON Lines of records in input order; a record's id is its row's own id field, else the row's line "
        "number in INPUT (1-based, blank lines counted; Parquet: its row number, 1-based); a re-run resumes it",
    )
    batch.add_argument("--questions", default=None, help="a JSON file of questions asked of every row's state")
    batch.add_argument(
        "--feedback-db",
        default=None,
        metavar="PATH",
        help="a feedback database (as serve --feedback-db): the rows are answered with what its labels taught, and "
        "a row's gold answers (a 'gold' field, as POST /v1/systemone/feedback takes) are stored and learned",
    )
    batch.add_argument(
        "--coverage",
        type=float,
        default=None,
        metavar="P",
        help="every answer carries its answer set at this coverage, in (0, 1) (x_coverage; a row's own wins)",
    )
    batch.add_argument(
        "--min-accuracy",
        type=float,
        default=None,
        metavar="P",
        help="every answer says whether it abstains at this accuracy, in (0, 1) (x_min_accuracy; a row's own wins)",
    )
    batch.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    batch.add_argument("--ray", action="store_true", help="run on Ray Data: a pool of actors, one decider each")
    batch.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local one)")
    batch.add_argument("--workers", type=int, default=2, help="with --ray: actors (one GPU each on CUDA; default 2)")
    add_model_options(batch)
    add_calibration_options(batch)


def run(args: argparse.Namespace) -> int:
    from typedlm.core.questions import parse_handover, parse_questions
    from typedlm.jobs.batch import count_rows, resume

    defaults = {"x_coverage": args.coverage, "x_min_accuracy": args.min_accuracy}
    defaults = {key: value for key, value in defaults.items() if value is not None}
    parse_handover(defaults)  # a bad --coverage fails before the model loads
    questions = None
    if args.questions:
        questions = read_body(args.questions)
        parse_questions(questions)  # a bad questions file fails before the model loads
    if not Path(args.input).is_file():
        raise InvalidRequest(f"no input file {args.input}")
    total, done = count_rows(args.input), resume(args.out)  # an unreadable input fails before the model loads too
    if done >= total:
        print(f"typedlm: all {total} rows are already in {args.out}", file=sys.stderr)
        return 0
    from tqdm import tqdm

    def progress(rows, total, done):
        return tqdm(rows, total=total, initial=done, unit="row", disable=not args.progress, file=sys.stderr)

    from typedlm.decide.startup import chosen_default

    model = args.model or chosen_default()
    if args.ray:
        if args.workers < 1:
            raise InvalidRequest("--workers must be at least 1")
        from typedlm.jobs.ray_batch import run_batch_on_ray

        on_cpu = not args.device.startswith("cuda")
        options = {"model": model, "device": args.device, "dtype": args.dtype, **calibration_kwargs(args)}
        summary = run_batch_on_ray(
            args.input,
            args.out,
            {**options, "threads": 1 if on_cpu else 0},  # on CPUs an actor has one core
            questions=questions,
            aliases=aliases(model),
            workers=args.workers,
            address=args.ray_address,
            progress=progress,
            defaults=defaults,
        )
    else:
        from typedlm.decide.decider import Decider
        from typedlm.jobs.batch import run_batch

        decider = Decider.load(model, args.device, args.dtype, **calibration_kwargs(args))
        summary = run_batch(
            decider,
            args.input,
            args.out,
            questions=questions,
            aliases=aliases(decider.name),
            progress=progress,
            defaults=defaults,
        )
    print(
        f"typedlm: {summary.answered} rows answered ({summary.errors} as errors), {summary.skipped} already in "
        f"{args.out}, {summary.rows} in all",
        file=sys.stderr,
    )
    return 0
