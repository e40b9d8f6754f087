"""HTTP load for throughput.py's `http` rows, in a process of its own (so the clients' Python does not share the
server's interpreter lock): C clients sending requests back to back over one httpx connection pool.

Protocol, one JSON line each way: reads {"url", "questions" (the wire questions), "clients", "warmup" and
"requests" (per client), "documents" (one per request, warm-up first)} on stdin; sends each client's warm-up
requests, writes "ready", waits for a "go" line, sends the measured requests and writes {"latencies": seconds per
request, "end": time.monotonic() after the last}. The clock is the machine's monotonic one, the same in every
process, so the parent times the cell from its "go" to the last process's end.

    python benchmarks/http_clients.py < job.json      # run by the benchmarks, not by hand

The benchmarks' side is here too: `served` runs the real server in a thread as `typedlm serve` runs it, and
`ClientProcesses` starts one such process per job and steps them through the protocol together.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


@contextmanager
def served(app) -> Iterator[tuple[str, threading.Thread]]:
    """The app on a loopback port (uvicorn with the bounded protocol and no access log, as `typedlm serve`
    runs it) in a thread of this process, until the block ends: its URL and the server's thread."""
    import uvicorn

    from typedlm.server.protocol import bounded_protocol

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", access_log=False, http=bounded_protocol()
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", thread
    finally:
        server.should_exit = True
        thread.join(timeout=60)


class ClientProcesses:
    """One client process per job (see the module), killed on `close`: `ready` waits for every warm-up, `go`
    starts the measured requests and returns the monotonic time it did, `results` waits for each process's."""

    def __init__(self, jobs: list[dict]):
        self.processes: list[subprocess.Popen] = []
        try:
            for job in jobs:
                process = subprocess.Popen(
                    [sys.executable, str(Path(__file__))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
                self.processes.append(process)
                self._say(process, json.dumps(job))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _say(process: subprocess.Popen, line: str) -> None:
        process.stdin.write(line + "\n")
        process.stdin.flush()

    def ready(self) -> None:
        for process in self.processes:
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError("an HTTP client process failed in its warm-up")

    def go(self) -> float:
        started = time.monotonic()
        for process in self.processes:
            self._say(process, "go")
        return started

    def results(self) -> list[dict]:
        return [json.loads(process.stdout.readline()) for process in self.processes]

    def close(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


def main() -> None:
    asyncio.run(_load(json.loads(sys.stdin.readline())))


if __name__ == "__main__":
    main()
