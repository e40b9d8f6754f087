"""Would reading a yes/no question together with its negation make a better answer? A measurement on the
negation pairs already recorded for the calibration's selection (`coherence.negations` of each train split).

    python scripts/negation_contrast.py --readouts docs/results/readouts/qwen2.5-coder-1.5b/negations/1-letters \
        --out docs/results/negation-contrast-qwen2.5-coder-1.5b.json

The *contrast* readout answers q with sigmoid((logit P(yes | q) - logit P(yes | not q)) / 2): the pair's shared
lean cancels, and if reading "not (not q)" gave q's logit back, a question and its negation would sum to 1 by
construction. Any monotone calibration of a readout keeps its ranking, so its ROC AUC is the most any calibrator
on top of it can separate yes from no; accuracy at 0.5 is reported beside it. Both on raw and on the contrast.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from typedlm.core.names import CalibrationMethod, Kind
from typedlm.offline.coherence import NEGATED
from typedlm.offline.readouts import Readout, load


def _logit(readout: Readout) -> float:
    p_yes = min(max(readout.base(CalibrationMethod.RAW, 1)[0][0], 1e-9), 1 - 1e-9)
    return math.log(p_yes / (1 - p_yes))


def pairs(readouts: list[Readout]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logit of q, logit of not q, gold: 1 where q's answer is yes) for every question recorded with its negation."""
    by_example: dict[str, dict[str, Readout]] = defaultdict(dict)
    for readout in readouts:
        if readout.kind == Kind.NOUL:
            by_example[readout.example][readout.question] = readout
    asked, negated, gold = [], [], []
    for questions in by_example.values():
        for qid, readout in questions.items():
            negation = questions.get(f"{qid}.{NEGATED}")
            if negation is not None:
                asked.append(_logit(readout))
                negated.append(_logit(negation))
                gold.append(1 if readout.gold == 0 else 0)  # a yes/no answer's index 0 is "yes"
    return np.array(asked), np.array(negated), np.array(gold)


def scores(logits: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    return {"accuracy": float(((logits > 0) == (gold == 1)).mean()), "auc": float(roc_auc_score(gold, logits))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readouts", required=True, help="folder of SET.train.jsonl.gz negation readouts")
    parser.add_argument("--out", required=True, help="JSON report")
    args = parser.parse_args()
    report: dict = {"readouts": args.readouts, "sets": {}}
    print("| set | pairs | share yes | raw accuracy | raw AUC | contrast accuracy | contrast AUC | raw pair gap |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in sorted(Path(args.readouts).glob("*.train.jsonl*")):
        asked, negated, gold = pairs(load(path))
        if len(gold) == 0 or gold.min() == gold.max():
            continue
        p_asked, p_negated = 1 / (1 + np.exp(-asked)), 1 / (1 + np.exp(-negated))
        row = {
            "pairs": len(gold),
            "share_yes": float(gold.mean()),
            "raw": scores(asked, gold),
            "contrast": scores((asked - negated) / 2, gold),
            "raw_pair_gap": float(np.abs(p_asked + p_negated - 1).mean()),
        }
        name = path.name.split(".")[0]
        report["sets"][name] = row
        raw, contrast = row["raw"], row["contrast"]
        print(
            f"| {name} | {row['pairs']} | {row['share_yes']:.2f} | {raw['accuracy']:.3f} | {raw['auc']:.3f}"
            f" | {contrast['accuracy']:.3f} | {contrast['auc']:.3f} | {row['raw_pair_gap']:.3f} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
