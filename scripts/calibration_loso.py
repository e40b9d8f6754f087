"""Leave-one-set-out calibration on recorded readouts: fit on every set but one, score on the one left out.

    python scripts/calibration_loso.py --model qwen2.5-coder-0.5b --sets rotten_tomatoes bbc_news sys1bench \
        sys1bench_generated --limit 150 --readouts eval/readouts/qwen0.5b --out eval/loso-qwen0.5b.json \
        [--calibration-file calibration.json]

Readouts (every answer's label masses for 3 option orders and their content-free priors) are recorded once per
set and split into --readouts (JSONL) and reused by later runs. Then:
1. the variant (base raw or contextual, 1 or 3 order reads, one temperature per kind or the feature calibrator,
   with or without a bias on yes for noul) is chosen on train splits: each set's calibrator fitted on the other
   sets' train splits, scored on its own train split; lowest mean ECE (then NLL) wins;
2. the chosen variant is reported on the held-out splits: raw, contextual, fitted in-set, fitted with the set left
   out (accuracy, ECE, Brier), and written as JSON;
3. with --calibration-file, the chosen variant fitted on every set's train split is written as this model's
   calibration file (its order reads recorded in its data).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from typedlm import Decider
from typedlm.decide.calibration import CALIBRATOR_FEATURES, CalibrationFile
from typedlm.offline.evaluate import load_examples
from typedlm.offline.fitting import fit_calibrators
from typedlm.offline.loso import answers_of, leave_one_set_out
from typedlm.offline.readouts import load, record, save
from typedlm.text.prompt import PROMPT_VERSION

READS = 3  # option orders recorded per choice/score question; fewer are read from them


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--sets", nargs="+", required=True)
    parser.add_argument("--limit", type=int, default=150, help="examples per set and split (class-balanced sample)")
    parser.add_argument("--readouts", required=True, help="folder of recorded readouts (made if missing)")
    parser.add_argument("--out", required=True, help="JSON report")
    parser.add_argument("--calibration-file", default=None, help="write the calibrator fitted on every set here")
    args = parser.parse_args()
    decider = Decider.load(args.model, calibration="raw")
    folder = Path(args.readouts)
    readouts = {}
    for name in args.sets:
        readouts[name] = {}
        for split in ("train", "held_out"):
            path = folder / f"{name}.{split}.jsonl"
            if not path.is_file():
                save(path, record(decider, load_examples(name, split, args.limit, 0), name, READS))
                print(f"recorded {path}", file=sys.stderr, flush=True)
            readouts[name][split] = load(path)
    # 1. choose the variant on train splits: each set's calibrator is fitted without it and scored on its train split
    variants = {
        f"{base}, {reads} read{'s' * (reads > 1)}, {label}": (base, reads, use)
        for base in ("raw", "contextual")
        for reads in (1, READS)
        for label, use in (
            ("temperature", ("bias",)),
            ("features", CALIBRATOR_FEATURES),
            ("temperature, yes bias", ("bias", "yes_bias")),
            ("features, yes bias", (*CALIBRATOR_FEATURES, "yes_bias")),
        )
    }
    selection = {}
    print(f"{decider.name}: variants, each set left out, scored on its train split (mean over sets)")
    for label, (base, reads, use) in variants.items():
        result = leave_one_set_out(readouts, base, reads, use, scored="train")
        overall = [entry["rows"]["calibrated, set left out"]["overall"] for entry in result.values()]
        selection[label] = {k: sum(o[k] for o in overall) / len(overall) for k in ("ece", "nll", "brier", "accuracy")}
        print(f"  {label:<40} " + "  ".join(f"{k} {v:.3f}" for k, v in selection[label].items()), flush=True)
    chosen = min(selection, key=lambda label: (selection[label]["ece"], selection[label]["nll"]))
    base, reads, use = variants[chosen]
    print(f"chosen: {chosen}")
    # 2. report it on the held-out splits
    result = leave_one_set_out(readouts, base, reads, use, scored="held_out")
    print(f"\n{decider.name}, {chosen}, held-out splits\n")
    print("| set | method | answers | accuracy | ECE | Brier |\n|---|---|---:|---:|---:|---:|")
    for name, entry in result.items():
        for method, summary in entry["rows"].items():
            o = summary["overall"]
            print(f"| {name} | {method} | {o['n']} | {o['accuracy']:.3f} | {o['ece']:.3f} | {o['brier']:.3f} |")
    report = {
        "model": decider.name,
        "fingerprint": decider.fingerprint,
        "limit": args.limit,
        "selection": selection,
        "chosen": chosen,
        "held_out": result,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.calibration_file:
        train = [a for splits in readouts.values() for a in answers_of(splits["train"], base, reads)]
        data = {
            "sets": args.sets,
            "split": "train",
            "seed": 0,
            "examples": {name: len({r.example for r in splits["train"]}) for name, splits in readouts.items()},
            "answers": len(train),
            "variant": chosen,
            "order_reads": reads,
        }
        calibrators = fit_calibrators(train, use)
        file = CalibrationFile(decider.name, decider.fingerprint, PROMPT_VERSION, base, {}, data, {}, calibrators)
        file.save(args.calibration_file)
        print(f"wrote {args.calibration_file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
