"""The guarantees a team is given, checked by a simulated user on recorded readouts
(`typedlm.offline.guarantee_simulation`), counted per independent draw of labels: the share of draws whose answer sets
under-cover and whose certificate is wrong, set sizes against a baseline, selective answers, and a drifted stream for
the online variant.

    python scripts/guarantee_simulation.py --model qwen2.5-coder-1.5b \\
        --readouts docs/results/readouts/qwen2.5-coder-1.5b --examples eval/examples \\
        --out docs/results/guarantees-qwen2.5-coder-1.5b.json

`--readouts` and `--examples` as for scripts/feedback_simulation.py; `--seeds N`: the random draws per set and K
(the disjoint ones are as many as the train split holds); with `--readouts` a folder recorded with features
(`docs/results/readouts/MODEL-features`) and `--with-readouts`, each draw is served with and without learned readouts.
Prints a table per K, writes the JSON and, beside it, a PNG: realised coverage per draw against the target, and set
sizes against the baseline's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from typedlm.offline.guarantee_simulation import (
    ALPHA,
    KS,
    RANDOM_DRAWS,
    TARGETS,
    UNDER,
    drift,
    simulate_guarantees,
)
from typedlm.offline.simulation_inputs import SimulationInputs


def plot(report: dict, path: Path, title: str, alpha: float) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(report)
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    cover, size = fig.subplots(1, 2)
    ks = sorted({int(k) for entry in report.values() for k in entry["K"]})
    for i, name in enumerate(names):
        for j, k in enumerate(ks):
            cell = report[name]["K"][k]["random"]["calibration"]
            x = i + (j - 1) * 0.25
            cover.errorbar([x], [cell["coverage"]], yerr=[cell["coverage_sd"]], marker="o", capsize=2,
                           color=f"C{j}", label=f"K = {k}" if i == 0 else None)  # fmt: skip
            cover.plot([x], [cell["coverage_min"]], "v", color=f"C{j}", ms=4)
    cover.axhline(1 - alpha, color="black", lw=0.8)
    cover.axhline(1 - alpha - UNDER, color="gray", lw=0.8, ls="--", label=f"target − {UNDER}")
    cover.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
    cover.set_ylabel("coverage per draw (mean ± sd; ▼ the lowest draw)")
    cover.legend(fontsize=7)
    at = max(ks)
    x = range(len(names))
    cells = [report[n]["K"][at]["random"] for n in names]
    size.bar([i - 0.27 for i in x], [c["calibration"]["baseline_set_size"] for c in cells], 0.27, label="baseline")
    size.bar(list(x), [c["calibration"]["set_size"] for c in cells], 0.27, label="typedlm")
    size.bar([i + 0.27 for i in x], [c.get("readouts", c["calibration"])["set_size"] for c in cells], 0.27,
             label="typedlm with readouts (where recorded)")  # fmt: skip
    size.set_xticks(list(x), names, rotation=30, ha="right", fontsize=7)
    size.set_ylabel(f"mean set size at K = {at}")
    size.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)


def _cell_line(name: str, kind: str, model: str, c: dict) -> str:
    theory = f"{c['theory_mean']:.3f} ± {c['theory_sd']:.3f}" if c["theory_mean"] is not None else "none"
    selective = "  ".join(
        f"{t}: {v['automated_share']:.3f} at "
        + (f"{v['committed_accuracy']:.3f}" if v["committed_accuracy"] is not None else "-")
        + f", wrong {v['wrong_draws']}/{v['judged_draws']}"
        for t, v in c["selective"].items()
    )
    return (f"  {name:<20} {kind:<8} {model:<11} {c['coverage']:.3f} ({c['coverage_sd']:.3f}; {theory})  "
            f"under {c['under_covering']}/{c['draws']}  size {c['set_size']:.2f} ({c['baseline_set_size']:.2f})  "
            f"acc {c['accuracy']:.3f}  switched {c['switched_draws']}  {selective}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    SimulationInputs.add_arguments(parser, seeds=RANDOM_DRAWS, ks=KS)
    parser.add_argument("--alpha", type=float, default=ALPHA, help=f"miss rate of the sets (default {ALPHA})")
    parser.add_argument("--targets", type=float, nargs="+", default=list(TARGETS), help="selective accuracies")
    parser.add_argument("--with-readouts", action="store_true", help="serve each draw with learned readouts too")
    parser.add_argument("--jobs", type=int, default=1, help="processes, each a set at one K at a time")
    parser.add_argument("--drift", nargs=2, default=["rotten_tomatoes", "boolq"], metavar=("FIRST", "THEN"),
                        help="the drifted stream: one set's labels, then another's (default %(default)s)")  # fmt: skip
    args = parser.parse_args()
    inputs = SimulationInputs.load(args.model, args.readouts, args.examples)
    report = simulate_guarantees(
        inputs.readouts, inputs.questions, inputs.variants, inputs.prompt_version, args.ks, args.seeds, args.alpha,
        args.targets, args.with_readouts, args.jobs,
    )  # fmt: skip
    drifted = drift(inputs.readouts, inputs.variants, *args.drift, alpha=args.alpha)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "alpha": args.alpha, "targets": args.targets, "random_draws": args.seeds,
              "under": UNDER, "sets": report, "drift": drifted}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"), f"{args.model}: answer sets at coverage {1 - args.alpha:g}", args.alpha)
    print(f"{args.model}: coverage target {1 - args.alpha:g}, under-covering below {1 - args.alpha - UNDER:g}; "
          f"selective at {args.targets}: share committed at accuracy, wrong certificates / draws judged")  # fmt: skip
    for k in args.ks:
        print(f"\nK = {k}: coverage mean (sd; theory)  under-covering draws  set size (baseline)  accuracy  ...")
        for name, entry in report.items():
            for kind, models in entry["K"][k].items():
                for model, cell in models.items():
                    print(_cell_line(name, kind, model, cell))
    print(f"\ndrift {drifted['first']} -> {drifted['second']}: miss rate after the switch, split "
          f"{drifted['split_after']:.3f}, online {drifted['online_after']:.3f} (alpha {args.alpha:g})")  # fmt: skip


if __name__ == "__main__":
    main()
