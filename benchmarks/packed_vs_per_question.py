"""typedlm's one-pass readout vs one full forward per question, on the embedded model (CPU).

The seed's shape: a prefix of P ≈ 1266 tokens (system prompt + document) and Q = 1, 4, 16, 32 yes/no
questions of S ≈ 31 suffix tokens each. For each Q it prints total ms and ms/question for
  packed       typedlm's Decider.decide: tokenize, prefill the document once, all questions in one pass;
  per-question one forward of the whole prompt (prefix + suffix) per question, LM head on the last row only;
as medians over --repeats runs after a warm-up, with the speed-up, and ends with one JSON line.

    python benchmarks/packed_vs_per_question.py [--repeats 3] [--dtype float32|bfloat16] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from typedlm.decider import Decider
from typedlm.questions import NoulQuestion

TOPICS = [
    "a refund", "a late delivery", "a broken screen", "a discount code", "the warranty", "a second charge",
    "a change of address", "the invoice date", "a cancelled order", "a missing item", "gift wrapping",
    "a loyalty card", "the return label", "a password reset", "an email from support", "the courier",
    "a damaged box", "the colour of the case", "a price match", "a bank transfer", "the tracking number",
    "a store visit", "an angry tone", "a phone call", "a manager", "the battery life", "express shipping",
    "a subscription", "a coupon", "the size chart", "customs fees", "a replacement unit",
]  # fmt: skip


def make_state(decider: Decider, target_prefix_tokens: int) -> str:
    """A support-ticket thread whose prefix (system prompt + document) has about `target` tokens."""
    lines = []
    i = 0
    while True:
        lines.append(f"Message {i}: the customer writes about {TOPICS[i % len(TOPICS)]} and order {1000 + i}.")
        state = "\n".join(lines)
        if len(decider.layout.encode(decider.layout.prefix_text(state))) >= target_prefix_tokens:
            return state
        i += 1


def make_questions(n: int) -> dict[str, NoulQuestion]:
    return {
        f"q{i}": NoulQuestion(f"Does the customer, anywhere in this thread, mention {TOPICS[i % len(TOPICS)]} at all?")
        for i in range(n)
    }


def per_question(decider: Decider, state: str, questions: dict) -> None:
    prompt = decider.layout.tokenize(state, list(questions.values()))
    model = decider.engine.model
    with torch.inference_mode():
        for suffix in prompt.suffix_ids:
            model(torch.tensor([prompt.prefix_ids + suffix]), logits_to_keep=1)


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 4, 16, 32])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    decider = Decider.load(None, "cpu", args.dtype)
    state = make_state(decider, args.prefix_tokens)
    rows = []
    for q in args.questions:
        questions = make_questions(q)
        prompt = decider.layout.tokenize(state, list(questions.values()))
        suffix_tokens = statistics.mean(len(s) for s in prompt.suffix_ids)
        packed_ms = timed(lambda questions=questions: decider.decide(state, questions), args.repeats)
        per_q_ms = timed(lambda questions=questions: per_question(decider, state, questions), args.repeats)
        rows.append(
            {
                "questions": q,
                "prefix_tokens": len(prompt.prefix_ids),
                "suffix_tokens": round(suffix_tokens, 1),
                "packed_ms": round(packed_ms, 1),
                "packed_ms_per_question": round(packed_ms / q, 1),
                "per_question_ms": round(per_q_ms, 1),
                "per_question_ms_per_question": round(per_q_ms / q, 1),
                "speedup": round(per_q_ms / packed_ms, 2),
            }
        )
        r = rows[-1]
        print(
            f"Q={q:>3}  P={r['prefix_tokens']}  S={r['suffix_tokens']:>5}  "
            f"packed {r['packed_ms']:>8.1f} ms ({r['packed_ms_per_question']:>7.1f}/q)   "
            f"per-question {r['per_question_ms']:>8.1f} ms ({r['per_question_ms_per_question']:>7.1f}/q)   "
            f"x{r['speedup']}",
            flush=True,
        )
    meta = {"model": decider.name, "dtype": args.dtype, "threads": args.threads, "repeats": args.repeats}
    print(json.dumps({"benchmark": "packed_vs_per_question", **meta, "rows": rows}))


if __name__ == "__main__":
    main()
