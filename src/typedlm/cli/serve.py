"""`typedlm serve`: the HTTP server (`typedlm.server`) on --host/--port, the model in a process of its own (by
default) or the server's, or N replicas on Ray Serve (`--replicas`).

The address is bound once before the (slow) model load, so that one it cannot listen on (a port in use) fails at
once with `CannotListen` (exit code 4); `typedlm.decide.startup.load_served` loads the model and says what was
loaded. Every option but the replicas' is a field of `ServerSettings` (`typedlm.cli.options`).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import time

from typedlm.cli.common import EXIT_MODEL, add_calibration_options, add_model_options, aliases
from typedlm.cli.options import add_settings_options, option_fields, settings_from_args
from typedlm.core.errors import InvalidRequest, TypedLMError
from typedlm.core.settings import FEEDBACK_DB_ENV
from typedlm.runtime.catalog import default_model

MODEL_OPTIONS = ("model", "device", "dtype")  # added by `add_model_options`, as other commands have them
CALIBRATION_OPTIONS = ("calibration", "calibration_file", "order_reads")
KEEP_ALIVE_S = 5  # idle keep-alive connections are closed after this many seconds


def add_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve /v1/systemone, /v1/models and /v1/chat/completions over HTTP")
    add_model_options(serve)
    add_calibration_options(serve)
    served = [name for name in option_fields() if name not in (*MODEL_OPTIONS, *CALIBRATION_OPTIONS)]
    add_settings_options(serve, served, defaults={"feedback_db": os.environ.get(FEEDBACK_DB_ENV, "default")})
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


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from typedlm.decide.startup import load_served
    from typedlm.hosting.heap import (
        MMAP_THRESHOLD_BYTES,
        MODEL_MMAP_THRESHOLD_BYTES,
        freeze_start_up_objects,
        return_freed_memory,
    )
    from typedlm.hosting.model_process import ModelProcess
    from typedlm.hosting.threads import on_passing_thread
    from typedlm.server import create_app
    from typedlm.server.protocol import bounded_protocol

    settings = settings_from_args(args)  # every value checked before the address is bound or anything loads
    if args.replicas is not None and args.replicas < 1:
        raise InvalidRequest("--replicas must be at least 1")
    _check_listen(settings.host, settings.port)
    # large blocks go back as they are freed (`hosting.heap`): a body's, where the model is elsewhere; a large
    # forward's, where it is here (a usual forward's when the model worker is idle)
    only_http = args.replicas is not None or settings.model_process
    return_freed_memory(MMAP_THRESHOLD_BYTES if only_http else MODEL_MMAP_THRESHOLD_BYTES)
    if args.replicas is not None:
        return serve_replicas(args)
    load = functools.partial(load_served, settings)
    # the model loaded in its own process (which prints what it loaded), or here on a thread that ends: only the model
    # thread keeps OpenMP workers (`hosting.threads`)
    model = ModelProcess(load, settings) if settings.model_process else on_passing_thread(load)
    name = model.name
    settings = settings.model_copy(update={"aliases": aliases(name)})
    app = create_app(model, settings)
    batch = app.state.model.max_batch  # what the decider can, within --max-batch
    batching = f"up to {batch} requests per forward" if batch > 1 else "one request per forward"
    where = "a process of its own" if settings.model_process else "the server's process"
    print(f"typedlm: batching: {batching} (--max-batch {settings.max_batch}); the model in {where}", file=sys.stderr)
    auth = f"{len(settings.api_keys)} API key(s)" if settings.api_keys else "auth off"
    print(f"typedlm: serving {name} on http://{settings.host}:{settings.port} ({auth})", file=sys.stderr, flush=True)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    freeze_start_up_objects()  # this process's imports (and the model, where it is here), out of the collector's walks
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            timeout_graceful_shutdown=60,
            access_log=False,  # the request log (typedlm.requests) says more, one line per request
            timeout_keep_alive=KEEP_ALIVE_S,
            http=bounded_protocol(settings.head_timeout_s, settings.body_timeout_s, settings.pending_body_bytes),
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


def serve_replicas(args: argparse.Namespace) -> int:
    """`serve --replicas N`: the Ray Serve application (`typedlm.replicas.app`) on a local Ray or `--ray-address`,
    its HTTP proxy on --host/--port, until interrupted."""
    try:
        import ray
        from ray import serve as ray_serve

        from typedlm.replicas.app import APP_NAME, ReplicaArgs, build_app
    except ImportError as exc:
        raise InvalidRequest(f"--replicas needs Ray Serve: pip install 'typedlm[ray]' ({exc})") from exc
    cpus = args.cpus_per_replica or max(1, (os.cpu_count() or 1) // args.replicas)
    options = settings_from_args(args, ReplicaArgs, replicas=args.replicas, cpus_per_replica=cpus)
    started = time.perf_counter()
    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)
    signal.signal(signal.SIGTERM, _interrupt)  # a plain kill shuts Ray down as Ctrl-C does (after Ray's own handler)
    try:
        http = {"host": options.host, "port": options.port}
        ray_serve.start(http_options=http, logging_config={"log_level": "WARNING"})
        ray_serve.run(build_app(options), name=APP_NAME, route_prefix="/", blocking=False)
        auth = f"{len(options.api_keys)} API key(s)" if options.api_keys else "auth off"
        print(
            f"typedlm: serving {args.replicas} replicas of {options.model or default_model().name} on "
            f"http://{options.host}:{options.port} (Ray Serve, routed by document, {auth}; ready in "
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
