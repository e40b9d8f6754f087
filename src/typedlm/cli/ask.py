"""`typedlm ask [FILE]`: one /v1/systemone request body in (a file or stdin), the response body out on stdout,
answered by a model loaded in process. The body is validated before the model loads."""

from __future__ import annotations

import argparse
import json
import sys

from typedlm.cli.common import add_calibration_options, add_model_options, aliases, calibration_kwargs, read_body
from typedlm.core.errors import InvalidRequest


def add_parser(commands: argparse._SubParsersAction) -> None:
    ask = commands.add_parser("ask", help="answer one /v1/systemone request body (JSON) and print the response")
    ask.add_argument("file", nargs="?", help="request body file (default: stdin)")
    add_model_options(ask)
    add_calibration_options(ask)
    ask.add_argument("--indent", type=int, default=2, help="JSON indent of the output (default: 2)")


def run(args: argparse.Namespace) -> int:
    from typedlm.core.questions import parse_request

    request = parse_request(read_body(args.file))  # validate before the (slow) model load and torch's import
    from typedlm.decide.decider import Decider
    from typedlm.decide.startup import chosen_default

    model = args.model or chosen_default()
    decider = Decider.load(model, args.device, args.dtype, **calibration_kwargs(args))
    served = (decider.name, *aliases(decider.name))
    if request.model is not None and request.model not in served:  # as the server answers it (404)
        raise InvalidRequest(f"unknown model {request.model!r}; this model answers to: {', '.join(served)}", ("model",))
    response = decider.decide(request.state, request.questions, request.calibration, request.order_reads)
    json.dump(response.to_wire(), sys.stdout, indent=args.indent or None, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0
