"""Latency of one request, strategy by strategy, side by side: the seed's table and more.

The seed's shape: a prefix of P ≈ 1266 tokens (system prompt + document) and Q = 1, 4, 16, 32 yes/no
questions of S ≈ 31 suffix tokens each. Strategies, all on the same model, states and questions:
  per_question    one full forward of the whole prompt per question (one call per question)
  serial          the seed's path: the document once, then questions one at a time, the cache rewound
  typedlm         Decider.decide with no prefix cache: tokenize, prefill once, one packed pass
  typedlm_cached  the same with the prefix cache warm: the repeated document is not prefilled
  generate        the answers generated as JSON text with `generate` (greedy decode loop), and how often
                  its labels agree with typedlm's argmax
  <peer>          open peers from PyPI (`benchmarks.peers`), where installed
For each Q: median ms over --repeats runs after a warm-up, ms/question, tokens through the model, peak
memory (CUDA: max allocated; CPU: peak RSS growth), and the ratio to typedlm; per strategy a linear fit
gives the fixed and marginal (per-question) cost. Prints a table, writes JSON and a PNG plot (results/latency/),
and ends with one JSON line.

    python -m benchmarks.latency                                     # CPU, the embedded model
    python -m benchmarks.latency --device cuda --random-qwen3-0.6b   # a Qwen3-0.6B-shaped random model
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

from benchmarks.harness import (
    add_model_arguments,
    add_output_arguments,
    device_kind,
    load_benchmark_model,
    make_questions,
    make_state,
    output_path,
    pyplot,
    wire,
    write_report,
)
from typedlm.core.names import CalibrationMethod
from typedlm.core.options import EngineOptions
from typedlm.decide.decider import Decider
from typedlm.runtime import hf
from typedlm.text.prompt import QUESTION_LEAD, question_block

# ---------------------------------------------------------------- strategies: each returns tokens processed


def per_question(decider: Decider, state: str, questions: dict) -> int:
    prompt = decider.layout.tokenize(state, list(questions.values()))
    model, device = decider.engine.model, decider.engine.device
    with torch.inference_mode():
        for suffix in prompt.suffix_ids:
            model(torch.tensor([prompt.prefix_ids + suffix], device=device), logits_to_keep=1)
    return sum(len(prompt.prefix_ids) + len(s) for s in prompt.suffix_ids)


def serial(decider: Decider, state: str, questions: dict) -> int:
    """Prefill the document, then each question on the cache, rewinding it after each (and checking the rewind)."""
    prompt = decider.layout.tokenize(state, list(questions.values()))
    engine = decider.engine
    body, device = engine.eager.body, engine.device
    cache = hf.new_cache()

    def positions(start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, device=device)[None]

    with torch.inference_mode():
        p = len(prompt.prefix_ids)
        hf.run_body(body, torch.tensor([prompt.prefix_ids], device=device), positions(0, p), cache)
        for suffix in prompt.suffix_ids:
            hidden = hf.run_body(body, torch.tensor([suffix], device=device), positions(p, len(suffix)), cache)
            engine.head.logprobs(hidden[0, -1:])
            assert hf.rewind(cache, len(suffix)) == p, "a short rewind would let the next question see this one"
    return p + sum(len(s) for s in prompt.suffix_ids)


def typedlm(decider: Decider, state: str, questions: dict) -> int:
    return decider.decide(state, questions).usage.input_tokens


def generation_prompt(decider: Decider, state: str, questions: dict) -> str:
    blocks = "\n\n".join(f'Question id "{qid}":\n{question_block(q)}' for qid, q in questions.items())
    ask = 'Reply with one JSON object that maps every question id to its answer label, like {"q0": "yes"}.'
    return (
        decider.layout.document_text(state)
        + QUESTION_LEAD
        + blocks
        + "\n\n"
        + ask
        + decider.layout.answer_opening
        + '{"'
        + next(iter(questions))
        + '": "'  # the reply's start, prefilled so that the format is set
    )


def generate(decider: Decider, state: str, questions: dict) -> tuple[int, dict[str, str]]:
    ids = decider.layout.encode(generation_prompt(decider, state, questions))
    model = decider.engine.model
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids], device=decider.engine.device),
            max_new_tokens=8 * len(questions) + 8,
            do_sample=False,
            pad_token_id=decider.tokenizer.eos_token_id,
        )
    text = decider.tokenizer.decode(out[0, len(ids) :].tolist())
    labels = dict(re.findall(r'"(q\d+)"\s*:\s*"([^"]*)"', '{"' + next(iter(questions)) + '": "' + text))
    return len(ids) + out.shape[1] - len(ids), labels


# ---------------------------------------------------------------- measurement


class PeakMemory:
    """Peak memory during a block: CUDA max allocated, or growth of resident memory sampled every 2 ms."""

    def __init__(self, device: str):
        self.device = device
        self.peak = 0
        self.before = 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            self._base, self._stop = self._rss(), False
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, self._rss() - self._base)
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop = True
            self._thread.join()


def timed(fn: Callable[[], object], repeats: int, device: str) -> tuple[float, object, int, int]:
    """(median ms, last result, peak bytes, peak bytes above what was allocated before) over `repeats` runs."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    times, result = [], None
    with PeakMemory(device) as memory:
        for _ in range(repeats):
            start = time.perf_counter()
            result = fn()
            sync()
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result, memory.peak, memory.peak - memory.before


