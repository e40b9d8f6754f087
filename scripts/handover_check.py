"""The hand-over's guarantees where the truth is known (`typedlm.offline.handover_check`): a model whose reads are a
known distortion of true probabilities, served through the feedback calibrator, over many independent draws of
labels; the share of draws whose sets under-cover (beside the theory's own), whose certificate is wrong, and that
switch to the online variant on a stream that does not drift; with and without a learned readout.

    python scripts/handover_check.py --draws 500 --readout-draws 100 --answers 200 --jobs 2 \
        --out docs/results/handover-check.json
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from typedlm.offline.handover_check import Task, check

# (task, labels per draw): the readout tasks read noisily, with features that hold more, and at 200 labels (at 100 a
# fold model's 80 rarely let a readout through its gate)
TASKS = {
    "yes/no": (Task(2), 100),
    "4 options": (Task(4), 100),
    "yes/no, readout": (Task(2, read_noise=1.5, readout=True), 200),
    "4 options, readout": (Task(4, read_noise=1.5, readout=True), 200),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=500, help="independent draws of labels per task")
    parser.add_argument("--readout-draws", type=int, default=None, help="draws of the readout tasks (--draws)")
    parser.add_argument("--answers", type=int, default=400, help="answers asked per draw")
    parser.add_argument("--jobs", type=int, default=1, help="processes (each a share of every task's draws)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with ProcessPoolExecutor(args.jobs) as pool:
        parts = {}
        for name, (task, labels) in TASKS.items():
            draws = args.readout_draws if task.readout and args.readout_draws else args.draws
            share = -(-draws // args.jobs)
            parts[name] = [pool.submit(check, task, min(share, draws - j * share), labels, args.answers, seed=j)
                           for j in range(args.jobs) if draws - j * share > 0]  # fmt: skip
        report = {name: [part.result() for part in futures] for name, futures in parts.items()}
    merged = {name: merge(parts) for name, parts in report.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=1) + "\n")
    for name, r in merged.items():
        selective = "  ".join(
            f"{t}: wrong {v['wrong_draws']}/{v['draws_committing']}, committed {v['committed_share']:.3f}"
            for t, v in r["selective"].items()
        )
        print(f"{name:<20} K {r['labels']}  coverage {r['coverage_mean']:.3f} (sd {r['coverage_sd']:.3f})  under "
              f"{r['under_share']:.3f} (theory {r['theory_under_share']:.3f})  switched {r['switched_draws']}/"
              f"{r['draws']}  readout {r['readout_share']:.2f}  {selective}")  # fmt: skip


def merge(parts: list[dict]) -> dict:
    """Several processes' reports of one task as one (weighted by their draws)."""
    draws = sum(p["draws"] for p in parts)

    def mean(key):
        return sum(p[key] * p["draws"] for p in parts) / draws

    out = {**parts[0], "draws": draws}
    for key in ("coverage_mean", "under_share", "readout_share"):
        out[key] = mean(key)
    out["coverage_sd"] = (sum((p["coverage_sd"] ** 2 + p["coverage_mean"] ** 2) * p["draws"] for p in parts) / draws
                          - out["coverage_mean"] ** 2) ** 0.5  # fmt: skip
    out["switched_draws"] = sum(p["switched_draws"] for p in parts)
    for target in parts[0]["selective"]:
        cells = [p["selective"][target] for p in parts]
        committing = sum(c["draws_committing"] for c in cells)
        wrong = sum(c["wrong_draws"] for c in cells)
        out["selective"][target] = {
            "draws_committing": committing,
            "wrong_draws": wrong,
            "wrong_share": wrong / committing if committing else None,
            "committed_share": sum(c["committed_share"] * p["draws"] for c, p in zip(cells, parts)) / draws,
            "committed_true_accuracy": (
                sum(c["committed_true_accuracy"] * c["draws_committing"] for c in cells if c["draws_committing"])
                / committing
                if committing
                else None
            ),
        }
    return out


if __name__ == "__main__":
    main()
