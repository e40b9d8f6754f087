"""Confidence from probabilities, by TypeSafe's documented reference formulas.

choice: (p_max − 1/n) / (1 − 1/n) — 0 for a uniform answer, 1 for a certain one.
score:  1 − Σ_i p_i·|i − mode| / S_n, where S_n is that spread for the uniform distribution over n
        levels; clipped at 0. It rewards mass close to the mode, not only mass on it.
"""

from __future__ import annotations

from collections.abc import Sequence


def choice_confidence(probs: Sequence[float]) -> float:
    n = len(probs)
    if n <= 1:
        return 1.0
    return min(1.0, max(0.0, (max(probs) - 1 / n) / (1 - 1 / n)))


def uniform_spread(n: int) -> float:
    """Mean distance from the middle level under the uniform distribution over n levels."""
    return sum(abs(i - (n - 1) / 2) for i in range(n)) / n


def score_confidence(probs: Sequence[float]) -> float:
    n = len(probs)
    if n <= 1:
        return 1.0
    mode = max(range(n), key=probs.__getitem__)
    spread = sum(p * abs(i - mode) for i, p in enumerate(probs))
    return min(1.0, max(0.0, 1 - spread / uniform_spread(n)))


def raw_mass(masses: Sequence[float]) -> float:
    """The total mass on the answer labels, at most 1 (a zero or invalid total reads as 0)."""
    total = float(sum(masses))
    return min(1.0, total) if total > 0 else 0.0


def normalise(masses: Sequence[float]) -> tuple[list[float], float]:
    """(probabilities, raw mass): masses divided by their total. A zero total reads as uniform."""
    total = float(sum(masses))
    if not total > 0:
        return [1 / len(masses)] * len(masses), 0.0
    return [m / total for m in masses], min(1.0, total)
