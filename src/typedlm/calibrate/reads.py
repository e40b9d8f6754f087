"""Reads: one readout of the label masses of one version of a question. A question is read once, or, with order
reads k > 1, k times with its options rotated (more suffixes in the same forward), each read mapped back to the
question's own option order before it is calibrated and the reads are averaged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from typedlm.core.questions import Question


@dataclass(frozen=True)
class Reads:
    """Every read of one question, each in the question's own option order."""

    kind: str  # "noul", "choice" or "score"
    masses: list[list[float]]  # [reads][options]
    priors: list[list[float]] | None = None  # the same reads on the content-free document
    lengths: list[int] | None = None  # each answer's label length in tokens, where options were read by name
    # the first read's features (its own option order): its decision row's hidden state projected
    # (`typedlm.calibrate.projection`), float16; None where the forward was not asked for them
    features: np.ndarray | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Reading:
    """The reads of every question of one request (keyed like its questions) and the tokens run for them."""

    reads: dict[str, Reads]
    input_tokens: int  # the whole prompt: prefix, every suffix and label-tree token
    cached_tokens: int = 0  # of them, the prefix tokens served from the prefix cache


def rotations(question: Question, k: int) -> list[tuple[Question, list[int]]]:
    """Up to k versions of the question with its options rotated, evenly spaced, each with `order`:
    position j of that version shows option order[j]. A question whose answers keep their order has one."""
    n = question.size
    if not question.reorderable:
        return [(question, list(range(n)))]
    versions, reads = [], read_count(question, k)
    for shift in sorted({round(r * n / reads) % n for r in range(reads)}):
        order = [(j + shift) % n for j in range(n)]
        versions.append((question.reordered(order), order))
    return versions


def read_count(question: Question, k: int) -> int:
    """How many versions `rotations(question, k)` gives (k or the number of answers, whichever is fewer; one for a
    question whose answers keep their order): the shifts round(r·n/k) are distinct when k <= n."""
    return min(k, question.size) if question.reorderable else 1


def unrotate(masses: list[float], order: list[int]) -> list[float]:
    """A read's masses, shown in `order`, back in the question's own option order."""
    if order[0] == 0:  # the orders are rotations: the one that starts with option 0 is the request's own
        return masses
    original = [0.0] * len(order)
    for position, option in enumerate(order):
        original[option] = masses[position]
    return original
