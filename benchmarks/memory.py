"""Peak GPU memory of typedlm serving one request shape: weights, the key/value buffer, graphs, activations.

    python -m benchmarks.memory --random-qwen3-0.6b --tokenizer DIR --device cuda --questions 32

Loads only the model and one decider in this process (so nothing else is counted), answers the same kind of
request (P ≈ 1266 document tokens, Q noul questions) a few times, and prints the peak allocated and reserved
CUDA memory with their parts; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.harness import add_model_arguments, load_benchmark_model, make_questions, make_state
from typedlm.core.names import CalibrationMethod
from typedlm.core.options import EngineOptions
from typedlm.decide.decider import Decider


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, device="cuda", dtype="bfloat16")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    args = parser.parse_args()
    assert args.device.startswith("cuda"), "this benchmark reads CUDA memory counters"
    loaded, _ = load_benchmark_model(args)
    weights = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    options = EngineOptions(cuda_graphs=None if args.cuda_graphs else False)
    decider = Decider(loaded, prefix_cache_bytes=0, engine=options, calibration=CalibrationMethod.RAW)
    state, questions = make_state(decider.layout, args.prefix_tokens), make_questions(args.questions)
    for variant in range(4):  # different documents of the same size: the same graph, replayed
        decider.decide(make_state(decider.layout, args.prefix_tokens, variant), questions)
    torch.cuda.synchronize()
    runner = getattr(decider.engine.forward, "runner", None)  # the static forward's
    mb = lambda n: round(n / 2**20, 1)  # noqa: E731
    report = {
        "benchmark": "memory",
        "device": torch.cuda.get_device_name(),
        "model": decider.name,
        "dtype": args.dtype,
        "questions": args.questions,
        "prefix_tokens": len(decider.layout.tokenize(state, list(questions.values())).prefix_ids),
        "cuda_graphs": runner is not None,
        "fused_kernels": str(decider.features.fusion) if decider.features.fusion else None,
        "attention_kernel": decider.features.attention_kernel,
        "weights_mb": mb(weights),
        "kv_buffer_mb": mb(runner.kv.numel() * runner.kv.element_size()) if runner else 0.0,
        "peak_allocated_mb": mb(torch.cuda.max_memory_allocated()),
        "peak_reserved_mb": mb(torch.cuda.max_memory_reserved()),
    }
    for key, value in report.items():
        print(f"{key:<20} {value}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
