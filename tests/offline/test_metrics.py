"""Evaluation metrics: hand-computed cases, an independent loop-based recomputation, edges and outputs.

scikit-learn, when installed, is a second reference for the binary Brier score and log-loss.
"""

from __future__ import annotations

import json
import math
import random
import re

import numpy as np
import pytest

from typedlm.offline.metrics import Prediction, format_table, reliability_plot, summarize


def noul(p_yes: float, gold: int, raw_mass: float = 1.0) -> Prediction:
    return Prediction("noul", (1 - p_yes, p_yes), gold, raw_mass)


def random_predictions(seed: int = 0, count: int = 600) -> list[Prediction]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        kind = rng.choice(["noul", "choice", "score"])
        k = 2 if kind == "noul" else rng.randint(2, 7)
        weights = [rng.random() ** rng.choice([1, 3, 8]) for _ in range(k)]
        total = sum(weights)
        out.append(Prediction(kind, tuple(w / total for w in weights), rng.randrange(k), rng.random()))
    return out


def brute_force(predictions: list[Prediction], bins: int = 15) -> dict[str, float]:
    """ECE, Brier, NLL and accuracy with plain loops, straight from the definitions."""
    sums = [[0, 0.0, 0.0] for _ in range(bins)]  # count, Σ confidence, Σ correct
    brier = nll = hits = 0.0
    for p in predictions:
        best = 0
        for k in range(len(p.probabilities)):
            if p.probabilities[k] > p.probabilities[best]:
                best = k
        confidence = p.probabilities[best]
        b = min(int(confidence * bins), bins - 1)
        sums[b][0] += 1
        sums[b][1] += confidence
        sums[b][2] += 1.0 if best == p.gold else 0.0
        hits += 1.0 if best == p.gold else 0.0
        for k, q in enumerate(p.probabilities):
            brier += (q - (1.0 if k == p.gold else 0.0)) ** 2
        nll += -math.log(max(p.probabilities[p.gold], 1e-12))
    n = len(predictions)
    ece = sum(c / n * abs(s_acc / c - s_conf / c) for c, s_conf, s_acc in sums if c)
    return {"ece": ece, "brier": brier / n, "nll": nll / n, "accuracy": hits / n}


def test_two_bins_by_hand():
    predictions = [
        Prediction("choice", (0.4, 0.3, 0.3), 0, 0.9),  # confidence 0.4, bin 0, right
        Prediction("choice", (0.2, 0.3, 0.5), 0, 0.8),  # confidence 0.5, bin 1 (lower edge), wrong
        Prediction("choice", (0.1, 0.9, 0.0), 1, 0.7),  # confidence 0.9, bin 1, right
        Prediction("choice", (0.3, 0.3, 0.4), 1, 0.6),  # confidence 0.4, bin 0, wrong
    ]
    s = summarize(predictions, bins=2)["choice"]
    # bin 0: confidence 0.4, accuracy 0.5; bin 1: confidence 0.7, accuracy 0.5 → ECE = ½·0.1 + ½·0.2
    assert s["ece"] == pytest.approx(0.15)
    assert s["accuracy"] == 0.5
    assert s["brier"] == pytest.approx((0.54 + 0.98 + 0.02 + 0.74) / 4)
    assert s["nll"] == pytest.approx(-(math.log(0.4) + math.log(0.2) + math.log(0.9) + math.log(0.3)) / 4)
    assert s["mean_raw_mass"] == pytest.approx(0.75)
    assert s["reliability"] == [
        {"lo": 0.0, "hi": 0.5, "count": 2, "confidence": pytest.approx(0.4), "accuracy": 0.5},
        {"lo": 0.5, "hi": 1.0, "count": 2, "confidence": pytest.approx(0.7), "accuracy": 0.5},
    ]
    assert s["coverage"] == {
        "0.5": {"coverage": 0.5, "accuracy": 0.5},
        "0.8": {"coverage": 0.25, "accuracy": 1.0},
        "0.9": {"coverage": 0.25, "accuracy": 1.0},  # ≥ t, so 0.9 counts
    }


