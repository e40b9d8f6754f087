"""Evaluation metrics for scored typed answers: accuracy, calibration, proper scores, coverage.

Input is one `Prediction` per (example, question): the probabilities over the question's classes
(noul: (p_yes, p_no), so class 0 = yes, as `typedlm.core.questions.YES`), the index of the true class,
and the raw mass the model put on any answer token before normalisation. `summarize` returns, for "overall"
and for each kind present ("noul", "choice", "score"), a dict of plain floats/ints/None (JSON-serialisable):

- accuracy: argmax == gold; ties go to the lowest index (numpy's argmax).
- confidence: the top-label probability max_k p_k (also for noul, so it lies in [0.5, 1]).
- ece: top-label expected calibration error, Σ_b (n_b / N)·|accuracy_b − mean confidence_b|, over
  `bins` equal-width bins of [0, 1]. A confidence c goes in bin min(floor(c·bins), bins − 1): bins are
  [lo, hi) except the last, which is [lo, 1], so a confidence of exactly 1.0 is in the last bin.
- brier: multi-class Brier score, mean over predictions of Σ_k (p_k − [k == gold])², in [0, 2].
  The same convention for every kind: for noul it is 2× the binary Brier (p_yes − y)².
- nll: mean of −log p_gold, with p_gold clipped below at 1e-12.
- coverage: per threshold t (key f"{t:g}", e.g. "0.8"): the fraction with confidence ≥ t and the
  accuracy among those (None when there are none).
- mean_raw_mass: mean of raw_mass.
- reliability: one entry per bin, {"lo", "hi", "count", "confidence", "accuracy"}; the last two are
  means over the bin and None for an empty bin. This is the data of the reliability diagram.

`ece_floor` answers "how low can the ECE of these predictions be, measured on this few answers?": the ECE a model
whose probabilities were exactly right would show with the same confidences, over redrawn outcomes. ECE is a
biased estimate (each bin's |accuracy − confidence| is positive even when their expectations agree), so on a few
hundred answers spread over many bins a perfectly calibrated model measures 0.03–0.07.

Probabilities must be finite, non-negative and sum to 1 within 1e-6; a bad prediction is a
ValueError naming its index. `reliability_plot` draws the diagrams to a PNG with matplotlib's Agg
canvas (no display, no pyplot); `format_table` renders summaries as a GitHub Markdown table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from typedlm.calibrate.reliability import floor_eces
from typedlm.core.names import Kind

KINDS = tuple(Kind)
SUM_TOLERANCE = 1e-6
NLL_FLOOR = 1e-12


@dataclass(frozen=True)
class Prediction:
    kind: str  # "noul" | "choice" | "score"
    probabilities: tuple[float, ...]  # over the classes; noul: (p_yes, p_no)
    gold: int  # index of the true class (noul: 0 = yes)
    raw_mass: float  # mass on any answer token before normalisation


def _check(i: int, p: Prediction) -> np.ndarray:
    if p.kind not in KINDS:
        raise ValueError(
            f"prediction {i}: unknown kind {p.kind!r}, expected one of {tuple(kind.value for kind in KINDS)}"
        )
    probs = np.asarray(p.probabilities, dtype=np.float64)  # [K]
    if probs.ndim != 1 or probs.size < 2 or (p.kind == Kind.NOUL and probs.size != 2):
        raise ValueError(f"prediction {i}: {p.kind} needs {'2' if p.kind == Kind.NOUL else '≥ 2'} probabilities")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise ValueError(f"prediction {i}: probabilities must be finite and non-negative")
    if abs(float(probs.sum()) - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"prediction {i}: probabilities sum to {float(probs.sum())!r}, not 1")
    if isinstance(p.gold, bool) or not isinstance(p.gold, (int, np.integer)) or not 0 <= p.gold < probs.size:
        raise ValueError(f"prediction {i}: gold {p.gold!r} is not a class index in [0, {probs.size})")
    return probs


def _group(
    conf: np.ndarray,
    correct: np.ndarray,
    brier: np.ndarray,
    nll: np.ndarray,
    raw: np.ndarray,
    bins: int,
    thresholds: Sequence[float],
) -> dict[str, Any]:
    n = int(conf.size)
    which = np.minimum(np.floor(conf * bins).astype(np.int64), bins - 1)  # [N] bin index per prediction
    reliability, ece = [], 0.0
    for b in range(bins):
        in_bin = which == b
        count = int(in_bin.sum())
        mean_conf = float(conf[in_bin].mean()) if count else None
        mean_acc = float(correct[in_bin].mean()) if count else None
        if count:
            ece += count / n * abs(mean_acc - mean_conf)
        reliability.append(
            {"lo": b / bins, "hi": (b + 1) / bins, "count": count, "confidence": mean_conf, "accuracy": mean_acc}
        )
    coverage = {}
    for t in thresholds:
        kept = conf >= t
        coverage[f"{t:g}"] = {
            "coverage": float(kept.mean()),
            "accuracy": float(correct[kept].mean()) if kept.any() else None,
        }
    return {
        "n": n,
        "accuracy": float(correct.mean()),
        "ece": float(ece),
        "brier": float(brier.mean()),
        "nll": float(nll.mean()),
        "coverage": coverage,
        "mean_raw_mass": float(raw.mean()),
        "reliability": reliability,
    }


def summarize(
    predictions: Sequence[Prediction], *, bins: int = 15, thresholds: Sequence[float] = (0.5, 0.8, 0.9)
) -> dict[str, dict[str, Any]]:
    """Metrics overall and per kind (see the module docstring for each metric).

    Args:
        predictions: one per (example, question); at least one.
        bins: number of equal-width confidence bins for ECE and the reliability data.
        thresholds: confidence thresholds for the coverage/accuracy trade-off.

    Returns:
        {"overall": {...}, "<kind>": {...} for each kind present, in the order noul, choice, score}.
    """
    if len(predictions) == 0:
        raise ValueError("no predictions to summarize")
    if bins < 1:
        raise ValueError(f"bins must be ≥ 1, got {bins}")
    conf, correct, brier, nll = (np.empty(len(predictions)) for _ in range(4))  # [N] each
    for i, p in enumerate(predictions):
        probs = _check(i, p)  # [K]
        onehot = np.zeros_like(probs)  # [K]
        onehot[p.gold] = 1.0
        conf[i] = probs.max()
        correct[i] = float(int(np.argmax(probs)) == p.gold)  # argmax: first index among ties
        brier[i] = float(((probs - onehot) ** 2).sum())
        nll[i] = -math.log(max(float(probs[p.gold]), NLL_FLOOR))
    raw = np.array([float(p.raw_mass) for p in predictions])  # [N]
    kinds = np.array([p.kind for p in predictions])  # [N]
    out = {"overall": _group(conf, correct, brier, nll, raw, bins, thresholds)}
    for kind in KINDS:
        m = kinds == kind
        if m.any():
            out[kind.value] = _group(conf[m], correct[m], brier[m], nll[m], raw[m], bins, thresholds)  # plain keys
    return out


def ece_floor(
    predictions: Sequence[Prediction], *, bins: int = 15, draws: int = 400, seed: int = 0, at_most: float = 0.05
) -> dict[str, float]:
    """The ECE of a perfectly calibrated model with these predictions' confidences: each top answer drawn right
    with probability its confidence, `draws` times. Returns the mean, the 90th percentile and the share of draws
    whose ECE is ≤ `at_most` (how often a model that is exactly right would pass that bar on this many answers)."""
    conf = np.array([max(p.probabilities) for p in predictions])  # [N]
    eces = floor_eces(conf, bins, draws, seed)
    return {
        "mean": float(eces.mean()),
        "p90": float(np.quantile(eces, 0.9)),
        f"share_at_most_{at_most:g}": float((eces <= at_most).mean()),
    }


def set_panels(
    names: Sequence[str], draw: Callable[[Any, str], None], path: str | Path, title: str, legend_size: int = 7
) -> None:
    """Write a PNG of one panel per labeled set, four to a row, each drawn by `draw(axes, name)` against the labels
    posted (K), the first panel's legend; as `reliability_plot`, on matplotlib's Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = 4
    rows = (len(names) + columns - 1) // columns
    fig = Figure(figsize=(3.4 * columns, 2.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, name in zip(axes.flat, names):
        draw(ax, name)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("labels posted (K)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=legend_size)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)


def reliability_plot(summary: Mapping[str, Mapping[str, Any]], path: str | Path, title: str = "Reliability") -> Path:
    """Write a PNG of reliability diagrams: one column per group ("overall" first), counts underneath.

    Each panel: accuracy per confidence bin as bars (shaded by the bin's share of predictions), the
    mean confidence per bin as dots, the diagonal of perfect calibration, and ECE in the panel title.
    Uses matplotlib's Agg canvas directly, so it works headless and leaves pyplot's state alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [k for k in ("overall", *KINDS) if k in summary]
    fig = Figure(figsize=(4.2 * len(names), 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(names), squeeze=False, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for col, name in enumerate(names):
        s, top, bottom = summary[name], axes[0][col], axes[1][col]
        rel = s["reliability"]
        lefts = [r["lo"] for r in rel]
        widths = [r["hi"] - r["lo"] for r in rel]
        counts = [r["count"] for r in rel]
        share = [c / max(1, s["n"]) for c in counts]
        accs = [r["accuracy"] if r["accuracy"] is not None else 0.0 for r in rel]
        colors = [(0.12, 0.35, 0.75, 0.25 + 0.75 * min(1.0, 3 * f)) for f in share]
        top.bar(lefts, accs, width=widths, align="edge", color=colors, edgecolor="black", linewidth=0.5)
        filled = [(r["lo"] + r["hi"]) / 2 for r in rel if r["count"]], [r["confidence"] for r in rel if r["count"]]
        top.plot(*filled, "o", color="tab:red", markersize=3, label="mean confidence")
        top.plot([0, 1], [0, 1], "--", color="gray", linewidth=1, label="perfect calibration")
        top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy", title=f"{name} (n={s['n']}) ECE={s['ece']:.3f}")
        top.legend(loc="upper left", fontsize=7)
        bottom.bar(lefts, counts, width=widths, align="edge", color="gray", edgecolor="black", linewidth=0.5)
        bottom.set(xlabel="confidence (max probability)", ylabel="count")
    fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, format="png", dpi=110)
    return path


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def format_table(summaries: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """A GitHub Markdown table, one row per (name, group) of `{name: summarize(...)}`.

    Columns: n, accuracy, ECE, Brier, NLL, coverage and accuracy at confidence ≥ 0.8 (both "–" when
    0.8 was not a threshold; the accuracy "–" when nothing reached it), mean raw mass. The columns
    are padded, so it reads as is in a terminal.
    """
    header = ["name", "kind", "n", "accuracy", "ECE", "Brier", "NLL", "cov@0.8", "acc@0.8", "raw mass"]
    rows = []
    for name, summary in summaries.items():
        for kind in [k for k in ("overall", *KINDS) if k in summary]:
            s = summary[kind]
            at = s["coverage"].get("0.8", {})
            rows.append(
                [
                    name,
                    kind,
                    _cell(s["n"]),
                    _cell(s["accuracy"]),
                    _cell(s["ece"]),
                    _cell(s["brier"]),
                    _cell(s["nll"]),
                    _cell(at.get("coverage")),
                    _cell(at.get("accuracy")),
                    _cell(s["mean_raw_mass"]),
                ]
            )
    cells = [[str(c).replace("|", "\\|") for c in row] for row in [header, *rows]]
    widths = [max(len(row[j]) for row in cells) for j in range(len(header))]
    left = {0, 1}  # text columns; numbers right-aligned

    def line(row: list[str]) -> str:
        return (
            "| "
            + " | ".join(c.ljust(w) if j in left else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths)))
            + " |"
        )

    rule = "|" + "|".join(("-" * (w + 1) + ":") if j not in left else "-" * (w + 2) for j, w in enumerate(widths)) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])
