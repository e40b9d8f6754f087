"""What HTTP adds to a request: one client, the same bodies through `Decider.respond` in this process and through a
real `typedlm serve` in its own, taking turns request by request.

    python -m benchmarks.served_path                                  # a tiny random Qwen3: host work dominates
    python -m benchmarks.served_path --model DIR --serve-option=--no-model-process
    python -m benchmarks.served_path --device cuda --random-qwen3-0.6b --tokenizer DIR

Cells: Q = 1 and Q = 32 yes/no questions, each on a new document per request (P ≈ --prefix-tokens) and on one
document again (prefix cached). The server is started as a user starts it (the model in a process of its own
unless --serve-option says otherwise, `--calibration raw --feedback-db none` like the decider here); the client
keeps one connection open (`http.client`). Each path has its turn for --block requests in a row, after a pause
in which the other's threads go idle (an OpenMP worker that has just finished spins for a while, and on a machine
of few cores it would take a core from the other path's forward). Besides the medians, the server's own split of
each cell from its /metrics (means over the cell's requests, warm-up included): the wait for the model thread and
the forward (launch to answers, `typedlm_forward_seconds`); the rest of a served request is HTTP, the route, preparing
(tokenizing) and the hops between threads and processes. Ends with the JSON path (results/served_path/DATE.json).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from urllib.parse import urlparse

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
from typedlm.core.names import CalibrationMethod
from typedlm.decide.decider import Decider
from typedlm.text.prompt import ChatLayout

SETTLE_S = 0.1  # between blocks: longer than an idle OpenMP worker spins before it sleeps
SPLIT = ("typedlm_queue_wait_seconds", "typedlm_forward_seconds")  # the server's histograms of a request's time


def server_split(host: str, port: int) -> dict[str, tuple[float, float]]:
    """(sum, count) of each `SPLIT` histogram, from /metrics (a connection of its own: an idle one is closed)."""
    connection = http.client.HTTPConnection(host, port)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.endswith(("_sum", "_count")):
            values[name] = float(value)
    return {name: (values.get(f"{name}_sum", 0.0), values.get(f"{name}_count", 0.0)) for name in SPLIT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--requests", type=int, default=60, help="measured requests per cell and path")
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--block", type=int, default=10, help="requests in a row on one path before the other's turn")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="a pause before each request")
    parser.add_argument("--serve-option", action="append", default=[], help="passed to typedlm serve (repeatable)")
    add_output_arguments(parser, "served_path")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        dtype = args.dtype or default_dtype(args.device)
        model = saved_for_serving(args, folder)
        decider = Decider.load(
            model, device=args.device, dtype=dtype, calibration=CalibrationMethod.RAW, feedback_db=None
        )
        documents = Documents(ChatLayout(decider.tokenizer), args.prefix_tokens)
        options = ["--model", model, "--device", args.device, "--dtype", dtype]
        options += ["--calibration", "raw", "--feedback-db", "none", *args.serve_option]
        with served(*options) as (url, _server):
            address = urlparse(url)
            client = http.client.HTTPConnection(address.hostname, address.port)

            def over_http(body: dict) -> float:
                data = json.dumps(body).encode()
                started = time.perf_counter()
                client.request("POST", "/v1/systemone", data, {"Content-Type": "application/json"})
                response = client.getresponse()
                answer = response.read()
                seconds = time.perf_counter() - started
                assert response.status == 200, answer
                return seconds

            def in_process(body: dict) -> float:
                started = time.perf_counter()
                decider.respond(body)
                return time.perf_counter() - started

            rows = []
            columns = ("cell", "in process ms", "HTTP ms", "added ms", "ratio", "wait ms", "forward ms")
            print(table_head(columns, "l" + "r" * 6))
            for questions in args.questions:
                body = {"questions": wire(make_questions(questions))}
                for kind in ("new document", "cached document"):
                    same = documents.next()
                    before = server_split(address.hostname, address.port)
                    times: dict[str, list[float]] = {"in_process": [], "http": []}
                    paths = (("in_process", in_process), ("http", over_http))
                    for turn in range(-(-args.requests // args.block) + 1):  # the first turn: warm-up
                        for path, run in paths if turn % 2 else reversed(paths):  # who goes first alternates
                            time.sleep(SETTLE_S)
                            for i in range(args.block + 1):  # a block's first request: warm-up
                                state = documents.next() if kind == "new document" else same
                                time.sleep(args.pause_ms / 1e3)
                                seconds = run({**body, "state": state})
                                if turn and i:
                                    times[path].append(1e3 * seconds)
                    after = server_split(address.hostname, address.port)
                    split = {
                        name.removeprefix("typedlm_").removesuffix("_seconds") + "_ms": 1e3
                        * (after[name][0] - before[name][0])
                        / max(1.0, after[name][1] - before[name][1])
                        for name in SPLIT
                    }
                    medians = {path: statistics.median(values) for path, values in times.items()}
                    row = {
                        "cell": f"Q = {questions}, {kind}",
                        "in_process_ms": medians["in_process"],
                        "http_ms": medians["http"],
                        "added_ms": medians["http"] - medians["in_process"],
                        "ratio": medians["http"] / medians["in_process"],
                        **split,
                        "ms": times,
                    }
                    rows.append(row)
                    cells = [row[key] for key in ("in_process_ms", "http_ms", "added_ms")]
                    cells += [f"{row['ratio']:.2f}", split["queue_wait_ms"], split["forward_ms"]]
                    print(table_row([row["cell"], *(f"{c:.2f}" if isinstance(c, float) else c for c in cells)]))
    report = {
        "benchmark": "served_path", "device": args.device, "dtype": dtype,
        "model": args.model or ("random-qwen3-0.6b-shape" if args.random_qwen3_06b else "tiny-qwen3"),
        "date": time.strftime("%Y-%m-%d"),
        **host_cpu(), "serve_options": args.serve_option, "prefix_tokens": args.prefix_tokens, "rows": rows,
    }  # fmt: skip
    label = [option.lstrip("-") for option in args.serve_option]
    if args.device != "cpu":
        label.insert(0, device_kind(args.device))
    print(f"wrote {write_report(report, output_path(args, 'served_path', *label))}")


if __name__ == "__main__":
    main()
