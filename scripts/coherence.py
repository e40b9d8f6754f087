"""Coherence of a model's probabilities on questions derived from labeled sets (see `typedlm.offline.coherence`):
negation pairs, one-vs-rest partitions of choice questions, conjunctions with a condition that always holds.

    python scripts/coherence.py --model qwen2.5-coder-1.5b --sets rotten_tomatoes boolq bbc_news arc \
        --readouts eval/readouts/qwen1.5b --out eval/coherence-qwen1.5b.json [--calibration-file FILE] [--limit 100]

Readouts of the derived questions are recorded once per set (from its held-out split) into --readouts as
SET.coherence.jsonl and reused. Each answer's P(yes) is then computed raw, contextual and with the model's
default calibration (its shipped file, or --calibration-file), and scored against answering 0.5 to everything.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from typedlm.calibrate.calibration import CalibrationFile, shipped_calibration
from typedlm.core.names import CalibrationMethod, Kind
from typedlm.offline.coherence import baseline, coherence, derive
from typedlm.offline.evaluate import load_examples
from typedlm.offline.loso import yes_probabilities
from typedlm.offline.readouts import Readout, load, record, save
from typedlm.runtime.catalog import EMBEDDED, named_model


def p_yes(readouts: list[Readout], method: str, file: CalibrationFile | None = None) -> dict[tuple[str, str], float]:
    """P(yes) of every (noul) readout under `method`, or under `file`'s calibrator on its base."""
    if file is None:
        return yes_probabilities(readouts, method, {})
    return yes_probabilities(readouts, {Kind.NOUL: file.base_of(Kind.NOUL)}, file.calibrator)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--sets", nargs="+", required=True)
    parser.add_argument("--limit", type=int, default=100, help="held-out examples per set")
    parser.add_argument("--readouts", required=True, help="folder of recorded readouts (made if missing)")
    parser.add_argument("--calibration-file", default=None, help="default: the file shipped for the model")
    parser.add_argument("--out", required=True, help="JSON report")
    args = parser.parse_args()
    named = named_model(args.model) if args.model else EMBEDDED
    name = named.name if named else args.model
    file = CalibrationFile.load(args.calibration_file) if args.calibration_file else shipped_calibration(name)
    folder, decider, readouts = Path(args.readouts), None, {}
    for set_name in args.sets:
        path = folder / f"{set_name}.coherence.jsonl"
        if not path.is_file():
            if decider is None:
                from typedlm import Decider

                decider = Decider.load(args.model, calibration=CalibrationMethod.RAW)
            examples = derive(load_examples(set_name, "held_out", args.limit, 0))
            save(path, record(decider, examples, set_name, 1))
            print(f"recorded {path}", file=sys.stderr, flush=True)
        readouts[set_name] = [r for r in load(path) if r.kind == Kind.NOUL]
    methods: dict[str, CalibrationFile | None] = {CalibrationMethod.RAW: None, CalibrationMethod.CONTEXTUAL: None}
    if file is not None:
        methods["default"] = file
    report: dict = {"model": name, "calibration_file": file.data.get("variant") if file else None, "sets": {}}
    print(f"| set | check | n | 0.5 everywhere | {' | '.join(methods)} |\n|---|---|---:|---:|" + "---:|" * len(methods))
    for set_name, rows in readouts.items():
        scores = {m: coherence(p_yes(rows, m, f)) for m, f in methods.items()}
        scores["0.5 everywhere"] = baseline([(r.example, r.question) for r in rows])
        report["sets"][set_name] = scores
        for check, base in scores["0.5 everywhere"].items():
            cells = " | ".join(f"{scores[m][check]['mean_gap']:.3f}" for m in methods)
            print(f"| {set_name} | {check} | {base['n']} | {base['mean_gap']:.3f} | {cells} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
