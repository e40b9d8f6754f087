"""Peak GPU memory of typedlm serving one request shape: weights, the key/value buffer, graphs, activations.

    python benchmarks/memory.py --random-qwen3-0.6b --tokenizer DIR --device cuda --questions 32

Loads only the model and one decider in this process (so nothing else is counted), answers the same kind of
request (P ≈ 1266 document tokens, Q noul questions) a few times, and prints the peak allocated and reserved
CUDA memory with their parts; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from latency import make_questions, make_state, random_qwen3_06b

from typedlm.core.options import EngineOptions
from typedlm.decide.decider import Decider
from typedlm.runtime.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--random-qwen3-0.6b", dest="random_qwen3_06b", action="store_true")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    args = parser.parse_args()
    assert args.device.startswith("cuda"), "this benchmark reads CUDA memory counters"
    if args.random_qwen3_06b:
        loaded = random_qwen3_06b(Path(args.tokenizer), args.device, args.dtype)
    else:
        loaded = load_model(args.model, args.device, args.dtype)
    weights = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    options = EngineOptions(cuda_graphs=None if args.cuda_graphs else False)
    decider = Decider(loaded, prefix_cache_bytes=0, engine=options, calibration="raw")
    state, questions = make_state(decider, args.prefix_tokens), make_questions(args.questions)
    for variant in range(4):  # different documents of the same size: the same graph, replayed
        decider.decide(make_state(decider, args.prefix_tokens, variant), questions)
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
