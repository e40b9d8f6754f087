"""Calibration: raw label masses in, probabilities that mean what they say out. Plain numbers, no model.

Methods (a request or a server picks one by name):

- `raw`: masses divided by their total;
- `contextual`: each label's mass divided by the mass the model gives it on a content-free document
  (the label prior the model shows with nothing to read), then normalised (Zhao et al., 2021, "Calibrate
  before use");
- `fitted`: a `CalibrationFile` fitted by `typedlm calibrate` on labeled data, applied on top of its base
  method (raw or contextual). Per question type: for noul Platt scaling of the yes/no log-odds,
  p = σ(a·z + b); for choice and score a temperature, p ∝ p_base^(1/T). Per question, for questions the
  training data asks often enough (the same text, options and levels: see `signature`): Platt scaling, or a
  temperature and a bias per option, p ∝ p_base^(1/T)·e^(b_i), which also learns how often each answer is
  right. A question the file does not know gets its type's parameters.

Several reads of one question (the option order rotated, see the decider) are calibrated one by one and
then averaged; `combine` returns the mean, the standard error of the chosen answer's probability across
reads, and the share of reads that agree with the combined argmax.

Fitting the parameters on labeled data is offline work: `typedlm.offline.fitting`.

A `CalibrationFile` records what it was fitted for (the model's fingerprint and the prompt version) and on
what data; `check` refuses it for another model or prompt, since its numbers would be meaningless there.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from typedlm.core.confidence import normalise, raw_mass
from typedlm.core.errors import ModelError
from typedlm.core.names import CalibrationMethod, Kind
from typedlm.core.questions import Question
from typedlm.text.prompt import PROMPT_VERSION, question_block

DEFAULT_CALIBRATION = CalibrationMethod.CONTEXTUAL  # without a file: as good as raw or better on every held-out set
# (docs). With a file (given, or shipped for the model: `shipped_calibration`) the default is fitted.
FORMAT = "typedlm-calibration/2"  # 2 added the feature calibrator; files of format 1 still load
READABLE_FORMATS = ("typedlm-calibration/1", FORMAT)
FLOOR = 1e-12  # probabilities are clipped here before logarithms


def signature(question: Question, version: str = PROMPT_VERSION) -> str:
    """A short hash of a question as the model reads it (text, options or levels, answer format) in a prompt
    version's words."""
    return hashlib.sha256(question_block(question, version).encode()).hexdigest()[:16]


# Probabilities are lists of plain floats: a request's answers have a handful of labels each, where numpy's
# per-call overhead outweighs the arithmetic (a 32-question request spends its post-processing here).


def normalised(masses: Sequence[float]) -> list[float]:
    """Masses divided by their total (a zero total reads as uniform): `confidence.normalise`."""
    return normalise(masses)[0]


def contextual(masses: Sequence[float], prior: Sequence[float] | None) -> list[float]:
    """Masses with the content-free label prior divided out, normalised."""
    assert prior is not None, "contextual calibration needs the content-free prior"
    return normalised([p / max(q, FLOOR) for p, q in zip(normalised(masses), normalised(prior), strict=True)])


def raw(masses: Sequence[float], prior: Sequence[float] | None = None) -> list[float]:
    """Masses divided by their total; the prior is not read."""
    return normalised(masses)


# How one read's masses (and its content-free prior) become probabilities: a base method's arithmetic, or a fitted
# file's on top of its base (`CalibrationFile.reader`). The calibrators hand theirs to `calibrate_reads`.
ReadRule = Callable[[Sequence[float], Sequence[float] | None], list[float]]
BASES: dict[CalibrationMethod, ReadRule] = {CalibrationMethod.RAW: raw, CalibrationMethod.CONTEXTUAL: contextual}


def platt(probs: Sequence[float], a: float, b: float) -> list[float]:
    """Noul (p_yes, p_no) → σ(a·log(p_yes/p_no) + b) as (p_yes, p_no)."""
    z = math.log(max(probs[0], FLOOR)) - math.log(max(probs[1], FLOOR))
    p_yes = 1 / (1 + math.exp(-(a * z + b))) if a * z + b > -700 else 0.0
    return [p_yes, 1 - p_yes]


def tempered(probs: Sequence[float], temperature: float, bias: Sequence[float] | None = None) -> list[float]:
    """p ∝ p^(1/T)·e^(b): T > 1 softens, T < 1 sharpens; without a bias the argmax never changes."""
    logits = np.log(np.maximum(probs, FLOOR)) / temperature
    if bias is not None:
        logits = logits + np.asarray(bias)
    logits -= logits.max()
    return normalised(np.exp(logits).tolist())


