"""Soak: many requests over many distinct documents against a real `typedlm serve`, its memory sampled.

    python -m benchmarks.soak --requests 100000 --documents 5000 --clients 4 [--model M] [--out FILE]

The server runs as its own process (the embedded model by default, prefix cache on); `--clients` threads send
/v1/systemone requests whose documents cycle through `--documents` distinct texts (so the prefix cache fills,
evicts and hits), with a bad request (deep nesting, a lone surrogate, an oversized state) every 50th. The
RSS (from /proc) of the HTTP process and of the model's process is sampled every `--sample-every` requests,
with what /metrics accounts for (the prefix cache's and the host caches' bytes). Prints the curve as a table
and ends with one JSON line: requests, statuses by code, 5xx count, connection errors, RSS at 10% and at the
end, their ratio; the model process's growth from its first sample, against the growth of what /metrics
accounts for. The JSON, the curve included, goes to results/soak/DATE[-label].json.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import add_output_arguments, output_path, served, write_report

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this message about billing?"},
    "tone": {"type": "choice", "criteria": {"angry": "upset", "calm": None, "excited": None}},
    "urgency": {"type": "score", "criteria": ["can wait", "this week", "today"]},
}
WORDS = [
    "order",
    "parcel",
    "refund",
    "invoice",
    "charged",
    "twice",
    "delayed",
    "account",
    "password",
    "login",
    "shipping",
    "tracking",
    "broken",
]
BAD = (
    b'{"state": ' + b"[" * 2000 + b"]" * 2000 + b', "questions": {"q": {"type": "noul"}}}',
    b'{"state": "hi \\ud800", "questions": {"q": {"type": "noul"}}}',
    json.dumps({"state": "word " * 400_000, "questions": {"q": {"type": "noul"}}}).encode(),
)


def document(i: int) -> str:
    """A distinct, deterministic customer message of 40-120 words."""
    words = [WORDS[(i * 7 + k * 13 + k * k) % len(WORDS)] for k in range(40 + i % 80)]
    return f"Ticket {i}: " + " ".join(words) + "."


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def model_rss_mb(pid: int) -> float:
    """The model process's RSS: the server's largest child (0 with the model in the server's own process)."""
    children = psutil.Process(pid).children(recursive=True)
    return max((child.memory_info().rss for child in children), default=0) / 2**20


def accounted_mb(url: str) -> float:
    """What /metrics accounts for, in MB: the prefix cache's bytes and every host cache's."""
    families = text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text)
    names = ("typedlm_prefix_cache_bytes", "typedlm_cache_bytes")
    return sum(s.value for family in families for s in family.samples if s.name in names) / 2**20


def sample(url: str, pid: int, done: int, started: float) -> dict[str, float]:
    return {
        "requests": done,
        "rss_mb": rss_mb(pid),
        "model_rss_mb": model_rss_mb(pid),
        "accounted_mb": accounted_mb(url),
        "seconds": time.perf_counter() - started,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--documents", type=int, default=5_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sample-every", type=int, default=1_000)
    parser.add_argument("--model", default=None)
    parser.add_argument("--prefix-cache-mb", type=int, default=1024)
    add_output_arguments(parser, "soak")
    args = parser.parse_args()
    options = ["--prefix-cache-mb", str(args.prefix_cache_mb), "--max-queue", str(4 * args.clients)]
    with served(*options, *(["--model", args.model] if args.model else [])) as (url, server):
        statuses: collections.Counter[int] = collections.Counter()
        errors = 0
        counter = itertools.count()
        lock = threading.Lock()
        started = time.perf_counter()
        curve: list[dict[str, float]] = [sample(url, server.pid, 0, started)]

        def client() -> None:
            nonlocal errors
            with httpx.Client(base_url=url, timeout=120) as http:
                while (n := next(counter)) < args.requests:
                    try:
                        if n % 50 == 49:
                            resp = http.post(
                                "/v1/systemone",
                                content=BAD[n // 50 % len(BAD)],
                                headers={"content-type": "application/json"},
                            )
                        else:
                            body = {"state": document(n % args.documents), "questions": QUESTIONS}
                            resp = http.post("/v1/systemone", json=body)
                        code = resp.status_code
                    except httpx.HTTPError:
                        code = None
                    with lock:
                        if code is None:
                            errors += 1
                        else:
                            statuses[code] += 1
                        done = sum(statuses.values()) + errors
                        if done % args.sample_every == 0:
                            point = sample(url, server.pid, done, started)
                            curve.append(point)
                            print(
                                f"{done:>8} requests  HTTP {point['rss_mb']:8.1f} MB  model "
                                f"{point['model_rss_mb']:8.1f} MB  accounted {point['accounted_mb']:8.1f} MB  "
                                f"{point['seconds']:8.1f} s",
                                flush=True,
                            )

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        curve.append(sample(url, server.pid, args.requests, started))
        tenth = min(curve, key=lambda point: abs(point["requests"] - args.requests / 10))
        result = {
            "benchmark": "soak",
            "date": time.strftime("%Y-%m-%d"),
            "model": args.model or "embedded",
            "requests": args.requests,
            "documents": args.documents,
            "clients": args.clients,
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "server_errors": sum(v for k, v in statuses.items() if k >= 500),
            "connection_errors": errors,
            "rss_mb_at_10pct": tenth["rss_mb"],
            "rss_mb_at_end": curve[-1]["rss_mb"],
            "rss_ratio_end_vs_10pct": curve[-1]["rss_mb"] / tenth["rss_mb"],
            "model_rss_growth_mb": curve[-1]["model_rss_mb"] - curve[0]["model_rss_mb"],
            "accounted_growth_mb": curve[-1]["accounted_mb"] - curve[0]["accounted_mb"],
            "requests_per_s": args.requests / curve[-1]["seconds"],
            "curve": curve,
        }
        write_report(result, output_path(args, "soak"))
        print(json.dumps({k: v for k, v in result.items() if k != "curve"}))
        return 0 if result["server_errors"] == 0 and errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
