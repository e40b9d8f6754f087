"""Command line: `typedlm serve` runs the HTTP server; `typedlm ask [FILE]` answers one request body;
`typedlm eval` scores labeled data; `typedlm calibrate` fits a calibration file; `typedlm fit-shipped` fits the
shipped calibration files leave-one-set-out on recorded readouts.

    typedlm serve                                   # the embedded default model on 127.0.0.1:8000
    typedlm serve --model Qwen/Qwen3-0.6B --device cuda --api-key secret
    echo '{"state": "...", "questions": {...}}' | typedlm ask
    typedlm eval rotten_tomatoes --limit 300 --methods raw contextual --out eval/rt.json
    typedlm eval data.jsonl --url http://127.0.0.1:8000
    typedlm calibrate rotten_tomatoes bbc_news sys1bench --out calibration.json
    typedlm fit-shipped --sets rotten_tomatoes bbc_news sys1bench --readouts eval/readouts/smollm2 --out loso.json
    typedlm feedback stats --feedback-db feedback.sqlite     # also: feedback export OUT.jsonl, import IN.jsonl

Bad input prints a clear message on stderr and exits 2; a model that cannot be loaded exits 3; `serve` on an
address it cannot listen on (a port in use) exits 4, before loading the model.

Each subcommand is a module of this package with `add_parser(commands)` and `run(args)`: `ask`, `serve`,
`evaluate` (eval), `calibrate`, `shipped` (fit-shipped), `batch`, `models`, `feedback`; what several share is in
`common`. This module wires them into one parser and maps the errors they raise to exit codes (`main`).
"""

from __future__ import annotations

import argparse
import sys

from typedlm.cli import ask, batch, calibrate, evaluate, feedback, models, serve, shipped
from typedlm.cli.common import EXIT_BAD_INPUT, EXIT_CANNOT_LISTEN, EXIT_MODEL
from typedlm.cli.serve import CannotListen
from typedlm.core.errors import InvalidRequest, ModelError, TypedLMError

SUBCOMMANDS = {  # in the order `typedlm --help` lists them
    "ask": ask,
    "serve": serve,
    "eval": evaluate,
    "calibrate": calibrate,
    "fit-shipped": shipped,
    "batch": batch,
    "models": models,
    "feedback": feedback,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="typedlm", description="Typed decisions from language models.")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS.values():
        module.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return SUBCOMMANDS[args.command].run(args)
    except InvalidRequest as exc:
        print(f"typedlm: invalid request: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModelError as exc:
        print(f"typedlm: model error: {exc}", file=sys.stderr)
        return EXIT_MODEL
    except CannotListen as exc:
        print(f"typedlm: {exc}", file=sys.stderr)
        return EXIT_CANNOT_LISTEN
    except TypedLMError as exc:
        print(f"typedlm: {exc}", file=sys.stderr)
        return 1