def test_exactly_calibrated_bin_has_zero_ece():
    predictions = [noul(0.8, 1)] * 8 + [noul(0.8, 0)] * 2
    s = summarize(predictions)["noul"]
    assert s["ece"] == pytest.approx(0.0, abs=1e-12)
    assert s["accuracy"] == pytest.approx(0.8)
    # multi-class Brier: right → 2·0.2², wrong → 2·0.8²; the binary Brier is half of it
    assert s["brier"] == pytest.approx((8 * 2 * 0.04 + 2 * 2 * 0.64) / 10)


def test_calibrated_sample_has_small_ece():
    rng = random.Random(1)
    predictions = []
    for _ in range(20000):
        q = rng.random()
        predictions.append(noul(q, 1 if rng.random() < q else 0))
    assert summarize(predictions)["overall"]["ece"] < 0.02


def test_confidently_wrong_has_ece_one():
    s = summarize([noul(1.0, 0), noul(0.0, 1), Prediction("score", (0.0, 0.0, 1.0), 0, 1.0)])["overall"]
    assert s["ece"] == pytest.approx(1.0)
    assert s["accuracy"] == 0.0
    assert s["brier"] == pytest.approx(2.0)
    assert s["nll"] == pytest.approx(-math.log(1e-12))  # clipped, finite
    assert s["reliability"][-1]["count"] == 3


def test_confidence_one_goes_in_the_last_bin():
    s = summarize([Prediction("choice", (0.0, 1.0, 0.0), 1, 1.0)], bins=15)["overall"]
    last = s["reliability"][-1]
    assert (last["lo"], last["hi"], last["count"]) == (pytest.approx(14 / 15), 1.0, 1)
    assert sum(b["count"] for b in s["reliability"]) == 1
    assert s["ece"] == 0.0
    assert s["reliability"][0] == {
        "lo": 0.0,
        "hi": pytest.approx(1 / 15),
        "count": 0,
        "confidence": None,
        "accuracy": None,
    }


def test_ties_go_to_the_lowest_index():
    assert summarize([noul(0.5, 0)])["overall"]["accuracy"] == 1.0
    assert summarize([noul(0.5, 1)])["overall"]["accuracy"] == 0.0
    assert summarize([Prediction("choice", (0.2, 0.4, 0.4), 1, 1.0)])["overall"]["accuracy"] == 1.0
    assert summarize([Prediction("choice", (0.2, 0.4, 0.4), 2, 1.0)])["overall"]["accuracy"] == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_brute_force(seed):
    predictions = random_predictions(seed)
    summary = summarize(predictions)
    for group, subset in [("overall", predictions)] + [
        (kind, [p for p in predictions if p.kind == kind]) for kind in ("noul", "choice", "score")
    ]:
        expected = brute_force(subset)
        assert summary[group]["n"] == len(subset)
        for key, value in expected.items():
            assert summary[group][key] == pytest.approx(value, abs=1e-12), (group, key)
        assert summary[group]["mean_raw_mass"] == pytest.approx(sum(p.raw_mass for p in subset) / len(subset))


def test_binary_matches_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    predictions = [p for p in random_predictions(3) if p.kind == "noul"]
    y = [p.gold for p in predictions]
    p_yes = [p.probabilities[1] for p in predictions]
    s = summarize(predictions)["noul"]
    assert s["brier"] == pytest.approx(2 * sklearn_metrics.brier_score_loss(y, p_yes), abs=1e-12)
    assert s["nll"] == pytest.approx(sklearn_metrics.log_loss(y, p_yes, labels=[0, 1]), abs=1e-9)
    assert s["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(y, [int(q > 0.5) for q in p_yes]))


def test_only_present_kinds_are_reported():
    s = summarize([noul(0.7, 1), Prediction("score", (0.1, 0.2, 0.7), 2, 0.5)])
    assert list(s) == ["overall", "noul", "score"]
    assert s["overall"]["n"] == 2


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Prediction("noul", (0.3, 0.6), 1, 1.0), "sum to"),
        (Prediction("choice", (0.5, 0.5 + 2e-6), 1, 1.0), "sum to"),
        (Prediction("choice", (0.5, 0.5), 2, 1.0), "gold"),
        (Prediction("choice", (0.5, 0.5), -1, 1.0), "gold"),
        (Prediction("choice", (1.5, -0.5), 0, 1.0), "non-negative"),
        (Prediction("choice", (float("nan"), 1.0), 0, 1.0), "finite"),
        (Prediction("noul", (0.2, 0.3, 0.5), 0, 1.0), "noul"),
        (Prediction("rank", (0.5, 0.5), 0, 1.0), "unknown kind"),
    ],
)
def test_invalid_prediction_names_its_index(bad, message):
    with pytest.raises(ValueError, match=rf"prediction 2\b.*{message}"):
        summarize([noul(0.9, 1), noul(0.1, 0), bad])