# The feature calibrator: one temperature per answer, chosen from what the readout itself shows, so that it carries
# over to questions nobody labeled. p ∝ (p_base / q^β)^(1/T)·e^(b·[answer is yes]) with log T = w·φ, φ below; q is
# the content-free prior and β ("prior_weight", 0 where absent) how much of it is divided out: 0 reads the base as
# it is, 1 is contextual calibration, and a fit between them learns how much of the model's label prior is bias.
CALIBRATOR_FEATURES = ("bias", "log_raw_mass", "entropy", "log_answers", "disagreement")
LOG_T_BOUNDS = (-3.0, 6.0)  # T in [0.05, 400]: from sharpening to all but uniform


def calibrator_features(probs: Sequence[float], raw_mass: float, disagreement: float) -> list[float]:
    """φ of one answer: 1, log raw mass, the base probabilities' entropy over its maximum, log of the number of
    answers, and the share of order reads that disagree with the combined top answer (0 with one read)."""
    n = len(probs)
    entropy = -sum(p * math.log(p) for p in probs if p > 0) / math.log(n)
    return [1.0, math.log(max(raw_mass, FLOOR)), entropy, math.log(n), disagreement]


def feature_scaled(
    kind: str,
    probs: Sequence[float],
    params: dict[str, Any],
    features: Sequence[float],
    prior: Sequence[float] | None = None,
) -> list[float]:
    """The base probabilities at the temperature the features give (see `CALIBRATOR_FEATURES`), with the share
    "prior_weight" of the content-free `prior` divided out where the calibrator has one; for noul a bias on yes
    too. Without a prior weight the top answer never changes for choice and score."""
    log_t = min(
        max(sum(w * x for w, x in zip(params["weights"], features, strict=True)), LOG_T_BOUNDS[0]), LOG_T_BOUNDS[1]
    )
    beta = params.get("prior_weight", 0.0)
    if beta:
        assert prior is not None and len(prior) == len(probs), "a prior weight needs the content-free prior"
        logits = [
            (math.log(max(p, FLOOR)) - beta * math.log(max(q, FLOOR))) / math.exp(log_t)
            for p, q in zip(probs, prior, strict=True)
        ]
    else:
        logits = [math.log(max(p, FLOOR)) / math.exp(log_t) for p in probs]
    if kind == Kind.NOUL:
        logits[0] += params.get("bias", 0.0)
    top = max(logits)
    return normalised([math.exp(x - top) for x in logits])


def _scaled(params: dict[str, Any], kind: str, probs: Sequence[float]) -> list[float]:
    if kind == Kind.NOUL:
        return platt(probs, params["a"], params["b"])
    return tempered(probs, params["temperature"], params.get("bias"))


