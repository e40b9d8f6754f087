"""A user posting gold answers to a running server, measured over HTTP: `feedback_simulation.py`'s check, on the
real server's `/v1/systemone` and `/v1/systemone/feedback`.

    typedlm serve --port 8000 --feedback-db /tmp/feedback-served-boolq.sqlite    # a new path: an empty database
    python scripts/feedback_served.py --url http://127.0.0.1:8000 --examples eval/examples --sets boolq --k 50 \
        --out docs/results/feedback-served-boolq.json

`--examples` holds the exported samples (SET.train.jsonl and SET.held_out.jsonl, from `record_readouts.py export`).
For each set: (1) its held-out examples are asked through `/v1/systemone` before any of its gold answers is posted
(K = 0); (2) the first K of its train examples, in a seeded random order (`--seed`), are posted one after another
with their gold answers to `/v1/systemone/feedback`; the last post's `x_feedback` is kept per question: the level
and labels of the calibration in force for it; (3) the held-out examples are asked again (K = K). Both rounds are
scored per set and per question kind with `typedlm.offline.metrics` as the simulation scores them: accuracy, ECE
(15 bins) and its noise floor (the 90th percentile of what a perfectly calibrated model with the same confidences
would measure on as many answers), and whether the ECE is within that floor + 0.02; and the answer sets' realised
coverage, mean size and share guaranteed at `--coverage` (x_coverage, default 0.9), and the share of answers
committed at `--min-accuracy` (x_min_accuracy, default 0.9) with their accuracy. Prints the table and writes
the JSON (every held-out answer's probabilities in both rounds included), with what each round's answers used:
their `x_calibration`, and how many answers used labels at each level and a learned readout (from each answer's
`x_feedback`).

Start the server on a new `--feedback-db` path: its database must be empty, or K = 0 is not the default. Sets are
different questions, so a set's exact questions and families (type and instructions) never share labels with
another's; the kind level (every question of a type, for this model) is shared by all of them, so in a run of
several sets each set after the first is asked at K = 0 with the earlier sets' labels of its kinds in force. The
script counts the answers that used labels in each round and says so; for a clean K = 0 per set, run one set per
server started on a new database. `--held-out N` scores a seeded random subset of N held-out examples (seed 0,
file order kept: exported files may be sorted by class), the same subset whatever `--seed` is.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from typedlm.core.questions import parse_questions
from typedlm.offline.evaldata import Example, read_jsonl
from typedlm.offline.metrics import KINDS, Prediction, ece_floor, summarize
from typedlm.offline.simulation import TARGET_MARGIN

TIMEOUT_S = 300.0  # per request: the server's own default timeout


class ServerError(Exception):
    """The server could not be reached or answered other than 2xx."""


class Server:
    """A running `typedlm serve`, over one httpx client (shared by the threads asking held-out examples)."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float, handover: dict[str, float] | None = None):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.handover = handover or {}  # x_coverage, x_min_accuracy sent with every question asked
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        try:
            response = self.client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach {self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if not response.is_success:
            raise ServerError(f"{method} {self.url}{path} answered {response.status_code}:\n{response.text}")
        return response.json()

    def ask(self, example: Example) -> dict[str, Any]:
        body = {"state": example.state, "questions": example.questions, **self.handover}
        return self.call("POST", "/v1/systemone", body)

    def post(self, example: Example, feedback_id: str) -> dict[str, Any]:
        body = {"state": example.state, "questions": example.questions, "gold": example.gold}
        return self.call("POST", "/v1/systemone/feedback", {**body, "x_feedback_id": feedback_id})


def scores(predictions: Sequence[Prediction]) -> dict[str, dict[str, Any]]:
    """Overall and per kind: n, accuracy, ECE, its floor (p90) and whether the ECE is within floor + margin."""
    summary = summarize(predictions)
    out = {}
    for group in ("overall", *KINDS):
        if group not in summary:
            continue
        members = [p for p in predictions if group in ("overall", p.kind)]
        floor = ece_floor(members)["p90"]
        ece = summary[group]["ece"]
        out[group] = {
            "n": summary[group]["n"],
            "accuracy": summary[group]["accuracy"],
            "nll": summary[group]["nll"],
            "ece": ece,
            "floor90": floor,
            "within": ece <= floor + TARGET_MARGIN,
        }
    return out


def ask_all(server: Server, examples: Sequence[Example], concurrency: int) -> dict[str, Any]:
    """Every example asked (`concurrency` at a time), scored; with how the answers were calibrated."""
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        replies = list(pool.map(server.ask, examples))
    predictions, answers = [], []
    covered, sizes, guaranteed, committed = [], [], [], []  # per answer, where the request asked for them
    methods: Counter[str] = Counter()
    used: Counter[str] = Counter()  # answers by the most specific level of labels they used, and its labels
    for example, reply in zip(examples, replies, strict=True):
        methods[reply.get("x_calibration", "?")] += 1
        questions = parse_questions(example.questions)
        for qid, question in questions.items():
            answer = reply["answers"][qid]
            probs = question.wire_probabilities(answer)
            gold = question.gold_index(example.gold[qid])
            predictions.append(Prediction(question.kind, probs, gold, answer.get("x_raw_mass", 0.0)))
            if "x_set" in answer:
                covered.append(question.answer_keys()[gold] in answer["x_set"]["answers"])
                sizes.append(len(answer["x_set"]["answers"]))
                guaranteed.append(answer["x_set"]["guaranteed"])
            if "x_abstain" in answer and not answer["x_abstain"]:
                committed.append(max(range(len(probs)), key=probs.__getitem__) == gold)
            learned = answer.get("x_feedback")
            readout = f", readout {learned['readout']}" if learned and "readout" in learned else ""
            used[f"{learned['level']}, {learned['labels']} labels{readout}" if learned else "none"] += 1
            answers.append(
                {"id": example.id, "question": qid, "kind": question.kind, "gold": gold, "probabilities": probs}
            )
    n = len(predictions)
    handover = {
        "coverage": float(np.mean(covered)) if covered else None,  # the share of sets holding the gold answer
        "set_size": float(np.mean(sizes)) if sizes else None,
        "guaranteed": float(np.mean(guaranteed)) if guaranteed else None,  # the share of sets with a guarantee
        "automated_share": len(committed) / n if n else 0.0,
        "committed_accuracy": float(np.mean(committed)) if committed else None,
    }
    return {
        "scores": scores(predictions),
        "handover": handover,
        "x_calibration": dict(methods),
        "labels_used": dict(used),
        "answers": answers,
    }


def held_out_subset(examples: list[Example], n: int | None) -> list[Example]:
    if n is None or n >= len(examples):
        return examples
    keep = set(np.random.default_rng(0).permutation(len(examples))[:n].tolist())
    return [example for i, example in enumerate(examples) if i in keep]


def run_set(server: Server, folder: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    train = read_jsonl(folder / f"{name}.train.jsonl")
    held = held_out_subset(read_jsonl(folder / f"{name}.held_out.jsonl"), args.held_out)
    order = np.random.default_rng(args.seed).permutation(len(train))[: args.k]
    posted = [train[i] for i in order]
    print(f"{name}: asking {len(held)} held-out examples (K = 0)", file=sys.stderr, flush=True)
    before = ask_all(server, held, args.concurrency)
    print(f"{name}: posting {len(posted)} train examples' gold answers", file=sys.stderr, flush=True)
    in_force: dict[str, dict[str, Any]] = {}
    stored = 0
    for example in posted:
        reply = server.post(example, f"{name}:{example.id}")
        stored += reply.get("x_feedback_stored", 0)
        in_force.update(reply.get("x_feedback", {}))
    print(f"{name}: asking {len(held)} held-out examples (K = {len(posted)})", file=sys.stderr, flush=True)
    after = ask_all(server, held, args.concurrency)
    return {
        "held_out": len(held),
        "k": len(posted),
        "posted": [example.id for example in posted],
        "stored": stored,
        "in_force": in_force,
        "K0": before,
        "K": after,
    }


def _cell(entry: dict[str, Any]) -> str:
    return f"{entry['ece']:.3f} ({entry['floor90']:.3f})"


def print_table(report: dict[str, Any], k: int) -> None:
    head = f"{'set':<20} {'kind':<8} {'n':>5} {'acc K=0':>8} {'ECE K=0 (floor)':>16} {'acc K=' + str(k):>8} "
    print(head + f"{'ECE K=' + str(k) + ' (floor)':>16} {'within floor+' + str(TARGET_MARGIN):>18}")
    for name, entry in report.items():
        groups = entry["K"]["scores"]
        for group, after in groups.items():
            if group == "overall" and len(groups) == 2:
                continue  # one kind: overall is that kind
            before = entry["K0"]["scores"][group]
            print(
                f"{name:<20} {group:<8} {after['n']:>5} {before['accuracy']:>8.3f} {_cell(before):>16} "
                f"{after['accuracy']:>8.3f} {_cell(after):>16} {'yes' if after['within'] else 'no':>18}"
            )
    print("\nanswer sets and selective answers: coverage, mean set size, share guaranteed; share committed, accuracy")
    for name, entry in report.items():
        for at in ("K0", "K"):
            h = entry[at]["handover"]
            if h["coverage"] is None and not h["automated_share"]:
                continue
            cells = [f"{h[key]:.3f}" if h[key] is not None else "-" for key in
                     ("coverage", "set_size", "guaranteed", "automated_share", "committed_accuracy")]  # fmt: skip
            print(f"{name:<20} {'K=0' if at == 'K0' else 'K=' + str(entry['k']):<6} " + "  ".join(cells))
    for name, entry in report.items():
        print(f"\n{name}: {entry['k']} posted, {entry['stored']} labels stored")
        print(f"  x_calibration  K=0: {entry['K0']['x_calibration']}  K={entry['k']}: {entry['K']['x_calibration']}")
        print(f"  answers by the level of labels used  K=0: {entry['K0']['labels_used']}  K={entry['k']}: "
              f"{entry['K']['labels_used']}")  # fmt: skip
        for qid, level in entry["in_force"].items():
            print(f"  in force for the last post's {qid!r}: {level['level']}, {level['labels']} labels")
        if set(entry["K0"]["labels_used"]) - {"none"}:
            print("  note: K = 0 answers used labels already in the database (an earlier set's, at the kind level, "
                  "or an earlier run's): this K = 0 is not the default")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="a running typedlm serve, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    parser.add_argument("--examples", required=True, type=Path, help="folder of SET.train.jsonl, SET.held_out.jsonl")
    parser.add_argument("--sets", required=True, nargs="+", metavar="NAME")
    parser.add_argument("--k", type=int, default=50, help="train examples posted as feedback per set (default 50)")
    parser.add_argument("--held-out", type=int, default=None, help="held-out examples scored per set (default all)")
    parser.add_argument("--seed", type=int, default=0, help="the order the train examples are posted in (default 0)")
    parser.add_argument("--out", required=True, type=Path, help="the JSON report")
    parser.add_argument("--concurrency", type=int, default=4, help="held-out requests in flight (default 4)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"seconds per request (default {TIMEOUT_S:g})")
    parser.add_argument("--coverage", type=float, default=0.9, help="x_coverage asked of held-out answers (0: none)")
    parser.add_argument("--min-accuracy", type=float, default=0.9, help="x_min_accuracy asked (0: none)")
    args = parser.parse_args()
    for name in args.sets:
        for split in ("train", "held_out"):
            if not (args.examples / f"{name}.{split}.jsonl").is_file():
                raise SystemExit(f"no {name}.{split}.jsonl in {args.examples}")
    handover = {"x_coverage": args.coverage, "x_min_accuracy": args.min_accuracy}
    server = Server(args.url, args.api_key, args.timeout, {k: v for k, v in handover.items() if v})
    try:
        health = server.call("GET", "/health")
        existing = server.call("GET", "/v1/systemone/feedback")
        if existing["labels"]:
            print(f"warning: the feedback database {existing['database']} already holds {existing['labels']} labels "
                  f"in {existing['families_labeled']} families: start the server on a new --feedback-db path",
                  file=sys.stderr)  # fmt: skip
        report = {name: run_set(server, args.examples, name, args) for name in args.sets}
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    result = {
        "url": server.url,
        "model": health.get("model"),
        "database": existing["database"],
        "labels_before": existing["labels"],
        "k": args.k,
        "seed": args.seed,
        "held_out": args.held_out,
        "margin": TARGET_MARGIN,
        "handover": server.handover,
        "sets": report,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['model']} at {server.url}: held-out accuracy and ECE (floor90) before and after K posts")
    print_table(report, args.k)


if __name__ == "__main__":
    main()
