"""The learned readout's margin (how many standard errors of its out-of-fold gain it must win by to be used) chosen on
train splits only: each set's train examples cut in two, the first 60% the user's stream and the rest scored
(`typedlm.offline.readout_simulation.validation_splits`), for every margin compared, on every model given.

    python scripts/readout_margin.py --examples eval/examples --out docs/results/readout-margin.json \
        --runs smollm2-135m:docs/results/readouts/smollm2-135m-features \
               qwen2.5-coder-1.5b:docs/results/readouts/qwen2.5-coder-1.5b-features

The margin chosen has the largest mean accuracy gain over calibration alone (over sets, K and models) among those
never more than 0.01 below it in any cell; ties go to the larger margin. Held-out splits are not read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from typedlm.offline.readout_simulation import MARGINS, SEEDS, SLACK, margin_score, simulate, validation_splits
from typedlm.offline.simulation_inputs import SimulationInputs

KS = (50, 100, 200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, help="MODEL:READOUTS_FOLDER, one per model")
    parser.add_argument("--examples", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seeds", type=int, default=SEEDS)
    args = parser.parse_args()
    scores: dict[str, dict[str, dict[str, float]]] = {}
    for run in args.runs:
        model, _, folder = run.partition(":")
        inputs = SimulationInputs.load(model, Path(folder), args.examples)
        splits = validation_splits(inputs.readouts)
        for z in MARGINS:
            report = simulate(splits, inputs.questions, inputs.variants, inputs.prompt_version, KS, args.seeds, z)
            scores.setdefault(str(z), {})[model] = margin_score(report, KS)
            print(f"{model:<20} margin {z:<5} {scores[str(z)][model]}", flush=True)
    allowed = [z for z in MARGINS if all(s["worst"] >= -SLACK for s in scores[str(z)].values())]
    mean = {z: float(np.mean([s["mean_gain"] for s in scores[str(z)].values()])) for z in allowed}
    chosen = max(sorted(allowed, reverse=True), key=lambda z: mean[z]) if allowed else None
    result = {"ks": list(KS), "seeds": args.seeds, "scores": scores, "mean_gain": mean, "chosen": chosen}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nmean gain by margin (never below calibration alone − {SLACK}): {mean}; chosen: {chosen}")


if __name__ == "__main__":
    main()
