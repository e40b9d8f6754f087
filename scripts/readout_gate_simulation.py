"""How often the learned readout's gate (`typedlm.calibrate.readout_fit.choose`) lets a readout in, on synthetic labels
whose true probabilities are known: features of pure noise (it should, at most, in 5% of draws) and features that
carry the answer (it should, in most).

    nice python scripts/readout_gate_simulation.py --out docs/results/readout-gate.json

Each draw: true logits N(0, `SPREAD`²) per answer and label, gold drawn from their softmax; the calibrated answer
(the base) is softmax(true logits / T) with T = 0.6 (over-confident), 1.6 (under-confident) or 1 (exact); features
[N, 256] standard normal, and for the signal check shifted by each of `--signals` along a random unit direction per
answer within the first `SIGNAL_DIMS` dimensions. The share of draws in which `choose` returns a readout is given
with its Clopper-Pearson 95% interval; every draw is seeded by (seed, cell, draw).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

from typedlm.calibrate.level_fit import softmax
from typedlm.calibrate.readout_fit import MARGIN_Z, choose

SPREAD = 1.5  # the true logits' standard deviation (a 2-answer task's top answer right about 78% of the time)
BASES = {"over-confident": 0.6, "under-confident": 1.6, "exact": 1.0}  # the base's temperature on the true logits
SIGNAL_DIMS = 4


def draw(rng: np.random.Generator, labels: int, answers: int, base: float, dims: int, signal: float):
    """(offsets [N, n], features [N, d], gold [N]) of one draw (see the module)."""
    true = rng.normal(0.0, SPREAD, (labels, answers))  # [N, n]
    probs = softmax(true)  # [N, n]
    gold = np.minimum((rng.random(labels)[:, None] > probs.cumsum(axis=1)).sum(axis=1), answers - 1)  # [N]
    offsets = np.log(softmax(true / base))  # [N, n]
    features = rng.standard_normal((labels, dims))  # [N, d]
    if signal:
        directions = rng.standard_normal((answers, SIGNAL_DIMS))  # [n, s]
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        features[:, :SIGNAL_DIMS] += signal * directions[gold]
    return offsets, features, gold


def cell(seed: int, index: int, draws: int, labels: int, answers: int, base: float, dims: int, signal: float, z: float):
    """The number of `draws` in which a readout passed the gate (margin `z`), each draw seeded by (seed, index,
    draw)."""
    passed = 0
    for d in range(draws):
        rng = np.random.default_rng([seed, index, d])
        passed += choose(*draw(rng, labels, answers, base, dims, signal), margin_z=z) is not None
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--draws", type=int, default=200, help="draws per noise cell")
    parser.add_argument("--signal-draws", type=int, default=100, help="draws per signal cell")
    parser.add_argument("--labels", type=int, nargs="+", default=[120, 300])
    parser.add_argument("--answers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument(
        "--signals", type=float, nargs="+", default=[1.0, 1.5, 2.0], help="shifts along the gold answer's direction"
    )
    parser.add_argument("--margin-z", type=float, default=MARGIN_Z, help="the gate's margin (`choose`'s default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cells = []
    grid = itertools.product((0.0, *args.signals), args.labels, args.answers, BASES.items())
    for index, (signal, labels, answers, (name, base)) in enumerate(grid):
        draws = args.signal_draws if signal else args.draws
        passed = cell(args.seed, index, draws, labels, answers, base, args.dims, signal, args.margin_z)
        interval = binomtest(passed, draws).proportion_ci(0.95, method="exact")
        row = {
            "features": "signal" if signal else "noise",
            "signal": signal,
            "labels": labels,
            "answers": answers,
            "base": name,
            "base_temperature": base,
            "draws": draws,
            "passed": passed,
            "share": passed / draws,
            "interval": [round(interval.low, 4), round(interval.high, 4)],
        }
        cells.append(row)
        print(json.dumps(row), flush=True)
    settings = {
        "margin_z": args.margin_z,
        "spread": SPREAD,
        "dims": args.dims,
        "signals": args.signals,
        "seed": args.seed,
    }
    settings["signal_dims"] = SIGNAL_DIMS
    noise = [c for c in cells if c["features"] == "noise"]
    total = sum(c["passed"] for c in noise), sum(c["draws"] for c in noise)
    summary = {"noise_passed": total[0], "noise_draws": total[1], "noise_share": total[0] / total[1]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": settings, "summary": summary, "cells": cells}, indent=1) + "\n")


if __name__ == "__main__":
    main()
