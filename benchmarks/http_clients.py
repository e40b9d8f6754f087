"""HTTP load in a process of its own (so that the clients' Python does not share the server's interpreter lock): C
clients sending requests back to back over one httpx connection pool. `harness.ClientProcesses` starts one such
process per job and steps them through the protocol together (throughput's `http` rows, server_overhead).

Protocol, one JSON line each way: reads {"url", "questions" (the wire questions), "clients", "warmup" and
"requests" (per client), "documents" (one per request, warm-up first)} on stdin; sends each client's warm-up
requests, writes "ready", waits for a "go" line, sends the measured requests and writes {"latencies": seconds per
request, "end": time.monotonic() after the last}. The clock is the machine's monotonic one, the same in every
process, so the parent times the cell from its "go" to the last process's end.

    python -m benchmarks.http_clients < job.json      # run by the benchmarks, not by hand
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx


async def _load(job: dict) -> None:
    clients, documents = job["clients"], iter(job["documents"])
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=job["url"], timeout=600, limits=limits) as client:

        async def ask() -> float:
            started = time.monotonic()
            reply = await client.post("/v1/systemone", json={"state": next(documents), "questions": job["questions"]})
            if reply.status_code != 200:
                raise RuntimeError(f"HTTP {reply.status_code}: {reply.text}")
            return time.monotonic() - started

        async def each_client(count: int, latencies: list[float]) -> None:
            for _ in range(count):
                latencies.append(await ask())

        await asyncio.gather(*(each_client(job["warmup"], []) for _ in range(clients)))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
        latencies: list[float] = []
        await asyncio.gather(*(each_client(job["requests"], latencies) for _ in range(clients)))
        print(json.dumps({"latencies": latencies, "end": time.monotonic()}), flush=True)


def main() -> None:
    asyncio.run(_load(json.loads(sys.stdin.readline())))


if __name__ == "__main__":
    main()
