"""What the benchmarks share: their options, the models they load, the documents and questions they send, the real
server they measure from outside, and how they report.

A benchmark is a module of this package run from the repository root, `python -m benchmarks.NAME [options]`; it
prints a table (or a line per cell) and ends with one JSON line. One that keeps its results writes them to
`benchmarks/results/NAME/DATE[-label].json` (`result_path`), a plot beside it as a PNG: the label is the device's
kind (cpu, cuda) where the benchmark takes --device, then --label where given; --out names another file.

- options: `add_model_arguments`, `add_output_arguments`
- models: `load_benchmark_model`, `random_qwen3_06b`, `tiny_qwen3`, `embedded_tokenizer_dir`, `saved_for_serving`
- inputs: `make_state` (a document of about P tokens), `Documents` (new ones), `make_questions`, `wire`,
  `example_request`
- the served path: `served` (a real `typedlm serve` process), `served_app` (an app on uvicorn in a thread of this
  process), `ClientProcesses` (HTTP clients in processes of their own, `benchmarks/http_clients.py`)
- the report: `report_head`, `host_cpu`, `device_kind`, `result_path`, `output_path`, `write_report`, `table_head`,
  `table_row`, `pyplot`

Nothing here imports torch until a function needs it: the benchmarks that measure a server from outside stay light.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from typedlm.core.questions import NoulQuestion
from typedlm.runtime.models import LoadedModel, converted_gguf, embedded_gguf_path, load_model

if TYPE_CHECKING:
    from typedlm.decide.decider import Decider
    from typedlm.text.prompt import ChatLayout

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
EXAMPLE_REQUEST = ROOT / "examples" / "request.json"  # the README's request
READY_ATTEMPTS = 600  # /health polls (up to ~1.5 s each) while a served model loads
TOPICS = [
    "a refund", "a late delivery", "a broken screen", "a discount code", "the warranty", "a second charge",
    "a change of address", "the invoice date", "a cancelled order", "a missing item", "gift wrapping",
    "a loyalty card", "the return label", "a password reset", "an email from support", "the courier",
    "a damaged box", "the colour of the case", "a price match", "a bank transfer", "the tracking number",
    "a store visit", "an angry tone", "a phone call", "a manager", "the battery life", "express shipping",
    "a subscription", "a coupon", "the size chart", "customs fees", "a replacement unit",
]  # fmt: skip


# ---------------------------------------------------------------- options


def add_model_arguments(parser: argparse.ArgumentParser, device: str | None = "cpu", dtype: str | None = None) -> None:
    """The model options: a model (default the embedded one) or random weights in Qwen3-0.6B's shape over a
    tokenizer; --device (default `device`; none where `device` is None: the benchmark's device is fixed) and --dtype
    (default `dtype`, else bfloat16 on CUDA and float32 elsewhere)."""
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument(
        "--random-qwen3-0.6b", dest="random_qwen3_06b", action="store_true", help="random weights, Qwen3-0.6B shape"
    )
    parser.add_argument(
        "--tokenizer", default=None, help="tokenizer dir for --random-qwen3-0.6b (default: the embedded model's)"
    )
    if device is not None:
        parser.add_argument("--device", default=device)
    parser.add_argument("--dtype", default=dtype)


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--out (a file of one's own) and --label (what follows the date in the default file's name)."""
    parser.add_argument("--out", default=None, help=f"JSON path (default: benchmarks/results/{name}/DATE[-label].json)")
    parser.add_argument("--label", default=None, help="the default path's label, after the device's kind if any")


# ---------------------------------------------------------------- models


def default_dtype(device: str) -> str:
    return "bfloat16" if device.startswith("cuda") else "float32"


def embedded_tokenizer_dir() -> Path:
    """The embedded model's Hugging Face directory (its GGUF converted once), for its tokenizer."""
    return converted_gguf(embedded_gguf_path())


def random_qwen3_06b(tokenizer_dir: Path, device: str, dtype: str) -> LoadedModel:
    """Qwen3-0.6B's shape (28 layers, d 1024, 16 Q / 8 KV heads, vocab 151936) with random weights (seed 0)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    config = Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype, attn_implementation="sdpa").to(device).eval()
    return LoadedModel(model, AutoTokenizer.from_pretrained(tokenizer_dir), "random-qwen3-0.6b-shape")


def tiny_qwen3() -> LoadedModel:
    """A 2-layer random Qwen3 over the embedded model's tokenizer: the forward costs little, the host work is real."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
    return LoadedModel(model, tokenizer, "tiny-qwen3")


def load_benchmark_model(args: argparse.Namespace, device: str | None = None) -> tuple[LoadedModel, str]:
    """The model `add_model_arguments`' options name on `device` (default --device), and its dtype."""
    device = device or args.device
    dtype = args.dtype or default_dtype(device)
    if args.random_qwen3_06b:
        tokenizer_dir = Path(args.tokenizer) if args.tokenizer else embedded_tokenizer_dir()
        return random_qwen3_06b(tokenizer_dir, device, dtype), dtype
    return load_model(args.model, device, dtype), dtype


def saved_for_serving(args: argparse.Namespace, folder: str) -> str:
    """What a benchmark's `typedlm serve` loads: --model where given, else the model `add_model_arguments`' options
    name (random weights or the tiny Qwen3) saved into `folder`, so that the server loads the same weights."""
    if args.model is not None:
        return args.model
    loaded = load_benchmark_model(args)[0] if args.random_qwen3_06b else tiny_qwen3()
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------- inputs


def make_state(layout: ChatLayout, prefix_tokens: int, variant: int = 0) -> str:
    """A support-ticket thread whose system prompt + document has about `prefix_tokens` tokens (before the question
    opening, which the prefix also holds); `variant` gives another thread of the same size."""
    lines = []
    i = 0
    while True:
        topic = TOPICS[(i + variant) % len(TOPICS)]
        lines.append(f"Message {i}: the customer writes about {topic} and order {1000 + i + 97 * variant}.")
        state = "\n".join(lines)
        # the document as before the question opening joined the prefix (the same requests as earlier results)
        if len(layout.encode(layout.document_text(state))) >= prefix_tokens:
            return state
        i += 1


class Documents:
    """New documents of about the same length: one base text, each copy opened by its own ticket line."""

    def __init__(self, layout: ChatLayout, prefix_tokens: int):
        self.base = make_state(layout, prefix_tokens - 8)
        self.count = 0

    def next(self) -> str:
        self.count += 1
        return f"Ticket {self.count} (ref. {self.count * 7919 % 100003}).\n{self.base}"


def make_questions(n: int) -> dict[str, NoulQuestion]:
    """`n` yes/no questions, q0 to q{n-1}, each about one topic of the thread."""
    return {
        f"q{i}": NoulQuestion(f"Does the customer, anywhere in this thread, mention {TOPICS[i % len(TOPICS)]} at all?")
        for i in range(n)
    }


def wire(questions: dict[str, NoulQuestion]) -> dict[str, dict]:
    """The questions as a /v1/systemone body holds them."""
    return {qid: {"type": "noul", "instructions": q.instructions} for qid, q in questions.items()}


def example_request() -> dict:
    """The README's request (examples/request.json), as its body."""
    return json.loads(EXAMPLE_REQUEST.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- the served path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(*options: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`typedlm serve OPTIONS` in its own process on a free port (`env`: its environment, default this process's):
    (its URL, its process), ready once /health answers (a server that exits first raises); stopped with SIGTERM on
    the way out (in-flight requests finish), then killed if it has not stopped within a minute.

        with served("--prefix-cache-mb", "1024") as (url, process):
            httpx.post(url + "/v1/systemone", json=body)
    """
    port = free_port()
    command = [sys.executable, "-m", "typedlm.cli", "serve", "--port", str(port), *options]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
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


@contextmanager
def served_app(app) -> Iterator[tuple[str, threading.Thread]]:
    """The app on a loopback port (uvicorn with the bounded protocol and no access log, as `typedlm serve` runs it)
    in a thread of this process, until the block ends: its URL and the server's thread."""
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
    """One HTTP client process per job (`python -m benchmarks.http_clients`, its protocol in that module), killed on
    `close`: `ready` waits for every warm-up, `go` starts the measured requests and returns the monotonic time it
    did, `results` waits for each process's."""

    def __init__(self, jobs: list[dict]):
        self.processes: list[subprocess.Popen] = []
        try:
            for job in jobs:
                process = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.http_clients"],
                    cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
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


# ---------------------------------------------------------------- the report


def device_kind(device: str) -> str:
    """A device's kind ("cuda" for "cuda:1"): what a default results file is labelled with."""
    return device.split(":")[0]


def host_cpu() -> dict:
    """The CPU this process runs on, and how loaded the machine was before the run."""
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return {
        "cpu": names[0] if names else platform.processor(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_1m": os.getloadavg()[0],
    }


def report_head(benchmark: str, decider: Decider, device: str, dtype: str) -> dict:
    """What a report opens with: the benchmark, model, device (the GPU's name on CUDA), dtype, torch and date."""
    import torch

    return {
        "benchmark": benchmark,
        "model": decider.name,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "dtype": dtype,
        "torch": torch.__version__,
        "date": date.today().isoformat(),
    }


def result_path(name: str, *label: str | None, suffix: str = ".json") -> Path:
    """benchmarks/results/NAME/DATE[-label].json, today's date and the parts of the label that are given."""
    return RESULTS / name / ("-".join([date.today().isoformat(), *(part for part in label if part)]) + suffix)


def output_path(args: argparse.Namespace, name: str, *label: str | None) -> Path:
    """--out where given, else `result_path` with `label` (the device's kind, where the benchmark takes one), then
    --label."""
    return Path(args.out) if args.out else result_path(name, *label, args.label)


def write_report(report: dict, path: Path) -> Path:
    """`report` as indented JSON at `path` (its folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return path


def table_head(columns: Sequence[str], aligns: str) -> str:
    """A Markdown table's head: the columns, then each one's alignment (`aligns`, "l" or "r" per column)."""
    rule = "|".join("---:" if align == "r" else "---" for align in aligns)
    return f"| {' | '.join(columns)} |\n|{rule}|"


def table_row(cells: Iterable[object]) -> str:
    return f"| {' | '.join(str(cell) for cell in cells)} |"


def pyplot():
    """matplotlib's pyplot drawing to files (Agg), or None with a note on stderr where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    return plt