def fit_line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope): the fixed cost and the cost per question."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--strategies", nargs="+", default=None, help="default: all available")
    add_output_arguments(parser, "latency")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded, dtype = load_benchmark_model(args)
    decider = Decider(loaded, prefix_cache_bytes=0, calibration=CalibrationMethod.RAW)
    cached = Decider(loaded, prefix_cache_bytes=4 << 30, calibration=CalibrationMethod.RAW)
    strategies: dict[str, Callable] = {
        "per_question": per_question,
        "serial": serial,
        "typedlm": typedlm,
        "typedlm_cached": lambda _d, state, qs: typedlm(cached, state, qs),
        "generate": generate,
    }
    if args.device.startswith("cuda"):  # the same one-forward readout without CUDA graphs, side by side
        eager = Decider(
            loaded, prefix_cache_bytes=0, engine=EngineOptions(cuda_graphs=False), calibration=CalibrationMethod.RAW
        )
        strategies["typedlm_eager"] = lambda _d, state, qs: typedlm(eager, state, qs)
    peers_wanted = args.strategies is None or not set(args.strategies) <= set(strategies)
    if peers_wanted and args.model is None:
        from benchmarks.peers import peer_runners  # runs only the peers that are installed

        model_dir = str(loaded.model.config._name_or_path)
        if args.random_qwen3_06b:  # the peers load models from a directory: give them the same weights
            model_dir = tempfile.mkdtemp(prefix="typedlm-bench-")
            loaded.model.save_pretrained(model_dir)
            loaded.tokenizer.save_pretrained(model_dir)
        for name, run in peer_runners(model_dir, args.device, dtype=dtype).items():
            strategies[name] = lambda _d, state, qs, run=run: run(state, wire(qs)) and None
    if args.strategies:
        strategies = {k: v for k, v in strategies.items() if k in args.strategies}

    state = make_state(decider.layout, args.prefix_tokens)
    rows = []
    for q in args.questions:
        questions = make_questions(q)
        prompt = decider.layout.tokenize(state, list(questions.values()))
        reference = decider.decide(state, questions)
        for name, strategy in strategies.items():
            ms, result, peak, work = timed(
                lambda s=strategy, qs=questions: s(decider, state, qs), args.repeats, args.device
            )
            row = {"strategy": name, "questions": q, "ms": round(ms, 2), "ms_per_question": round(ms / q, 2)}
            row["prefix_tokens"] = len(prompt.prefix_ids)
            row["suffix_tokens"] = round(statistics.mean(len(s) for s in prompt.suffix_ids), 1)
            row["peak_mb"] = round(peak / 2**20, 1)
            if args.device.startswith("cuda"):  # peak above the models already loaded: this strategy's own memory
                row["work_mb"] = round(work / 2**20, 1)
            if name == "generate":
                tokens, labels = result
                agree = sum(
                    labels.get(qid, "").strip().lower()[:1] == ("y" if reference.answers[qid].p_yes >= 0.5 else "n")
                    for qid in questions
                )
                row["tokens"], row["parsed"], row["agree_with_typedlm"] = tokens, len(labels), agree
            elif isinstance(result, int):
                row["tokens"] = result
            rows.append(row)
        base = next(r["ms"] for r in rows if r["questions"] == q and r["strategy"] == "typedlm")
        for r in rows:
            if r["questions"] == q:
                r["x_typedlm"] = round(r["ms"] / base, 2)
                extra = f" agree {r['agree_with_typedlm']}/{q} parsed {r['parsed']}" if "parsed" in r else ""
                print(
                    f"Q={q:>3} {r['strategy']:<16} {r['ms']:>9.1f} ms {r['ms_per_question']:>8.1f} ms/q  "
                    f"tokens {r.get('tokens', '-')!s:>6}  peak {r['peak_mb']:>8.1f} MB  {r['x_typedlm']:>6.2f}x{extra}",
                    flush=True,
                )
    fits = {}
    for name in strategies:
        points = [(r["questions"], r["ms"]) for r in rows if r["strategy"] == name]
        if len(points) >= 2:
            fixed, marginal = fit_line([p[0] for p in points], [p[1] for p in points])
            fits[name] = {"fixed_ms": round(fixed, 1), "marginal_ms_per_question": round(marginal, 2)}
            print(f"{name:<16} fixed {fixed:>8.1f} ms   marginal {marginal:>7.2f} ms/question")
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu x{args.threads}"
    meta = {
        "benchmark": "latency",
        "date": date.today().isoformat(),
        "model": decider.name,
        "device": device_name,
        "dtype": dtype,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "fused_kernels": str(decider.features.fusion) if decider.features.fusion else None,
        "attention_kernel": decider.features.attention_kernel,
        "model_mb": round(sum(t.numel() * t.element_size() for t in loaded.model.parameters()) / 2**20, 1),
    }
    report = {**meta, "rows": rows, "fits": fits}
    out = write_report(report, output_path(args, "latency", device_kind(args.device)))
    plot(report, out.with_suffix(".png"))
    print(json.dumps(report))


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["strategy"] for r in report["rows"]):
        points = [(r["questions"], r["ms"]) for r in report["rows"] if r["strategy"] == name]
        ax.plot(*zip(*points, strict=True), marker="o", label=name)
    ax.set_xlabel("questions per request (Q)")
    ax.set_ylabel("median latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"{report['model']} on {report['device']}, {report['dtype']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