@dataclass(frozen=True)
class CalibrationFile:
    """Fitted parameters per question type, with what they were fitted for and on."""

    model: str
    fingerprint: str
    prompt_version: str
    base: CalibrationMethod  # raw or contextual: the method the parameters apply on top of
    params: dict[str, dict[str, float]]  # "noul": {"a", "b"}; "choice"/"score": {"temperature"}
    data: dict[str, Any] = field(default_factory=dict)  # which sets, split, seed, counts
    questions: dict[str, dict[str, Any]] = field(default_factory=dict)  # signature → {"kind", "n", params}
    calibrator: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind → {"weights", "bias"} (see above)

    def uses_calibrator(self, kind: str, question: str | None) -> bool:
        """Whether an answer of `kind` goes through the feature calibrator: the file has one for its kind and no
        parameters of the question's own."""
        return kind in self.calibrator and not (question and question in self.questions)

    def base_of(self, kind: str) -> CalibrationMethod:
        """The method an answer of `kind` is read by before its feature calibrator: the calibrator's own "base"
        where it has one (chosen per kind), else the file's."""
        return CalibrationMethod(self.calibrator.get(kind, {}).get("base", self.base))

    def reader(self, kind: str, question: str | None = None) -> ReadRule:
        """One read of an answer of `kind` calibrated by this file: its base method, then the question's own
        parameters (`question`: its signature) where the file knows it, else its kind's (`apply`)."""
        base = BASES[CalibrationMethod(self.base)]
        return lambda masses, prior: self.apply(kind, base(masses, prior), question)

    @property
    def needs_prior(self) -> bool:
        """Whether any answer this file calibrates is read contextually or divides out a share of the content-free
        prior (so the content-free priors are needed)."""
        bases = {self.base, *(params.get("base", self.base) for params in self.calibrator.values())}
        weighed = any(params.get("prior_weight") for params in self.calibrator.values())
        return CalibrationMethod.CONTEXTUAL in bases or weighed

    def calibrate(
        self,
        kind: str,
        probs: Sequence[float],
        raw_mass: float,
        disagreement: float,
        prior: Sequence[float] | None = None,
    ) -> list[float]:
        """The feature calibrator on an answer's base probabilities (its reads calibrated by `base`, averaged);
        `prior`: the same reads' content-free prior (`combined_prior`), needed where the calibrator has a prior
        weight."""
        params = self.calibrator[kind]
        return feature_scaled(kind, probs, params, calibrator_features(probs, raw_mass, disagreement), prior)

    def apply(self, kind: str, probs: Sequence[float], question: str | None = None) -> list[float]:
        """Calibrated probabilities: the question's own parameters (by signature) if known, else its type's."""
        own = self.questions.get(question) if question else None
        if own is not None and own["kind"] == kind and len(own.get("bias", probs)) == len(probs):
            return _scaled(own, kind, probs)
        params = self.params.get(kind)
        return list(probs) if params is None else _scaled(params, kind, probs)

    def check(self, fingerprint: str, prompt_version: str) -> None:
        """Raise `ModelError` unless this file was fitted for this model and prompt."""
        if self.fingerprint != fingerprint:
            raise ModelError(
                f"this calibration file was fitted for another model ({self.model}, fingerprint "
                f"{self.fingerprint}; this model's is {fingerprint}): fit one with `typedlm calibrate`"
            )
        if self.prompt_version != prompt_version:
            raise ModelError(
                f"this calibration file was fitted with prompt version {self.prompt_version}; this typedlm uses "
                f"{prompt_version}: fit it again with `typedlm calibrate`"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "prompt_version": self.prompt_version,
            "base": self.base,
            "params": self.params,
            "data": self.data,
            "questions": self.questions,
            "calibrator": self.calibrator,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CalibrationFile:
        try:
            obj = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelError(f"cannot read calibration file {path}: {exc}") from exc
        if not isinstance(obj, dict) or obj.get("format") not in READABLE_FORMATS:
            raise ModelError(f"{path} is not a typedlm calibration file (format {FORMAT})")
        if obj.get("base") not in BASES:
            raise ModelError(f"{path}: base must be raw or contextual")
        try:
            return cls(
                obj["model"],
                obj["fingerprint"],
                obj["prompt_version"],
                CalibrationMethod(obj["base"]),
                obj["params"],
                obj.get("data", {}),
                obj.get("questions", {}),
                obj.get("calibrator", {}),
            )
        except KeyError as exc:
            raise ModelError(f"{path} lacks {exc}") from exc


SHIPPED = "shipped"  # the folder, beside this module, of the calibration files shipped for named models


def shipped_calibration(model: str) -> CalibrationFile | None:
    """The calibration file shipped with typedlm for the model named `model` (None: none is shipped)."""
    path = Path(__file__).with_name(SHIPPED) / f"{model}.json"
    return CalibrationFile.load(path) if path.is_file() else None


def per_token(masses: Sequence[float], lengths: Sequence[int]) -> list[float]:
    """Length-normalised masses: each label's mass to the power 1 / its token count (the geometric mean of its
    tokens' conditionals), so that a long option name is not penalised for its length alone."""
    return [m ** (1.0 / n) for m, n in zip(masses, lengths, strict=True)]


def calibrate_reads(
    read: ReadRule,
    masses: Sequence[Sequence[float]],
    priors: Sequence[Sequence[float]] | None,
    lengths: Sequence[int] | None = None,
) -> tuple[list[float], float, float, float]:
    """Every read of one answer calibrated by `read` (a calibrator's rule, `ReadRule`), then averaged:
    (probabilities, mean raw mass, stderr of the chosen answer's probability, share of reads agreeing on it). One
    read is its own calibration (0.0, 1.0). With `lengths` (each answer's label length in tokens) the probabilities
    come from length-normalised masses (`per_token`); the raw mass is the masses' own total either way."""
    if lengths is not None:
        probs, _, stderr, agreement = calibrate_reads(
            read, [per_token(m, lengths) for m in masses], priors and [per_token(p, lengths) for p in priors]
        )
        return probs, sum(map(raw_mass, masses)) / len(masses), stderr, agreement
    priors = priors or [None] * len(masses)
    if len(masses) == 1:  # every noul question, and the default: no averaging
        return read(masses[0], priors[0]), raw_mass(masses[0]), 0.0, 1.0
    each = [read(m, p) for m, p in zip(masses, priors, strict=True)]
    probs, stderr, agreement = combine(each)
    return probs, sum(map(raw_mass, masses)) / len(masses), stderr, agreement


def combined_prior(priors: Sequence[Sequence[float]], lengths: Sequence[int] | None = None) -> list[float]:
    """The content-free prior of an answer's reads, combined as its raw base probabilities are (`calibrate_reads`:
    each read normalised, length-normalised first with `lengths`, then averaged)."""
    return calibrate_reads(raw, priors, None, lengths)[0]


def combine(reads: Sequence[Sequence[float]]) -> tuple[list[float], float, float]:
    """(mean probabilities, stderr of the chosen answer's probability, share of reads agreeing on it)."""
    if len(reads) == 1:  # the mean of one read is that read
        return list(reads[0]), 0.0, 1.0
    stacked = np.stack(reads)  # [k, n]
    mean = stacked.mean(axis=0)
    top = int(mean.argmax())
    k = len(reads)
    stderr = float(stacked[:, top].std(ddof=1) / math.sqrt(k)) if k > 1 else 0.0
    agreement = float((stacked.argmax(axis=1) == top).mean())
    return mean.tolist(), stderr, agreement
