"""A model's table in docs/calibration.md from its leave-one-set-out report and its readouts by letter: per set,
raw and contextual as a model without a file reads them (options by letter, one read), then from the report raw
with options read the default's way, the default fitted in-set and the default with the set left out.

    python scripts/loso_table.py docs/results/loso-qwen2.5-coder-0.5b.json --readouts eval/readouts/qwen0.5b

Prints the Markdown table; bold marks a left-out ECE of at most 0.05.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from typedlm.core.names import CalibrationMethod, Kind
from typedlm.offline.loso import answers_of, calibrated
from typedlm.offline.metrics import summarize
from typedlm.offline.readouts import load

TARGET_ECE = 0.05


def _cells(summary: dict, brier: bool = False) -> str:
    o = summary["overall"]
    return f"{o['accuracy']:.3f} / {o['ece']:.3f}" + (f" / {o['brier']:.3f}" if brier else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report")
    parser.add_argument("--readouts", required=True, help="the folder of readouts by letter the report was made from")
    args = parser.parse_args()
    report = json.loads(Path(args.report).read_text(encoding="utf-8"))
    print(
        "| set | answers | raw, by letter: acc / ECE / Brier | raw, options by name: acc / ECE | contextual acc / ECE "
        "| default in-set acc / ECE | default, set left out: acc / ECE / Brier |"
    )
    print("|---|---:|---|---|---|---|---|")
    for name, entry in report["held_out"].items():
        readouts = load(Path(args.readouts) / f"{name}.held_out.jsonl")
        by_letter = {
            m: summarize(calibrated(answers_of(readouts, m, 1), {}))
            for m in (CalibrationMethod.RAW, CalibrationMethod.CONTEXTUAL)
        }
        rows = entry["rows"]
        named = _cells(rows["raw"]) if any(r.kind == Kind.CHOICE for r in readouts) else "-"
        left_out = rows["calibrated, set left out"]
        ece = f"{left_out['overall']['ece']:.3f}"
        shown = _cells(left_out, brier=True)
        if left_out["overall"]["ece"] <= TARGET_ECE:
            shown = shown.replace(f"/ {ece} /", f"/ **{ece}** /")
        print(
            f"| {name} | {left_out['overall']['n']} | {_cells(by_letter[CalibrationMethod.RAW], brier=True)} | {named} "
            f"| {_cells(by_letter[CalibrationMethod.CONTEXTUAL])} | {_cells(rows['calibrated, in-set'])} | {shown} |"
        )


if __name__ == "__main__":
    main()