def test_within_tolerance_is_accepted():
    assert summarize([Prediction("choice", (0.5, 0.5 + 5e-7), 1, 1.0)])["overall"]["n"] == 1


def test_empty_input_is_an_error():
    with pytest.raises(ValueError, match="no predictions"):
        summarize([])


def plain_types_only(value) -> bool:
    if isinstance(value, dict):
        return all(type(k) is str and plain_types_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(plain_types_only(v) for v in value)
    return value is None or type(value) in (int, float, str)  # no numpy scalars (np.float64 is a float subclass)


def test_summary_is_plain_json():
    summary = summarize(random_predictions(4, count=50))
    assert plain_types_only(summary)
    assert json.loads(json.dumps(summary)) == summary


@pytest.mark.parametrize("kinds", [("noul", "choice", "score"), ("noul",)])
def test_reliability_plot_writes_a_png(tmp_path, kinds):
    summary = summarize([p for p in random_predictions(5) if p.kind in kinds])
    path = reliability_plot(summary, tmp_path / "reliability.png", title="test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_format_table_is_a_markdown_table():
    summaries = {"base": summarize(random_predictions(6, count=100)), "tiny": summarize([noul(0.6, 1)])}
    lines = format_table(summaries).splitlines()
    assert len(lines) == 2 + 4 + 2  # header, rule, base: overall + 3 kinds, tiny: overall + noul
    columns = {line.count("|") for line in lines}
    assert columns == {11}
    assert all(line.startswith("|") and line.endswith("|") for line in lines)
    assert re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[1])
    assert lines[0].split("|")[1:-1][2].strip() == "n"
    tiny = [c.strip() for c in lines[-1].split("|")[1:-1]]
    assert tiny[:3] == ["tiny", "noul", "1"]
    assert tiny[7:9] == ["0.000", "–"]  # nothing reached confidence 0.8


def test_format_table_without_the_08_threshold():
    line = format_table({"x": summarize([noul(0.9, 1)], thresholds=(0.5,))}).splitlines()[-1]
    assert [c.strip() for c in line.split("|")[1:-1]][7:9] == ["–", "–"]


def test_the_ece_floor_is_the_ece_of_outcomes_drawn_from_the_confidences_themselves():
    from typedlm.offline.metrics import ece_floor

    rng = np.random.default_rng(3)
    conf = rng.uniform(0.5, 1.0, 200)
    predictions = [Prediction("noul", (c, 1 - c), 0, 1.0) for c in conf]
    floor = ece_floor(predictions, draws=30, seed=7)
    # brute force: the same draws, each scored by `summarize` as real outcomes
    drawn = np.random.default_rng(7).random((30, conf.size)) < conf
    eces = [
        summarize([Prediction("noul", (c, 1 - c), 0 if right else 1, 1.0) for c, right in zip(conf, row)])["overall"][
            "ece"
        ]
        for row in drawn
    ]
    assert floor["mean"] == pytest.approx(np.mean(eces), abs=1e-12)
    assert floor["share_at_most_0.05"] == pytest.approx(np.mean(np.array(eces) <= 0.05))
    # more answers, lower floor (it falls roughly as 1/sqrt(n))
    many = [Prediction("noul", (c, 1 - c), 0, 1.0) for c in rng.uniform(0.5, 1.0, 5000)]
    assert ece_floor(many)["mean"] < floor["mean"] / 3
