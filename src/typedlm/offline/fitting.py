"""Fitting calibration files on labeled training data (`typedlm calibrate`): one forward per example through a
decider, then per question type Platt scaling (noul) or a temperature (choice, score), and per question asked
at least `MIN_QUESTION_EXAMPLES` times its own Platt scaling, or a temperature and a bias per option.

What the parameters mean, and how a decider applies them, is `typedlm.calibrate.calibration`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from typedlm.calibrate.calibration import (
    BASES,
    CALIBRATOR_FEATURES,
    FLOOR,
    LOG_T_BOUNDS,
    CalibrationFile,
    calibrator_features,
    signature,
    tempered,
)
from typedlm.core.names import CalibrationMethod, Kind
from typedlm.core.questions import YES, parse_questions, parse_state
from typedlm.offline.evaldata import Example

MIN_QUESTION_EXAMPLES = 30  # training answers a question needs for parameters of its own
CALIBRATOR_PENALTY = 1e-2  # L2 on the feature calibrator's weights (not its constant): small data, many sets
BIAS_PENALTY = 1e-3  # L2 on per-option biases: an option never right in training is not pushed to −∞


def _nll(probs: np.ndarray, gold: np.ndarray) -> float:
    return float(-np.log(np.maximum(probs[np.arange(len(gold)), gold], FLOOR)).mean())


def fit_temperature(probs: Sequence[np.ndarray], gold: Sequence[int]) -> float:
    """The temperature minimising the NLL of `gold` under p ∝ p^(1/T) (rows may differ in length)."""
    from scipy.optimize import minimize_scalar

    def loss(log_t: float) -> float:
        t = math.exp(log_t)
        return float(np.mean([-math.log(max(tempered(p, t)[g], FLOOR)) for p, g in zip(probs, gold, strict=True)]))

    return float(math.exp(minimize_scalar(loss, bounds=(-4.0, 4.0), method="bounded").x))


def fit_scaling(probs: Sequence[np.ndarray], gold: Sequence[int]) -> tuple[float, list[float]]:
    """(T, biases) minimising the NLL of `gold` under p ∝ p^(1/T)·e^(b) for one question (fixed option count);
    the first bias is 0, the others are lightly penalised (`BIAS_PENALTY`)."""
    from scipy.optimize import minimize

    logp = np.log(np.maximum(np.stack(probs), FLOOR))  # [N, n]
    gold = np.asarray(gold)

    def loss(x: np.ndarray) -> float:
        logits = logp / math.exp(x[0]) + np.concatenate([[0.0], x[1:]])
        lse = np.logaddexp.reduce(logits, axis=1)
        return float((lse - logits[np.arange(len(gold)), gold]).mean() + BIAS_PENALTY * (x[1:] ** 2).sum())

    result = minimize(
        loss, np.zeros(logp.shape[1]), method="L-BFGS-B", bounds=[(-4, 4)] + [(-10, 10)] * (logp.shape[1] - 1)
    )
    return float(math.exp(result.x[0])), [0.0, *map(float, result.x[1:])]


def fit_platt(probs: Sequence[np.ndarray], gold_yes: Sequence[bool]) -> tuple[float, float]:
    """(a, b) minimising the NLL of σ(a·z + b), z = log(p_yes/p_no): logistic regression on one feature.

    a is kept ≥ 0: calibration may flatten the model's evidence but never reverse it (data that mixes
    questions with opposite biases can otherwise fit a negative slope that would flip every answer).
    """
    from scipy.optimize import minimize

    z = np.array([math.log(max(p[0], FLOOR)) - math.log(max(p[1], FLOOR)) for p in probs])
    y = np.asarray(gold_yes, dtype=np.float64)

    def loss(ab: np.ndarray) -> float:
        s = ab[0] * z + ab[1]
        return float(np.mean(np.logaddexp(0, -s) * y + np.logaddexp(0, s) * (1 - y)))

    result = minimize(loss, np.array([1.0, 0.0]), method="L-BFGS-B", bounds=[(0.0, 100.0), (-50.0, 50.0)])
    return float(result.x[0]), float(result.x[1])


def fit_calibrations(
    decider,
    examples: Iterable[Example],
    bases: Sequence[str] = (CalibrationMethod.RAW,),
    data: Mapping[str, Any] | None = None,
    progress=None,
) -> dict[str, CalibrationFile]:
    """Fit calibration files on `examples`, one per base method, from one forward per example.

    Per question type: Platt scaling (noul) or a temperature (choice, score). Per question asked at least
    `MIN_QUESTION_EXAMPLES` times: Platt scaling, or a temperature and a bias per option.
    """
    progress = progress or (lambda it: it)
    # one row per answer: (kind, question signature, probabilities under each base, gold class)
    rows: list[tuple[str, str, dict[str, Any], int]] = []
    contextual = CalibrationMethod.CONTEXTUAL in bases
    for example in progress(list(examples)):
        questions = parse_questions(example.questions)
        reading = decider.read(parse_state(example.state), questions, 1, contextual=contextual)
        for qid, question in questions.items():
            r = reading.reads[qid]
            prior = r.priors[0] if r.priors else None
            by_base = {base: BASES[base](r.masses[0], prior) for base in bases}
            rows.append(
                (r.kind, signature(question, decider.prompt_version), by_base, question.gold_index(example.gold[qid]))
            )
    files = {}
    for base in bases:
        params = {}
        for kind in Kind:
            mine = [(row[2][base], row[3]) for row in rows if row[0] == kind]
            if mine:
                params[kind] = _fit(kind, *zip(*mine, strict=True), per_question=False)
        per_question = {}
        for key in dict.fromkeys(row[1] for row in rows):
            mine = [row for row in rows if row[1] == key]
            if len(mine) >= MIN_QUESTION_EXAMPLES:
                fit = _fit(mine[0][0], [row[2][base] for row in mine], [row[3] for row in mine], per_question=True)
                per_question[key] = {"kind": mine[0][0], "n": len(mine), **fit}
        counts = {kind: sum(row[0] == kind for row in rows) for kind in Kind}
        info = {**(data or {}), "answers": {k: n for k, n in counts.items() if n}}
        files[base] = CalibrationFile(
            decider.name, decider.fingerprint, decider.prompt_version, base, params, info, per_question
        )
    return files


def _fit(kind: str, probs: Sequence, gold: Sequence[int], per_question: bool) -> dict[str, Any]:
    if kind == Kind.NOUL:
        a, b = fit_platt(probs, [g == YES for g in gold])
        return {"a": a, "b": b}
    if per_question:
        temperature, bias = fit_scaling(probs, gold)
        return {"temperature": temperature, "bias": bias}
    return {"temperature": fit_temperature(probs, gold)}


def fit_calibrator(
    kind: str,
    probs: Sequence[Sequence[float]],
    features: Sequence[Sequence[float]],
    gold: Sequence[int],
    use: Sequence[str] = CALIBRATOR_FEATURES,
    weights: Sequence[float] | None = None,
    priors: Sequence[Sequence[float]] | None = None,
) -> dict[str, Any]:
    """The feature calibrator of one question kind (see `calibration.feature_scaled`): the weights w of
    log T = w·φ, and for noul a bias on yes, minimising the NLL of `gold` with a light L2 on w (not its constant).
    Features not in `use` keep weight 0 (`use=("bias",)`: one temperature per kind); noul's bias on yes is fitted
    only where `use` holds "yes_bias" (the share of yes answers differs from question to question, so a bias learned
    on some questions need not carry over to others), the prior weight β in [0, 1] only where it holds
    "prior_weight" (then `priors`, each answer's content-free prior, are needed). `weights`: one per answer
    (default: equal)."""
    from scipy.optimize import minimize

    width = max(len(p) for p in probs)
    logp = np.full((len(probs), width), -np.inf)  # [N, n_max]: answers past a row's own count never exist
    for i, p in enumerate(probs):
        logp[i, : len(p)] = np.log(np.maximum(np.asarray(p, dtype=np.float64), FLOOR))
    with_prior = "prior_weight" in use
    logq = np.zeros_like(logp)  # [N, n_max]
    if with_prior:
        assert priors is not None and len(priors) == len(probs), "a prior weight is fitted from the priors"
        for i, q in enumerate(priors):
            logq[i, : len(q)] = np.log(np.maximum(np.asarray(q, dtype=np.float64), FLOOR))
    phi, gold_index, rows = np.asarray(features, dtype=np.float64), np.asarray(gold), np.arange(len(probs))
    dims = len(CALIBRATOR_FEATURES)
    noul = kind == Kind.NOUL and "yes_bias" in use
    w = np.ones(len(probs)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()  # [N]

    def loss(x: np.ndarray) -> float:
        log_t = np.clip(phi @ x[:dims], *LOG_T_BOUNDS)  # [N]
        logits = (logp - x[dims] * logq) / np.exp(log_t)[:, None]  # [N, n_max]
        if noul:
            logits[:, 0] += x[dims + 1]
        nll = np.logaddexp.reduce(logits, axis=1) - logits[rows, gold_index]
        return float(nll @ w + CALIBRATOR_PENALTY * (x[1:dims] ** 2).sum())

    bounds = [(None, None) if name in use else (0.0, 0.0) for name in CALIBRATOR_FEATURES]
    bounds += [(0.0, 1.0) if with_prior else (0.0, 0.0)] + [(None, None)] * noul
    result = minimize(loss, np.zeros(dims + 1 + noul), method="L-BFGS-B", bounds=bounds)
    params: dict[str, Any] = {"weights": [float(w) for w in result.x[:dims]]}
    if with_prior:
        params["prior_weight"] = float(result.x[dims])
    if noul:
        params["bias"] = float(result.x[dims + 1])
    return params


def fit_calibrators(
    answers: Sequence[Any],
    use: Sequence[str] | Mapping[str, Sequence[str]] = CALIBRATOR_FEATURES,
    bases: Mapping[str, str] | None = None,
    weights: Sequence[float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Feature calibrators per kind from answers (`loso.Answer`: kind, base probabilities, raw mass, disagreement,
    gold, content-free prior).

    `use`: the features, for every kind or per kind; `bases`: the method each kind's answers were read by, recorded
    in its calibrator as "base" (see `CalibrationFile.base_of`); `weights`: one per answer (default: equal)."""
    out = {}
    weights = [1.0] * len(answers) if weights is None else weights
    for kind in Kind:
        mine = [a for a in answers if a[0] == kind]
        mine_weights = [w for a, w in zip(answers, weights, strict=True) if a[0] == kind]
        if mine:
            kind_use = use[kind] if isinstance(use, Mapping) else use
            out[kind] = fit_calibrator(
                kind,
                [a.probs for a in mine],
                [calibrator_features(a.probs, a.mass, a.disagreement) for a in mine],
                [a.gold for a in mine],
                kind_use,
                mine_weights,
                [a.prior for a in mine] if "prior_weight" in kind_use else None,
            )
            if bases is not None:
                out[kind]["base"] = bases[kind]
    return out
