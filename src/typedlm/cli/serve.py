"""`typedlm serve`: the HTTP server (`typedlm.server`) on --host/--port, the model in a process of its own (by
default) or the server's, or N replicas on Ray Serve (`--replicas`).

The address is bound once before the (slow) model load, so that one it cannot listen on (a port in use) fails at
once with `CannotListen` (exit code 4); `load_served_decider` loads the model and says what was loaded.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from typedlm.cli.common import EXIT_MODEL, add_calibration_options, add_model_options, aliases, feedback_path
from typedlm.core.errors import InvalidRequest, TypedLMError
from typedlm.runtime.models import EMBEDDED_MODEL
from typedlm.serving.settings import (
    API_KEYS_ENV,
    BODY_TIMEOUT_S,
    HEAD_TIMEOUT_S,
    PENDING_BODIES,
    PREFIX_CACHE_MB,
    ServerSettings,
)

DEFAULTS = ServerSettings()  # the server's defaults (`ServeOptions` takes the same)

if TYPE_CHECKING:
    from typedlm.serving.options import ServeOptions

KEEP_ALIVE_S = 5  # idle keep-alive connections are closed after this many seconds


def add_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve /v1/systemone, /v1/models and /v1/chat/completions over HTTP")
    add_model_options(serve)
    add_calibration_options(serve)
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
        "--max-queue",
        type=int,
        default=DEFAULTS.max_queue,
        help=f"requests running or waiting; more get 503 (default {DEFAULTS.max_queue})",
    )
    serve.add_argument(
        "--timeout",
        type=float,
        default=DEFAULTS.request_timeout_s,
        help=f"seconds per request before a 504 (default {DEFAULTS.request_timeout_s:g})",
    )
    serve.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULTS.max_batch,
        help=f"requests one forward may answer together, where the model runs several documents per forward (a GPU "
        f"with static shapes; default {DEFAULTS.max_batch}); 1: one forward per request, the next tokenized meanwhile",
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
        default=DEFAULTS.max_body_bytes,
        help=f"request body limit, after decompression (default {DEFAULTS.max_body_bytes}, "
        f"{DEFAULTS.max_body_bytes >> 20} MiB)",
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
        default=DEFAULTS.log_format,
        help=f"the one line logged per request: key=value text or JSON (default {DEFAULTS.log_format})",
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
        default=PREFIX_CACHE_MB,
        help=f"memory for prefilled documents reused across requests (0: off; default {PREFIX_CACHE_MB})",
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

    from typedlm.serving.options import ServeOptions
    from typedlm.serving.settings import keys_from_env

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
            feedback_db=feedback_path(args.feedback_db),
            **more,
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        option = "--" + "-".join(str(part) for part in error["loc"]).replace("_", "-")
        raise InvalidRequest(f"{option}: {error['msg']}") from exc


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from typedlm.server import create_app
    from typedlm.server.protocol import bounded_protocol
    from typedlm.serving.heap import (
        MMAP_THRESHOLD_BYTES,
        MODEL_MMAP_THRESHOLD_BYTES,
        freeze_start_up_objects,
        return_freed_memory,
    )
    from typedlm.serving.model_process import ModelProcess
    from typedlm.serving.threads import on_passing_thread

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
    # large blocks go back as they are freed (`serving.heap`): a body's, where the model is elsewhere; a large
    # forward's, where it is here (a usual forward's when the model worker is idle)
    only_http = args.replicas is not None or args.model_process
    return_freed_memory(MMAP_THRESHOLD_BYTES if only_http else MODEL_MMAP_THRESHOLD_BYTES)
    if args.replicas is not None:
        return serve_replicas(args)
    options = _serve_options(args)
    if args.model_process:  # loaded there; it prints what it loaded
        model = ModelProcess(functools.partial(load_served_decider, options), options.settings())
    else:  # loaded on a thread that ends: only the model thread keeps OpenMP workers (`serving.threads`)
        model = on_passing_thread(functools.partial(load_served_decider, options))
    name = model.name
    settings = options.settings(aliases=aliases(name))
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
        f"typedlm: loaded {about.model} in {time.perf_counter() - started:.1f} s: {about.device}, "
        f"{about.dtype}, context {about.context or 'unknown'} tokens, calibration {about.calibration} "
        f"(order reads {about.order_reads}), fingerprint {about.fingerprint}",
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
