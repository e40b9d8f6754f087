"""A user posting gold answers, simulated on recorded readouts, leave-one-set-out (`typedlm.offline.simulation`).

    python scripts/feedback_simulation.py --model qwen2.5-coder-1.5b --readouts eval/readouts/qwen2.5-coder-1.5b \
        --examples eval/examples --out docs/results/feedback-qwen2.5-coder-1.5b.json

`--readouts` holds `record_readouts.py record`'s folders (`1-letters/`, `1-names/`: SET.SPLIT.jsonl[.gz]); choice
questions are read as the model's shipped calibration file reads them (by letter, by name, or by name with each
option's mass length-normalised), and its variant per kind is the default each set is simulated on. `--examples`
holds the exported samples (SET.SPLIT.jsonl), for the questions the learner keys its labels by. Prints the learning
curve per set (ECE beside its floor at each K), the label-free references, and the verdict at K = 50; writes the
JSON and, beside it, a PNG of the curves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from typedlm.offline.metrics import set_panels
from typedlm.offline.simulation import KS, SEEDS, simulate, verdicts
from typedlm.offline.simulation_inputs import SimulationInputs


def plot(report: dict, path: Path, title: str) -> None:
    def draw(ax, name: str) -> None:
        curve = report[name]["K"]
        ks = sorted(curve, key=int)
        ax.plot([int(k) for k in ks], [curve[k]["ece"] for k in ks], "o-", label="ECE, feedback")
        ax.plot([int(k) for k in ks], [curve[k]["floor90"] for k in ks], "--", color="gray", label="floor (p90)")
        ax.axhline(report[name]["raw"]["ece"], color="tab:red", lw=0.8, label="raw")
        ax.set_xscale("symlog", linthresh=10)
        ax.set_ylim(0, max(0.3, max(curve[k]["ece"] for k in ks) * 1.1))

    set_panels(list(report), draw, path, title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    SimulationInputs.add_arguments(parser, seeds=SEEDS, ks=KS)
    args = parser.parse_args()
    inputs = SimulationInputs.load(args.model, args.readouts, args.examples)
    report = simulate(inputs.readouts, inputs.questions, inputs.variants, inputs.prompt_version, args.ks, args.seeds)
    verdict = verdicts(report) if 50 in args.ks else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "model": args.model,
        "variants": inputs.variants_text,
        "seeds": args.seeds,
        "sets": report,
        "verdict_k50": verdict,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"), f"{args.model}: feedback, leave-one-set-out (ECE vs labels posted)")
    head = f"{'set':<20} {'n':>4} {'raw acc':>7} " + " ".join(f"{'K=' + str(k):>13}" for k in args.ks)
    print(f"{args.model}: held-out ECE (floor90) at each K, mean of {args.seeds} stream orders\n{head}")
    for name, entry in report.items():
        cells = " ".join(f"{entry['K'][k]['ece']:.3f} ({entry['K'][k]['floor90']:.3f})" for k in args.ks)
        print(f"{name:<20} {entry['raw']['n']:>4} {entry['raw']['accuracy']:>7.3f} {cells}")
    print("\naccuracy at each K")
    for name, entry in report.items():
        print(f"{name:<20} " + " ".join(f"{entry['K'][k]['accuracy']:>13.3f}" for k in args.ks))
    print("\nlabel-free, from the stream: ECE (floor90)")
    for name, entry in report.items():
        cells = "  ".join(f"{method} {v['ece']:.3f} ({v['floor90']:.3f})" for method, v in entry["stream"].items())
        print(f"{name:<20} {cells}")
    if verdict:
        ece_ok = sum(v["ece"] for v in verdict.values())
        accuracy_ok = sum(v["accuracy"] for v in verdict.values())
        print(f"\nK = 50: ECE within floor90 + 0.02 on {ece_ok}/{len(verdict)} sets; accuracy within raw - 0.01 on "
              f"{accuracy_ok}/{len(verdict)}")  # fmt: skip


if __name__ == "__main__":
    main()
