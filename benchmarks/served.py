"""A real `typedlm serve` in its own process, for the benchmarks that measure the server from outside.

    with served("--prefix-cache-mb", "1024") as (url, process):
        httpx.post(url + "/v1/systemone", json=body)

It listens on a free port, is ready once /health answers (a server that exits first raises), and is stopped
with SIGTERM on the way out (in-flight requests finish), then killed if it has not stopped within a minute.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

READY_ATTEMPTS = 600  # /health polls (up to ~1.5 s each) while the model loads


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(*options: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`typedlm serve OPTIONS` on a free port: (its URL, its process), ready to answer."""
    port = free_port()
    command = [sys.executable, "-m", "typedlm.cli", "serve", "--port", str(port), *options]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(READY_ATTEMPTS):
            if server.poll() is not None:
                raise RuntimeError(f"typedlm serve exited with {server.returncode}: {' '.join(command)}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url, server
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
