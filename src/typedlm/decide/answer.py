"""Answering a forwarded request: its reads back in each question's own option order, calibrated, typed.

6. for a calibrator that reads them, each read's content-free priors: the same reads over the content-free document,
   remembered per suffix text by the contextual calibrator, so that repeated questions cost nothing;
7. each question's reads calibrated and averaged by the request's calibrator, which builds the typed answer; the
   response says which calibration its answers were in fact given by;
8. where the request asks (`x_coverage`, `x_min_accuracy`), each answer's set and abstention, from the labels the
   calibrator scored (`typedlm.calibrate.decisions`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from typedlm.calibrate.calibrators import Calibrator
from typedlm.calibrate.reads import Reading, Reads, unrotate
from typedlm.core.answers import Response, Usage
from typedlm.core.questions import Question
from typedlm.decide.prepare import Prepared, PreparedRequest

Priors = Callable[[list[Question]], list[list[float]]]  # question versions → their content-free masses


def reading(
    prepared: Prepared,
    masses: list[list[float]],
    cached: int,
    priors: Priors | None,
    features: np.ndarray | None = None,
) -> Reading:
    """Step 6 and the reads: each read's masses (and, with `priors`, its content-free priors) back in its question's
    own option order; with `features` (each read's, projected: [reads, dims]), each question's first read's."""
    flat, items = prepared.flat, prepared.items
    read_priors = priors([version for _, version, _ in flat]) if priors is not None else None
    reads: dict[str, Reads] = {}
    for i, (q, version, order) in enumerate(flat):
        lengths = [len(forms[0]) for forms in items[i].labels.groups] if getattr(version, "by_name", False) else None
        first = None if features is None or q in reads else features[i]  # a question's first read: its own order
        entry = reads.setdefault(
            q,
            Reads(
                prepared.questions[q].kind,
                [],
                [] if read_priors else None,
                lengths and unrotate(lengths, order),
                first,
            ),
        )
        entry.masses.append(unrotate(masses[i], order))
        if read_priors:
            entry.priors.append(unrotate(read_priors[i], order))
    return Reading(reads, prepared.tokens, cached)


def respond(
    name: str,
    request: PreparedRequest,
    calibrator: Calibrator,
    masses: list[list[float]],
    cached: int,
    priors: Priors,
    features: np.ndarray | None = None,
) -> Response:
    """Step 7: a forwarded request's response under `calibrator` (its reads' priors read where it needs them, its
    reads' projected features where the forward was asked for them)."""
    wanted = calibrator.needs_prior or request.priors
    read = reading(request.reads, masses, cached, priors if wanted else None, features)
    questions = request.reads.questions
    answers = {q: calibrator.answer(questions[q], read.reads[q]) for q in questions}
    if request.handover:
        answers = {
            q: calibrator.hand_over(questions[q], read.reads[q], a, request.handover) for q, a in answers.items()
        }
    extras: dict[str, Any] = {"calibration": calibrator.reported(answers.values()).value}
    if request.order_reads > 1:
        extras["order_reads"] = request.order_reads
    usage = Usage(read.input_tokens, cached_tokens=read.cached_tokens)
    kept = request.keep_reading or request.remember
    return Response(name, answers, usage, extras, reading=read if kept else None)
