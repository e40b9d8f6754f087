"""Command line: `typedlm serve` runs the HTTP server; `typedlm ask [FILE]` answers one request body.

    typedlm serve                                   # the embedded default model on 127.0.0.1:8000
    typedlm serve --model Qwen/Qwen3-0.6B --device cuda --api-key secret
    echo '{"state": "...", "questions": {...}}' | typedlm ask

Bad input prints a clear message on stderr and exits 2; a model that cannot be loaded exits 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from typedlm.errors import InvalidRequest, ModelError, TypedLMError
from typedlm.models import EMBEDDED_MODEL, RECOMMENDED_MODEL
from typedlm.server.settings import API_KEYS_ENV

EXIT_BAD_INPUT = 2
EXIT_MODEL = 3


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=os.environ.get("TYPEDLM_MODEL"),
        help=f"Hugging Face id, local directory or .gguf file (default: the embedded {EMBEDDED_MODEL}; "
        f"with internet, {RECOMMENDED_MODEL} is recommended)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: float32 on CPU, bfloat16 on CUDA)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="typedlm", description="Typed decisions from language models.")
    commands = parser.add_subparsers(dest="command", required=True)
    ask = commands.add_parser("ask", help="answer one /v1/systemone request body (JSON) and print the response")
    ask.add_argument("file", nargs="?", help="request body file (default: stdin)")
    _add_model_options(ask)
    ask.add_argument("--indent", type=int, default=2, help="JSON indent of the output (default: 2)")
    serve = commands.add_parser("serve", help="serve /v1/systemone, /v1/models and /v1/chat/completions over HTTP")
    _add_model_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        help=f"require Authorization: Bearer KEY (repeatable; also {API_KEYS_ENV}, comma-separated)",
    )
    serve.add_argument("--max-queue", type=int, default=16, help="requests running or waiting; more get 503")
    serve.add_argument("--timeout", type=float, default=300.0, help="seconds per request before a 504 (default 300)")
    serve.add_argument("--max-body-bytes", type=int, default=8 << 20, help="request body limit, after decompression")
    serve.add_argument("--max-input-tokens", type=int, default=None, help="tokens per request (default: the context)")
    serve.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=1024,
        help="memory for prefilled documents reused across requests (0: off)",
    )
    serve.add_argument(
        "--no-cuda-graphs",
        dest="cuda_graphs",
        action="store_false",
        help="on CUDA, run each forward eagerly instead of replaying captured graphs",
    )
    return parser


def _read_body(path: str | None) -> object:
    try:
        text = sys.stdin.read() if path in (None, "-") else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the request is not valid JSON: {exc}") from exc


def ask(args: argparse.Namespace) -> int:
    from typedlm.decider import Decider
    from typedlm.questions import parse_request

    request = parse_request(_read_body(args.file))  # validate before the (slow) model load
    decider = Decider.load(args.model, args.device, args.dtype)
    response = decider.decide(request.state, request.questions)
    json.dump(response.to_wire(), sys.stdout, indent=args.indent or None, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from typedlm.decider import Decider
    from typedlm.server import ServerSettings, create_app
    from typedlm.server.settings import keys_from_env

    if args.max_queue < 1:
        raise InvalidRequest("--max-queue must be at least 1")
    settings = ServerSettings(
        api_keys=tuple(args.api_key) + keys_from_env(),
        max_queue=args.max_queue,
        request_timeout_s=args.timeout,
        max_body_bytes=args.max_body_bytes,
    )
    decider = Decider.load(
        args.model,
        args.device,
        args.dtype,
        args.max_input_tokens,
        prefix_cache_bytes=args.prefix_cache_mb << 20,
        cuda_graphs=None if args.cuda_graphs else False,
    )
    auth = f"{len(settings.api_keys)} API key(s)" if settings.api_keys else "auth off"
    print(f"typedlm: serving {decider.name} on http://{args.host}:{args.port} ({auth})", file=sys.stderr, flush=True)
    uvicorn.run(create_app(decider, settings), host=args.host, port=args.port, timeout_graceful_shutdown=60)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return serve(args) if args.command == "serve" else ask(args)
    except InvalidRequest as exc:
        print(f"typedlm: invalid request: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModelError as exc:
        print(f"typedlm: model error: {exc}", file=sys.stderr)
        return EXIT_MODEL
    except TypedLMError as exc:
        print(f"typedlm: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
