"""Prompt wordings side by side, from `typedlm fit-shipped --select-only` reports (`typedlm.offline.shipped`;
one per wording, each run on readouts recorded in that wording): the variant each would ship, its selection score
(mean + worst ECE over the sets left out, mean over kinds: lower is better) and, per kind, its mean accuracy over
the sets. Train splits only.

    python scripts/compare_wordings.py eval/wording-q05-1.json eval/wording-q05-2-system.json ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from typedlm.offline.metrics import KINDS


def _plan(chosen: str) -> tuple[str, dict[str, str]]:
    """(setting, kind → selection label) of a report's "chosen" line ("SETTING; kind: label; ...")."""
    setting, *parts = chosen.split("; ")
    return setting, dict(part.split(": ", 1) for part in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+")
    args = parser.parse_args()
    print("| wording | score | " + " | ".join(f"{kind} accuracy" for kind in KINDS) + " | chosen |")
    print("|---|---:|" + "---:|" * len(KINDS) + "---|")
    for path in args.reports:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        setting, plan = _plan(report["chosen"])
        by_label = report["selection"][setting]
        accuracy = [f"{by_label[plan[kind]][kind]['accuracy']:.3f}" if kind in plan else "-" for kind in KINDS]
        print(f"| {report['prompt_version']} | {report['score']:.3f} | {' | '.join(accuracy)} | {report['chosen']} |")


if __name__ == "__main__":
    main()
