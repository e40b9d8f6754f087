"""Leave-one-set-out calibration on recorded readouts: fit on every set but one, score on the one left out.

    python scripts/calibration_loso.py --model qwen2.5-coder-0.5b --sets rotten_tomatoes bbc_news sys1bench \
        sys1bench_generated --limit 150 --readouts eval/readouts/qwen0.5b --out eval/loso-qwen0.5b.json \
        [--calibration-file calibration.json]

Readouts (every answer's label masses for 3 option orders and their content-free priors) are recorded once per
set and split into --readouts (JSONL) and reused by later runs. For 1 and 3 order reads, prints per held-out set:
raw, contextual, the feature calibrator fitted in-set and with the set left out (accuracy, ECE, Brier), and writes
the JSON report. With --calibration-file, also writes the calibrator fitted on every set's train split (contextual
base, 1 read) as a calibration file for this model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from typedlm import Decider
from typedlm.decide.calibration import CalibrationFile
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
    report = {"model": decider.name, "fingerprint": decider.fingerprint, "limit": args.limit, "reads": {}}
    for reads in (1, READS):
        result = leave_one_set_out(readouts, "contextual", reads)
        report["reads"][reads] = result
        print(f"\n{decider.name}, {reads} order read(s), held-out splits\n")
        print("| set | method | answers | accuracy | ECE | Brier |\n|---|---|---:|---:|---:|---:|")
        for name, entry in result.items():
            for method, summary in entry["rows"].items():
                o = summary["overall"]
                print(f"| {name} | {method} | {o['n']} | {o['accuracy']:.3f} | {o['ece']:.3f} | {o['brier']:.3f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.calibration_file:
        train = [a for splits in readouts.values() for a in answers_of(splits["train"], "contextual", 1)]
        data = {"sets": args.sets, "split": "train", "seed": 0, "limit": args.limit, "answers": len(train)}
        file = CalibrationFile(
            decider.name, decider.fingerprint, PROMPT_VERSION, "contextual", {}, data, {}, fit_calibrators(train)
        )
        file.save(args.calibration_file)
        print(f"wrote {args.calibration_file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
