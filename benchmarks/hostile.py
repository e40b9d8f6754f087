"""Hostile but valid clients against a real `typedlm serve`: its memory at the peak and what it keeps after.

    python -m benchmarks.hostile                      # the embedded model, everything below
    python -m benchmarks.hostile --names 10 --stalled 100 --concurrent 4

One server (its own process, the model in a process of its own, the defaults otherwise). Phases, in order:

1. long names: `--names` requests, each a choice whose two options have distinct 30,000-character names (each
   is refused, 413: the model's context is passed; a name-reading model tokenizes them too);
2. largest admitted: for every request shape (a long document; as many yes/no questions as admitted; a choice of
   255 options read in as many orders as admitted; one long question among many short ones), the largest the
   server admits, found with a decider of the same model and limits in this process (`Decider.prepare` refuses a
   request without model work), then sent `--concurrent` at once, each shape in turn;
3. stalled bodies: `--stalled` connections, each sending a head that declares an 8 MiB body and 1 MiB of it, then
   nothing: each must be answered 408 (or closed) within `--body-timeout` and a margin, while phase 2's largest
   requests run again alongside.

The model's and the HTTP process's resident memory are sampled every 10 ms throughout. Per phase: peak and retained
(after the phase, once its requests are answered and the model worker has trimmed) over the start (after a warm-up
request), statuses, and what /metrics accounts for (the prefix cache and the host caches, in bytes); and for phase
2, the forward memory the server estimated (`runtime/budget.py`) beside the model process's measured peak. Ends with
one JSON line; the JSON goes to results/hostile/DATE[-label].json.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx
import psutil

from benchmarks.harness import add_output_arguments, output_path, served, table_head, table_row, write_report
from typedlm.core.errors import LimitExceeded
from typedlm.core.questions import parse_request
from typedlm.decide.decider import Decider
from typedlm.hosting.heap import IDLE_TRIM_S

NAME_CHARS = 30_000
WORDS = [
    "the",
    "parcel",
    "never",
    "arrived",
    "and",
    "I",
    "want",
    "my",
    "money",
    "back",
    "today",
    "because",
    "the",
    "order",
    "was",
    "charged",
    "twice",
]


class Sampler:
    """The resident memory of a server and its children (the model process), sampled on a thread of its own."""

    def __init__(self, pid: int, every_s: float = 0.01):
        self.server = psutil.Process(pid)
        self.every_s = every_s
        self.peak = {"http": 0, "model": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> dict[str, int]:
        children = self.server.children(recursive=True)
        model = max((child.memory_info().rss for child in children), default=0)  # the model process is the largest
        return {"http": self.server.memory_info().rss, "model": model}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for part, value in self.now().items():
                    self.peak[part] = max(self.peak[part], value)
            except psutil.Error:
                pass
            time.sleep(self.every_s)

    def reset(self) -> None:
        self.peak = self.now()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()


def text(words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 31 + k * 7 + k * k) % len(WORDS)] for k in range(words))


def long_name_body(i: int) -> dict:
    names = [" ".join(f"n{i}w{j}" for j in range(NAME_CHARS // 5))[:NAME_CHARS] for _ in range(2)]
    names[1] = "other " + names[1][6:]
    return {"state": "A short note.", "questions": {"q": {"type": "choice", "criteria": dict.fromkeys(names)}}}


SHAPES = {
    "long document": lambda n: {"state": text(n, 1), "questions": {"q": {"type": "noul"}}},
    "many questions": lambda n: {
        "state": text(200, 2),
        "questions": {f"q{i}": {"type": "noul", "instructions": f"Is it about item {i}?"} for i in range(n)},
    },
    "255 options, order reads": lambda n: {
        "state": text(200, 3),
        "questions": {"q": {"type": "choice", "criteria": {f"option number {i}": None for i in range(255)}}},
        "x_order_reads": n,
    },
    "one long question among short ones": lambda n: {
        "state": text(200, 4),
        "questions": {
            "big": {"type": "choice", "criteria": {f"option number {i}": None for i in range(120)}},
            **{f"q{i}": {"type": "noul", "instructions": f"Is it about item {i}?"} for i in range(n)},
        },
    },
}
SHAPE_RANGE = {"long document": 20_000, "many questions": 4_000, "255 options, order reads": 8}
SHAPE_RANGE["one long question among short ones"] = 3_000


def admitted(decider: Decider, body: dict) -> tuple[bool, int]:
    """Whether the server's limits admit `body` (no model work), and the forward memory estimated for it."""
    request = parse_request(body)
    try:
        prepared = decider.prepare_request(request.state, request.questions, None, request.order_reads).reads
    except LimitExceeded:
        return False, 0
    return True, decider.engine.budget.bytes(len(prepared.prompt.prefix_ids), [item.rows for item in prepared.items])


def largest(decider: Decider, shape: str) -> tuple[int, dict, int]:
    """The largest n the limits admit for `shape` (bisection), its body and its forward memory estimate."""
    lo, hi = 1, SHAPE_RANGE[shape]
    assert admitted(decider, SHAPES[shape](lo))[0], f"{shape}: even n = 1 is refused"
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if admitted(decider, SHAPES[shape](mid))[0] else (lo, mid - 1)
    return lo, SHAPES[shape](lo), admitted(decider, SHAPES[shape](lo))[1]


