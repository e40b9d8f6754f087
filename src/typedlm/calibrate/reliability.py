"""How well confidences match outcomes: top-answer ECE, its reliability bins, and its noise floor.

    ece(confidences, correct)            # Σ_b n_b/N · |accuracy_b − confidence_b| over `BINS` equal bins
    floor_eces(confidences)              # the ECE of many draws of a perfectly calibrated model with these
                                         # confidences: its 90th percentile is what sampling alone allows

Plain numpy, used by the feedback report (`typedlm.calibrate.feedback`) and by the offline metrics
(`typedlm.offline.metrics`), so both measure the same way.
"""

from __future__ import annotations

import numpy as np

BINS = 15
FLOOR_DRAWS = 400


def _bin_of(confidences: np.ndarray, bins: int) -> np.ndarray:
    return np.minimum(np.floor(confidences * bins).astype(np.int64), bins - 1)


def ece(confidences: np.ndarray, correct: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error of top answers: confidences [N] in [0, 1], correct [N] booleans."""
    confidences = np.asarray(confidences, dtype=np.float64)
    if confidences.size == 0:
        return 0.0
    which = _bin_of(confidences, bins)
    right = np.bincount(which, weights=np.asarray(correct, dtype=np.float64), minlength=bins)
    sure = np.bincount(which, weights=confidences, minlength=bins)
    return float(np.abs(right - sure).sum() / confidences.size)


def floor_eces(confidences: np.ndarray, bins: int = BINS, draws: int = FLOOR_DRAWS, seed: int = 0) -> np.ndarray:
    """ECEs [draws] of a perfectly calibrated model with these confidences: each top answer right with probability
    its confidence, drawn `draws` times."""
    confidences = np.asarray(confidences, dtype=np.float64)
    if confidences.size == 0:
        return np.zeros(draws)
    which = _bin_of(confidences, bins)
    sure = np.bincount(which, weights=confidences, minlength=bins)
    correct = np.random.default_rng(seed).random((draws, confidences.size)) < confidences
    right = np.stack([np.bincount(which, weights=row, minlength=bins) for row in correct])
    return np.abs(right - sure).sum(axis=1) / confidences.size


def reliability(confidences: np.ndarray, correct: np.ndarray, bins: int = BINS) -> list[dict[str, float]]:
    """The non-empty bins: their edges, count, mean confidence and accuracy (a reliability diagram's bars)."""
    confidences = np.asarray(confidences, dtype=np.float64)
    which = _bin_of(confidences, bins)
    count = np.bincount(which, minlength=bins)
    right = np.bincount(which, weights=np.asarray(correct, dtype=np.float64), minlength=bins)
    sure = np.bincount(which, weights=confidences, minlength=bins)
    return [
        {
            "lo": b / bins,
            "hi": (b + 1) / bins,
            "count": int(count[b]),
            "confidence": float(sure[b] / count[b]),
            "accuracy": float(right[b] / count[b]),
        }
        for b in range(bins)
        if count[b]
    ]
