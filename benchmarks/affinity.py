"""Document-affinity routing against random routing, on Ray Serve replicas, in one run.

    python -m benchmarks.affinity [--documents 20] [--visits 5] [--replicas 2] [--seed 0] [--out FILE.json]
    python -m benchmarks.affinity --url http://127.0.0.1:8000     # the workload against a running server

The workload: `--documents` short tickets, each asked `--visits` times (one noul question), in one shuffled order,
sent one at a time. Prefix-cache hits are read from /health before and after (summed over the replicas); each
document's first visit must miss, so the most hits possible are documents × (visits - 1). Without --url, two
applications run side by side on a local Ray, each with `--replicas` replicas of the embedded model: one routed by
document (`typedlm serve --replicas`'s default), one with the affinity off (every request to the least loaded
replica, ties at random: what Ray Serve's own router does for requests sent one at a time). Prints a table and
ends with one JSON line (also written to --out).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import free_port

QUESTION = {"broken": {"type": "noul", "instructions": "Does the customer say something stopped working?"}}
THINGS = ("printer", "router", "laptop", "phone", "scanner")


def workload(documents: int, visits: int, seed: int) -> list[str]:
    """Every document `visits` times, in one shuffled order."""
    texts = [
        f"Ticket {i}: the customer writes that the {THINGS[i % len(THINGS)]} stopped working after update {i}."
        for i in range(documents)
    ]
    order = [text for text in texts for _ in range(visits)]
    random.Random(seed).shuffle(order)
    return order


def _hits(health: dict[str, Any]) -> dict[str, int]:
    return {key: health["prefix_cache"][key] for key in ("hits", "partial_hits", "misses")}


def measure(url: str, documents: int = 20, visits: int = 5, seed: int = 0) -> dict[str, Any]:
    """Run the workload against `url`: the prefix-cache hits and misses it caused (summed over the replicas)."""
    order = workload(documents, visits, seed)
    with httpx.Client(base_url=url, timeout=300) as client:
        before = _hits(client.get("/health").json())
        started = time.perf_counter()
        for state in order:
            response = client.post("/v1/systemone", json={"state": state, "questions": QUESTION})
            response.raise_for_status()
        seconds = time.perf_counter() - started
        after = client.get("/health").json()
    counts = {key: value - before[key] for key, value in _hits(after).items()}
    return {
        "requests": len(order),
        "possible_hits": documents * (visits - 1),
        **counts,
        "replicas": len(after.get("replicas", [])) or 1,
        "seconds": round(seconds, 2),
    }


def side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from typedlm.replicas.app import ReplicaArgs, build_app

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING"})
        results = {}
        for name, affinity in (("affinity", True), ("random", False)):
            options = ReplicaArgs(replicas=args.replicas, cpus_per_replica=0.5, affinity=affinity)
            serve.run(build_app(options), name=name, route_prefix=f"/{name}")
        for name in ("affinity", "random"):
            results[name] = measure(f"http://127.0.0.1:{port}/{name}", args.documents, args.visits, args.seed)
        return results
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--visits", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", default=None, help="measure a running server instead")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = {"server": measure(args.url, args.documents, args.visits, args.seed)} if args.url else side_by_side(args)
    print(f"{args.documents} documents x {args.visits} visits, shuffled (seed {args.seed})", file=sys.stderr)
    print(f"  {'routing':<10} {'hits':>6} {'of':>4} {'misses':>7} {'replicas':>9} {'seconds':>8}", file=sys.stderr)
    for name, r in results.items():
        misses = r["misses"] + r["partial_hits"]  # a partial hit reused only the system prompt: the document missed
        print(
            f"  {name:<10} {r['hits']:>6} {r['possible_hits']:>4} {misses:>7} {r['replicas']:>9} {r['seconds']:>8}",
            file=sys.stderr,
        )
    report = {"benchmark": "affinity", "documents": args.documents, "visits": args.visits, "seed": args.seed, **results}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
