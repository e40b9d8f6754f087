"""A new machine's first answers: `typedlm serve` started with every kernel cache empty, its first two requests.

    python -m benchmarks.first_request --device cuda --random-qwen3-0.6b --tokenizer DIR [--starts 2]

On CUDA a forward of a batch shape not seen before captures a graph (tens of ms), and on a machine that has not run
typedlm before the Triton kernels are compiled (seconds each; the cascade kernel once per model, as it loads). Each
start here is a new server process whose Triton, CUDA and Inductor caches are new empty folders; per start: the
seconds until /health answers (the model loaded), then the first client's request and the second, each a new
document of P ≈ --prefix-tokens tokens with --questions yes/no questions, in ms, then --together such requests sent
at once (answered by forwards of several documents: the slowest one's ms), and how many kernels Triton had compiled
after each step (a step that compiles one waits seconds for it). Prints a table and writes JSON
(results/first_request/DATE-KIND.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from transformers import AutoTokenizer

from benchmarks.harness import (
    Documents,
    add_model_arguments,
    add_output_arguments,
    default_dtype,
    device_kind,
    host_cpu,
    make_questions,
    output_path,
    saved_for_serving,
    served,
    table_head,
    table_row,
    wire,
    write_report,
)
from typedlm.runtime.models import resolve
from typedlm.text.prompt import ChatLayout

KERNEL_CACHES = ("TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR")


def kernels(folder: Path) -> int:
    """Kernels compiled into a Triton cache so far (one file per kernel and specialisation)."""
    return sum(1 for _ in folder.rglob("*.cubin"))


def one_start(model: str, options: list[str], documents: Documents, questions: int, together: int) -> dict:
    """A server started with empty kernel caches: seconds to ready, its first two requests' ms, then `together`
    requests sent at once (the first forwards of several documents), the slowest one's ms; the kernels Triton had
    compiled after each step."""
    with tempfile.TemporaryDirectory() as caches:
        env = {**os.environ, **{name: str(Path(caches) / name.lower()) for name in KERNEL_CACHES}}
        triton_cache = Path(env["TRITON_CACHE_DIR"])
        started = time.perf_counter()
        with served("--model", model, *options, env=env) as (url, _server):
            row: dict = {"ready_s": time.perf_counter() - started, "kernels_ready": kernels(triton_cache)}
            with httpx.Client(base_url=url, timeout=600) as client:

                def send(state: str) -> float:
                    body = {"state": state, "questions": wire(make_questions(questions))}
                    sent = time.perf_counter()
                    response = client.post("/v1/systemone", json=body)
                    assert response.status_code == 200, response.text
                    return 1e3 * (time.perf_counter() - sent)

                for step in ("first", "second"):
                    row[f"{step}_ms"] = send(documents.next())
                    row[f"kernels_{step}"] = kernels(triton_cache)
                states = [documents.next() for _ in range(together)]
                with ThreadPoolExecutor(together) as pool:
                    row["together_ms"] = max(pool.map(send, states))
                row["kernels_together"] = kernels(triton_cache)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, device="cuda")
    parser.add_argument("--starts", type=int, default=2, help="server starts")
    parser.add_argument("--together", type=int, default=8, help="requests sent at once after the first two")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    add_output_arguments(parser, "first_request")
    args = parser.parse_args()
    dtype = args.dtype or default_dtype(args.device)
    with tempfile.TemporaryDirectory() as folder:
        model = saved_for_serving(args, folder)
        # the tokenizer alone, from where the server loads the model (its weights stay unread here)
        documents = Documents(ChatLayout(AutoTokenizer.from_pretrained(resolve(model)[0])), args.prefix_tokens)
        options = ["--device", args.device, "--dtype", dtype, "--calibration", "raw", "--feedback-db", "none"]
        starts = []
        columns = ("start", "ready s", "first ms", "second ms", f"{args.together} at once ms", "kernels compiled")
        print(table_head(columns, "lrrrrl"))
        for start in range(args.starts):
            row = one_start(model, options, documents, args.questions, args.together)
            starts.append(row)
            compiled = " → ".join(str(row[f"kernels_{step}"]) for step in ("ready", "first", "second", "together"))
            cells = [f"{row[key]:.1f}" for key in ("ready_s", "first_ms", "second_ms", "together_ms")]
            print(table_row([start, *cells, compiled]))
    keys = ("ready_s", "first_ms", "second_ms", "together_ms")
    medians = {key: statistics.median(row[key] for row in starts) for key in keys}
    report = {
        "benchmark": "first_request", "device": args.device, "dtype": dtype, "date": time.strftime("%Y-%m-%d"),
        "model": args.model or ("random-qwen3-0.6b-shape" if args.random_qwen3_06b else "tiny-qwen3"),
        **host_cpu(), "questions": args.questions, "prefix_tokens": args.prefix_tokens, "starts": starts,
        "medians": medians,
    }  # fmt: skip
    print(f"wrote {write_report(report, output_path(args, 'first_request', device_kind(args.device)))}")


if __name__ == "__main__":
    main()
