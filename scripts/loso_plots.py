"""Reliability diagrams of a leave-one-set-out report (`typedlm.offline.shipped`'s --out, written by
`typedlm fit-shipped`): every set's held-out answers pooled, raw beside the default (each set through the
calibrator fitted without it).

    python scripts/loso_plots.py docs/results/loso-qwen2.5-coder-1.5b.json --readouts eval/readouts/qwen1.5b \
        --out docs/results/loso-qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from typedlm.core.names import CalibrationMethod
from typedlm.offline.loso import answers_of, calibrated
from typedlm.offline.metrics import reliability_plot, summarize
from typedlm.offline.readouts import load


def _as_answered(readouts: list, report: dict, args: argparse.Namespace, name: str) -> list:
    """The readouts with choice answers read the way the report's default answers them (by letter or by name)."""
    answers_by = report.get("choice_answers", "letters")
    path = Path(args.name_readouts or "") / f"{name}.held_out.jsonl"
    if answers_by == "letters" or not path.is_file():
        return readouts
    by_answer = {(r.example, r.question): r for r in load(path)}
    per_token = answers_by == "names_per_token"
    named = [by_answer.get((r.example, r.question), r) for r in readouts]
    return [replace(r, length_normalised=per_token and r.lengths is not None) for r in named]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", help="the JSON report of typedlm.offline.shipped")
    parser.add_argument("--readouts", required=True, help="the readouts folder the report was made from")
    parser.add_argument("--out", required=True, help="path prefix of the PNGs (-raw.png, -default.png)")
    parser.add_argument("--name-readouts", default=None, help="the choice readouts by name (offline.shipped's)")
    args = parser.parse_args()
    report = json.loads(Path(args.report).read_text(encoding="utf-8"))
    reads = report.get("reads", 1)
    raw, default = [], []
    for name, entry in report["held_out"].items():
        readouts = load(Path(args.readouts) / f"{name}.held_out.jsonl")
        calibrators = entry["calibrators"]["set left out"]
        bases = {kind: params.get("base", CalibrationMethod.CONTEXTUAL) for kind, params in calibrators.items()}
        # raw: options read by letter, as without a file
        raw += calibrated(answers_of(readouts, CalibrationMethod.RAW, 1), {})
        default += calibrated(answers_of(_as_answered(readouts, report, args, name), bases, reads), calibrators)
    for label, predictions in (("raw", raw), ("default", default)):
        path = reliability_plot(
            summarize(predictions),
            f"{args.out}-{label}.png",
            f"{report['model']}: {label}, every set's held-out split (set left out), {len(predictions)} answers",
        )
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