def accounted(url: str) -> dict[str, float]:
    """What /metrics accounts for: the prefix cache's and the host caches' bytes, and the processes' memory."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"prefix_cache_bytes": 0.0, "host_cache_bytes": 0.0}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name == "typedlm_prefix_cache_bytes":
                out["prefix_cache_bytes"] = sample.value
            elif sample.name == "typedlm_cache_bytes":
                out["host_cache_bytes"] += sample.value
            elif sample.name in ("typedlm_process_resident_bytes", "process_resident_memory_bytes"):
                out[sample.name] = sample.value
    return out


def stall(url: str, declared: int, sent: int, deadline_s: float) -> str:
    """A head declaring `declared` body bytes, `sent` of them, then nothing: how the server answered, and when."""
    parsed = urlparse(url)
    started = time.perf_counter()
    with socket.create_connection((parsed.hostname, parsed.port), timeout=deadline_s) as sock:
        head = (
            f"POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {declared}\r\n\r\n"
        )
        sock.sendall(head.encode() + b" " * sent)
        try:
            reply = sock.recv(65536)
        except TimeoutError:
            return "still open"
    seconds = time.perf_counter() - started
    status = reply.split(b" ", 2)[1].decode() if reply.startswith(b"HTTP/1.1 ") else "closed"
    return f"{status} after {seconds:.0f} s"


def post_all(url: str, bodies: list[dict]) -> list[int | str]:
    def post(body: dict) -> int | str:
        try:
            return httpx.post(url + "/v1/systemone", json=body, timeout=900).status_code
        except httpx.HTTPError as exc:
            return type(exc).__name__

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--names", type=int, default=10, help="requests with distinct long option names")
    parser.add_argument("--concurrent", type=int, default=4, help="largest requests of a shape sent at once")
    parser.add_argument("--stalled", type=int, default=100, help="connections stalling their bodies")
    parser.add_argument("--body-timeout", type=float, default=30.0)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    add_output_arguments(parser, "hostile")
    args = parser.parse_args()

    decider = Decider.load(args.model, prefix_cache_bytes=0)  # the same limits as the server's, for the shapes
    largest_bodies = {shape: largest(decider, shape) for shape in args.shapes}
    del decider
    options = ["--body-timeout", str(args.body_timeout), "--max-queue", str(4 * args.concurrent + args.stalled)]
    result: dict = {"benchmark": "hostile", "date": time.strftime("%Y-%m-%d"), "model": args.model or "embedded"}
    with (
        served(*options, *(["--model", args.model] if args.model else [])) as (url, server),
        Sampler(server.pid) as sampler,
    ):
        httpx.post(url + "/v1/systemone", json=SHAPES["many questions"](2), timeout=300)  # warm-up
        time.sleep(IDLE_TRIM_S + 1)  # the warm-up trimmed
        start = sampler.now()
        result["start_mb"] = {part: round(value / 2**20) for part, value in start.items()}
        phases = []

        def phase(name: str, run) -> None:
            sampler.reset()
            started = time.perf_counter()
            outcome = run()
            time.sleep(IDLE_TRIM_S + 1)  # what is freed once the phase's requests are answered (the worker trims)
            after = sampler.now()
            row = {
                "phase": name,
                "seconds": round(time.perf_counter() - started, 1),
                **{f"peak_{part}_mb": round((sampler.peak[part] - start[part]) / 2**20) for part in start},
                **{f"retained_{part}_mb": round((after[part] - start[part]) / 2**20) for part in start},
                **{key: round(value / 2**20, 1) for key, value in accounted(url).items()},
                "outcome": outcome,
            }
            phases.append(row)
            print(json.dumps(row), flush=True)

        phase("long names", lambda: post_all(url, [long_name_body(i) for i in range(args.names)]))
        for shape, (n, body, estimate) in largest_bodies.items():
            phase(
                f"largest admitted: {shape} (n = {n}, estimated {estimate / 2**20:.0f} MiB) x {args.concurrent}",
                lambda body=body: post_all(url, [body] * args.concurrent),
            )

        def stalled() -> dict:
            with ThreadPoolExecutor(args.stalled + len(largest_bodies)) as pool:
                stalls = [
                    pool.submit(stall, url, 8 << 20, 1 << 20, args.body_timeout + 30) for _ in range(args.stalled)
                ]
                requests = [pool.submit(post_all, url, [body]) for _, body, _ in largest_bodies.values()]
                answers = [future.result() for future in stalls]
                statuses = [future.result()[0] for future in requests]
            return {"stalled": sorted({a: answers.count(a) for a in answers}.items()), "requests": statuses}

        phase(f"{args.stalled} stalled bodies beside the largest requests", stalled)
        result["phases"] = phases
        result["limits"] = {shape: n for shape, (n, _, _) in largest_bodies.items()}
    columns = ("phase", "s", "peak model MB", "retained model MB", "peak HTTP MB", "retained HTTP MB", "caches MB")
    print("\n" + table_head(columns, "lrrrrrr"))
    for row in phases:
        caches = row["prefix_cache_bytes"] + row["host_cache_bytes"]
        parts = ("seconds", "peak_model_mb", "retained_model_mb", "peak_http_mb", "retained_http_mb")
        print(table_row((row["phase"], *(row[part] for part in parts), f"{caches:.0f}")))
    write_report(result, output_path(args, "hostile"))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
