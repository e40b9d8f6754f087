"""The guarantees a team is given, checked by a simulated user on recorded readouts
(`typedlm.offline.guarantee_simulation`): answer sets' realised coverage against the theory, their size against a
baseline, selective answers, and a drifted stream for the online variant.

    python scripts/guarantee_simulation.py --model qwen2.5-coder-1.5b \\
        --readouts docs/results/readouts/qwen2.5-coder-1.5b --examples eval/examples \\
        --out docs/results/guarantees-qwen2.5-coder-1.5b.json

`--readouts` and `--examples` as for scripts/feedback_simulation.py. Prints a table per K, writes the JSON and,
beside it, a PNG: realised coverage per set against the target and the Beta law's band, and set sizes against the
baseline's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from typedlm.offline.guarantee_simulation import ALPHA, KS, SEEDS, TARGET_ACCURACY, drift, simulate_guarantees
from typedlm.offline.simulation_inputs import SimulationInputs


def plot(report: dict, path: Path, title: str, alpha: float) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(report)
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    cover, size = fig.subplots(1, 2)
    ks = sorted({int(k) for entry in report.values() for k in entry["K"]})
    for name in names:
        curve = report[name]["K"]
        cover.errorbar(ks, [curve[k]["coverage"] for k in ks], yerr=[curve[k]["coverage_sd"] for k in ks],
                       marker="o", capsize=2, label=name)  # fmt: skip
    cover.axhline(1 - alpha, color="black", lw=0.8)
    cover.axhspan(1 - alpha - 0.02, 1 - alpha + 0.02, color="gray", alpha=0.15, label="target ± 0.02")
    cover.set_xscale("log")
    cover.set_xticks(ks, [str(k) for k in ks])
    cover.minorticks_off()
    cover.set_xlabel("fair labels posted (K)")
    cover.set_ylabel("realised coverage (mean over orders ± sd)")
    cover.legend(fontsize=7)
    at = max(ks)
    x = range(len(names))
    size.bar([i - 0.2 for i in x], [report[n]["K"][at]["baseline_set_size"] for n in names], 0.4, label="baseline")
    size.bar([i + 0.2 for i in x], [report[n]["K"][at]["set_size"] for n in names], 0.4, label="typedlm")
    size.set_xticks(list(x), names, rotation=30, ha="right", fontsize=7)
    size.set_ylabel(f"mean set size at K = {at}")
    size.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    SimulationInputs.add_arguments(parser, seeds=SEEDS, ks=KS)
    parser.add_argument("--alpha", type=float, default=ALPHA, help=f"miss rate of the sets (default {ALPHA})")
    parser.add_argument("--target", type=float, default=TARGET_ACCURACY, help="selective answers' accuracy")
    parser.add_argument("--drift", nargs=2, default=["rotten_tomatoes", "boolq"], metavar=("FIRST", "THEN"),
                        help="the drifted stream: one set's labels, then another's (default %(default)s)")  # fmt: skip
    args = parser.parse_args()
    inputs = SimulationInputs.load(args.model, args.readouts, args.examples)
    report = simulate_guarantees(
        inputs.readouts, inputs.questions, inputs.variants, inputs.prompt_version, args.ks, args.seeds, args.alpha,
        args.target,
    )  # fmt: skip
    drifted = drift(inputs.readouts, inputs.variants, *args.drift, alpha=args.alpha, seeds=args.seeds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "alpha": args.alpha, "target_accuracy": args.target, "seeds": args.seeds,
              "sets": report, "drift": drifted}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"), f"{args.model}: answer sets at coverage {1 - args.alpha:g}", args.alpha)
    print(f"{args.model}: coverage target {1 - args.alpha:g}, {args.seeds} stream orders; selective at {args.target:g}")
    for k in args.ks:
        print(f"\nK = {k}: coverage mean (sd; theory mean ± sd)  set size (baseline)  committed: accuracy, share")
        for name, entry in report.items():
            c = entry["K"][k]
            theory = f"{c['theory_mean']:.3f} ± {c['theory_sd']:.3f}" if c["theory_mean"] is not None else "none"
            committed = (
                f"{c['committed_accuracy']:.3f}, {c['automated_share']:.3f} ({c['committed']:.0f})"
                if c["committed"]
                else "none"
            )
            also = "  ".join(
                f"at {t}: {v['committed_accuracy']:.3f}, {v['automated_share']:.3f}"
                for t, v in c["selective"].items()
                if v["committed_accuracy"] is not None
            )
            print(f"  {name:<20} {c['coverage']:.3f} ({c['coverage_sd']:.3f}; {theory})  "
                  f"{c['set_size']:.2f} ({c['baseline_set_size']:.2f})  {committed}  {also}")  # fmt: skip
    print(f"\ndrift {drifted['first']} -> {drifted['second']}: miss rate after the switch, split "
          f"{drifted['split_after']:.3f}, online {drifted['online_after']:.3f} (alpha {args.alpha:g})")  # fmt: skip


if __name__ == "__main__":
    main()
