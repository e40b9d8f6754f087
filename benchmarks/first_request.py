"""A new machine's first answers: `typedlm serve` started with every kernel cache empty, its first two requests.

    python -m benchmarks.first_request --device cuda --random-qwen3-0.6b --tokenizer DIR [--starts 2]

On CUDA a forward of a batch shape not seen before captures a graph (tens of ms), and on a machine that has not run
typedlm before the Triton kernels are compiled (seconds each; the cascade kernel once per model, as it loads). Each
start here is a new server process whose Triton, CUDA and Inductor caches are new empty folders; per start: the
seconds until /health answers (the model loaded), then the first client's request and the second, each a new
document of P ≈ --prefix-tokens tokens with --questions yes/no questions, in ms. Prints a table and writes JSON
(results/first_request/DATE-KIND.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.harness import (
    Documents,
    add_model_arguments,
    add_output_arguments,
    default_dtype,
    device_kind,
    host_cpu,
    load_benchmark_model,
    make_questions,
    output_path,
    served,
    table_head,
    table_row,
    tiny_qwen3,
    wire,
    write_report,
)
from typedlm.text.prompt import ChatLayout

KERNEL_CACHES = ("TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR")


def one_start(model: str, options: list[str], documents: Documents, questions: int) -> dict[str, float]:
    """A server started with empty kernel caches: seconds to ready, then its first two requests' ms."""
    with tempfile.TemporaryDirectory() as caches:
        env = {**os.environ, **{name: str(Path(caches) / name.lower()) for name in KERNEL_CACHES}}
        started = time.perf_counter()
        with served("--model", model, *options, env=env) as (url, _server):
            ready = time.perf_counter() - started
            times = []
            with httpx.Client(base_url=url, timeout=600) as client:
                for _ in range(2):
                    body = {"state": documents.next(), "questions": wire(make_questions(questions))}
                    sent = time.perf_counter()
                    response = client.post("/v1/systemone", json=body)
                    times.append(1e3 * (time.perf_counter() - sent))
                    assert response.status_code == 200, response.text
    return {"ready_s": ready, "first_ms": times[0], "second_ms": times[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, device="cuda")
    parser.add_argument("--starts", type=int, default=2, help="server starts per way")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    add_output_arguments(parser, "first_request")
    args = parser.parse_args()
    dtype = args.dtype or default_dtype(args.device)
    with tempfile.TemporaryDirectory() as folder:
        model = args.model
        if model is None:  # saved, for each server to load the same weights
            loaded = load_benchmark_model(args)[0] if args.random_qwen3_06b else tiny_qwen3()
            loaded.model.save_pretrained(folder)
            loaded.tokenizer.save_pretrained(folder)
            documents = Documents(ChatLayout(loaded.tokenizer), args.prefix_tokens)
            model = folder
            del loaded
        else:
            documents = Documents(ChatLayout(load_benchmark_model(args, "cpu")[0].tokenizer), args.prefix_tokens)
        options = ["--device", args.device, "--dtype", dtype, "--calibration", "raw", "--feedback-db", "none"]
        starts = []
        print(table_head(("start", "ready s", "first ms", "second ms"), "lrrr"))
        for start in range(args.starts):
            row = one_start(model, options, documents, args.questions)
            starts.append(row)
            print(table_row([start, f"{row['ready_s']:.1f}", f"{row['first_ms']:.1f}", f"{row['second_ms']:.1f}"]))
    medians = {key: statistics.median(row[key] for row in starts) for key in ("ready_s", "first_ms", "second_ms")}
    report = {
        "benchmark": "first_request", "device": args.device, "dtype": dtype, "date": time.strftime("%Y-%m-%d"),
        "model": args.model or ("random-qwen3-0.6b-shape" if args.random_qwen3_06b else "tiny-qwen3"),
        **host_cpu(), "questions": args.questions, "prefix_tokens": args.prefix_tokens, "starts": starts,
        "medians": medians,
    }  # fmt: skip
    print(f"wrote {write_report(report, output_path(args, 'first_request', device_kind(args.device)))}")


if __name__ == "__main__":
    main()
