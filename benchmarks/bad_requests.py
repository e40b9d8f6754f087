"""A small request's latency while maximal bad requests are being refused, against idle, side by side.

    python -m benchmarks.bad_requests [--repeats 20] [--model M]

One real `typedlm serve` (the embedded model by default). A client sends the README's small request
`--repeats` times alone (idle), then the same while another client keeps sending maximal bad requests: an
8 MiB state of new text (refused before tokenizing), 1,000-deep nesting, a lone surrogate, NaN levels. Each
phase alternates, so the machine's drift falls on both. Prints medians and the ratio; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx

from benchmarks.harness import example_request, served

SMALL = example_request()
LIMIT = 8 << 20
BAD = (
    json.dumps({"state": "new text " * (LIMIT // 9 - 100), "questions": {"q": {"type": "noul"}}}).encode(),
    b'{"state": ' + b"[" * 1000 + b"]" * 1000 + b', "questions": {"q": {"type": "noul"}}}',
    b'{"state": "hi \\ud800", "questions": {"q": {"type": "noul"}}}',
    b'{"state": "hi", "questions": {"q": {"type": "score", "criteria": [{"v": NaN}, "b"]}}}',
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    with served(*(["--model", args.model] if args.model else [])) as (url, _server):
        with httpx.Client(base_url=url, timeout=120) as client:
            client.post("/v1/systemone", json=SMALL)  # warm: the document is cached from here on
            idle, loaded, bad_statuses = [], [], []
            for _ in range(args.repeats):
                started = time.perf_counter()
                assert client.post("/v1/systemone", json=SMALL).status_code == 200
                idle.append(time.perf_counter() - started)
                stop = threading.Event()

                def attack(stop: threading.Event = stop) -> None:
                    with httpx.Client(base_url=url, timeout=120) as bad_client:
                        i = 0
                        while not stop.is_set():
                            headers = {"content-type": "application/json"}
                            resp = bad_client.post("/v1/systemone", content=BAD[i % len(BAD)], headers=headers)
                            bad_statuses.append(resp.status_code)
                            i += 1

                attacker = threading.Thread(target=attack)
                attacker.start()
                time.sleep(0.05)
                started = time.perf_counter()
                assert client.post("/v1/systemone", json=SMALL).status_code == 200
                loaded.append(time.perf_counter() - started)
                stop.set()
                attacker.join()
        result = {
            "benchmark": "bad_requests",
            "model": args.model or "embedded",
            "repeats": args.repeats,
            "idle_ms": 1000 * statistics.median(idle),
            "while_refusing_ms": 1000 * statistics.median(loaded),
            "ratio": statistics.median(loaded) / statistics.median(idle),
            "bad_requests": len(bad_statuses),
            "bad_statuses": {str(s): bad_statuses.count(s) for s in sorted(set(bad_statuses))},
        }
        print(
            f"small request, median of {args.repeats}: idle {result['idle_ms']:.1f} ms, while maximal bad requests "
            f"are refused {result['while_refusing_ms']:.1f} ms ({result['ratio']:.2f}x); bad requests answered "
            f"{result['bad_statuses']}"
        )
        print(json.dumps(result))
        return 0


if __name__ == "__main__":
    sys.exit(main())
