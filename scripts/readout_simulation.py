"""What a readout learned from the model's hidden state adds to calibration alone, simulated on readouts recorded
with features, leave-one-set-out (`typedlm.offline.readout_simulation`).

    python scripts/readout_simulation.py --model smollm2-135m --readouts eval/readouts/smollm2-135m \
        --examples eval/examples --out docs/results/readout-smollm2-135m.json

`--readouts` and `--examples` as for `feedback_simulation.py` (the readouts recorded by `record_readouts.py record`,
which records each answer's features). Prints accuracy and ECE (its floor, p90) per set at each K, calibration
alone against the learned readout, and the verdict at K = 200; writes the JSON and, beside it, a PNG of the curves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from typedlm.offline.metrics import set_panels
from typedlm.offline.readout_simulation import KS, SEEDS, simulate, verdicts
from typedlm.offline.simulation_inputs import SimulationInputs


def plot(report: dict, path: Path, title: str) -> None:
    def draw(ax, name: str) -> None:
        curve = report[name]["K"]
        ks = sorted(curve, key=int)
        x = [int(k) for k in ks]
        ax.plot(x, [curve[k]["calibrated"]["accuracy"] for k in ks], "o-", label="accuracy, calibrated")
        ax.plot(x, [curve[k]["readout"]["accuracy"] for k in ks], "s-", label="accuracy, learned readout")
        ax.plot(x, [curve[k]["readout"]["ece"] for k in ks], "^:", color="tab:red", label="ECE, learned readout")
        ax.plot(x, [curve[k]["readout"]["floor90"] for k in ks], "--", color="gray", label="ECE floor (p90)")
        ax.set_xscale("symlog", linthresh=25)
        ax.set_ylim(0, 1)

    set_panels(list(report), draw, path, title, legend_size=6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    SimulationInputs.add_arguments(parser, seeds=SEEDS, ks=KS)
    args = parser.parse_args()
    inputs = SimulationInputs.load(args.model, args.readouts, args.examples)
    report = simulate(inputs.readouts, inputs.questions, inputs.variants, inputs.prompt_version, args.ks, args.seeds)
    verdict = verdicts(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "seeds": args.seeds, "sets": report, "verdict_k200": verdict}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"), f"{args.model}: learned readout against calibration alone")
    print(f"{args.model}: held-out accuracy, calibrated → learned readout (share answered by a learned readout)")
    print(f"{'set':<20} {'n':>4} " + " ".join(f"{'K=' + str(k):>22}" for k in args.ks))
    for name, entry in report.items():
        cells = []
        for k in args.ks:
            c = entry["K"][k]
            cells.append(f"{c['calibrated']['accuracy']:.3f}→{c['readout']['accuracy']:.3f} ({c['learned_share']:.2f})")
        print(f"{name:<20} {entry['n']:>4} " + " ".join(f"{cell:>22}" for cell in cells))
    print("\nECE (floor90), calibrated | learned readout")
    for name, entry in report.items():
        cells = []
        for k in args.ks:
            c, r = entry["K"][k]["calibrated"], entry["K"][k]["readout"]
            cells.append(f"{c['ece']:.3f}|{r['ece']:.3f} ({r['floor90']:.3f})")
        print(f"{name:<20} " + " ".join(f"{cell:>22}" for cell in cells))
    gains = sum(v["gain"] for v in verdict.values())
    never_worse = sum(v["never_worse"] for v in verdict.values())
    print(f"\nK = 200: accuracy ≥ calibrated + 0.03 on {gains}/{len(verdict)} sets; never below calibrated − 0.01 at "
          f"any K on {never_worse}/{len(verdict)}")  # fmt: skip


if __name__ == "__main__":
    main()
