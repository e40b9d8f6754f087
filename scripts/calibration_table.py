"""Markdown tables for docs/calibration.md from `typedlm eval --out` reports: one table per held-out set.

python scripts/calibration_table.py docs/results/eval-*.json
"""

from __future__ import annotations

import json
import sys

from typedlm.offline.metrics import format_table


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        print(f"### {report['data']} — {report['split']} split, {report['examples']} examples, {report['model']}\n")
        print(format_table(report["rows"]) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
