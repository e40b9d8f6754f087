"""Choosing a shipped file's calibration, per question kind, leave-one-set-out on train splits (step 1 of
`offline.shipped`).

    selection, reference = score_variants(formats, settings(3), derived)
    setting, plan, score = choose(selection, settings(3))

A variant is a base (raw or contextual) and the calibrator's parameters (`VARIANTS`: one temperature or the
feature calibrator, with or without a bias on yes for noul, and on the raw base with or without a prior weight: a
share of the content-free prior divided out, fitted between raw's 0 and contextual's 1). A setting is how many
order reads a fit reads and whether every set weighs the same in it (else every answer does). Under every setting,
each variant is fitted for each set on the other sets' train splits and scored on that set's own train split
(`loso.leave_one_set_out(scored="train")`); per kind, over the sets that ask it, its score is the mean + worst
ECE (worst: every set must be honest, not the average), plus NEGATION_WEIGHT × the mean negation gap for yes/no
where negation readouts are given (`loso.left_out_negation`).

The rule (`choose`): eligible are the variants that lower no set's accuracy below raw's (one read, by letter) by
more than ACCURACY_SLACK; per kind the eligible variant with the lowest score wins (then log loss), FALLBACK_VARIANT
where none is eligible. Choice questions answered in several ways (by letter, by name, by name per token) take the
best variant of each way, then the one with the lowest log loss (ECE cannot tell an accurate reader from one at
chance). Among the settings whose plan is all eligible (all settings if none is), the lowest mean score over the
kinds wins; more than one order read must lower it by READS_MARGIN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import mean

from typedlm.calibrate.calibration import CALIBRATOR_FEATURES
from typedlm.core.names import CalibrationMethod, ChoiceAnswers, Kind
from typedlm.offline.loso import leave_one_set_out, left_out_negation
from typedlm.offline.metrics import KINDS
from typedlm.offline.readouts import Readout

READS_MARGIN = 0.01  # order reads cost up to 2.3x one read: they are turned on only if they lower the score this much
ACCURACY_SLACK = 0.01  # a variant may lower no set's accuracy (of a kind) below raw's by more than this
FALLBACK_VARIANT = "raw, temperature"  # where none is eligible: it never moves a top answer
NEGATION_WEIGHT = 1.0  # the yes/no score's weight on the mean negation gap (both in probability, as ECE is)

# label → (base, the calibrator's parameters)
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    f"{base}, {label}{', prior weight' * with_prior}": (base, (*use, *("prior_weight",) * with_prior))
    for base in (CalibrationMethod.RAW, CalibrationMethod.CONTEXTUAL)
    # a prior weight on raw only: contextual divides the whole prior out
    for with_prior in ((False, True) if base == CalibrationMethod.RAW else (False,))
    for label, use in (
        ("temperature", ("bias",)),
        ("features", CALIBRATOR_FEATURES),
        ("temperature, yes bias", ("bias", "yes_bias")),
        ("features, yes bias", (*CALIBRATOR_FEATURES, "yes_bias")),
    )
}

Scores = dict[str, dict[str, float]]  # kind → ece_mean, ece_worst, score, nll, accuracy, eligible[, negation]
Formats = Mapping[str, Mapping[str, Mapping[str, Sequence[Readout]]]]  # way of answering → set → split → readouts


def settings(order_reads: int) -> dict[str, tuple[int, bool]]:
    """Each fit's setting by its label: (order reads, whether every set weighs the same), one read and
    `order_reads`."""
    return {
        f"{reads} read{'s' * (reads > 1)}{', sets weighed equally' * balanced}": (reads, balanced)
        for reads in sorted({1, order_reads})
        for balanced in (False, True)
    }


def by_kind(summary: dict, key: str) -> dict[str, float]:
    return {kind: values[key] for kind, values in summary.items() if kind in KINDS}


def kind_scores(
    result: dict, reference: dict[str, dict[str, float]], negation: dict[str, float] | None = None
) -> Scores:
    """Per kind, over the sets that ask it, the left-out calibrators' ECE (mean, worst, their sum: the score), NLL,
    accuracy, and whether no set's accuracy fell below raw's by more than ACCURACY_SLACK. With `negation` (set →
    mean negation gap, `loso.left_out_negation`), the yes/no score adds NEGATION_WEIGHT × its mean over the sets."""
    scores = {}
    for kind in KINDS:
        rows = {
            n: e["rows"]["calibrated, set left out"]
            for n, e in result.items()
            if kind in e["rows"][CalibrationMethod.RAW]
        }
        if not rows:
            continue
        eces = [r[kind]["ece"] for r in rows.values()]
        scores[kind] = {
            "ece_mean": mean(eces),
            "ece_worst": max(eces),
            "score": mean(eces) + max(eces),
            "nll": mean(r[kind]["nll"] for r in rows.values()),
            "accuracy": mean(r[kind]["accuracy"] for r in rows.values()),
            "eligible": all(r[kind]["accuracy"] >= reference[n][kind] - ACCURACY_SLACK for n, r in rows.items()),
        }
        if kind == Kind.NOUL and negation:
            scores[kind]["negation"] = mean(negation.values())
            scores[kind]["score"] += NEGATION_WEIGHT * scores[kind]["negation"]
    return scores


def score_variants(
    formats: Formats, settings: Mapping[str, tuple[int, bool]], derived: Mapping[str, Sequence[Readout]]
) -> tuple[dict[str, dict[str, Scores]], dict[str, dict[str, float]]]:
    """(setting → variant label → its `kind_scores`, set → kind → raw's accuracy with one read by letter: the
    accuracy floor's reference). `formats` maps each way of answering choice questions ("letters" first) to its
    readouts; a label other than by letter is prefixed by its way ("names: raw, features"). Prints a line per fit."""
    selection: dict[str, dict[str, Scores]] = {}
    reference: dict[str, dict[str, float]] = {}
    for setting, (reads, balanced) in settings.items():
        selection[setting] = {}
        for answers_by, by_format in formats.items():
            if (
                answers_by != ChoiceAnswers.LETTERS
            ):  # another way of answering choice questions: only their answers are fitted
                by_format = {
                    name: {split: [r for r in rows if r.kind == Kind.CHOICE] for split, rows in splits.items()}
                    for name, splits in by_format.items()
                    if any(r.kind == Kind.CHOICE for r in splits["train"])
                }
            for variant, (base, use) in VARIANTS.items():
                if answers_by != ChoiceAnswers.LETTERS and "yes_bias" in use:  # a bias on yes changes no choice answer
                    continue
                result = leave_one_set_out(by_format, base, reads, use, scored="train", balanced=balanced)
                if not reference:  # raw, letters, one read: the accuracy floor's reference
                    reference = {
                        name: by_kind(entry["rows"][CalibrationMethod.RAW], "accuracy")
                        for name, entry in result.items()
                    }
                negation = (
                    left_out_negation(derived, result, base, reads) if answers_by == ChoiceAnswers.LETTERS else None
                )
                scores = kind_scores(result, reference, negation)
                label = variant if answers_by == ChoiceAnswers.LETTERS else f"{answers_by}: {variant}"
                selection[setting][label] = scores
                line = "  ".join(
                    f"{kind} ece {v['ece_mean']:.3f}/{v['ece_worst']:.3f}"
                    + (f" negation {v['negation']:.3f}" if "negation" in v else "")
                    + ("" if v["eligible"] else " (acc)")
                    for kind, v in scores.items()
                )
                print(f"  {setting}, {label:<50} {line}", flush=True)
    return selection, reference


def best(by_label: Mapping[str, Scores], kind: str) -> str | None:
    """The eligible variant with the lowest score (then log loss); None where none is eligible."""
    eligible = [label for label in by_label if by_label[label].get(kind, {}).get("eligible")]
    if not eligible:
        return None
    return min(eligible, key=lambda label: (by_label[label][kind]["score"], by_label[label][kind]["nll"]))


def variant_of(label: str) -> tuple[str, str]:
    """(how choice options are answered, the calibrator variant) of a selection label."""
    answers_by, _, variant = label.rpartition(": ")
    return answers_by or ChoiceAnswers.LETTERS, variant


def best_choice(by_label: Mapping[str, Scores]) -> str:
    """Choice questions: the best variant of each way of answering them, then the way whose variant has the
    lowest log loss. ECE alone cannot compare them: a model that answers at chance can be calibrated, and
    answering by name may be far more accurate (Qwen 0.5B on bbc_news: 0.30 by letter, 0.76 by name)."""
    ways = {variant_of(label)[0] for label in by_label if Kind.CHOICE in by_label[label]}
    candidates = [best({k: v for k, v in by_label.items() if variant_of(k)[0] == way}, Kind.CHOICE) for way in ways]
    candidates = [label for label in candidates if label is not None]  # a way with no eligible variant is out
    if not candidates:
        return FALLBACK_VARIANT
    return min(candidates, key=lambda label: by_label[label][Kind.CHOICE]["nll"])


def choose(
    selection: Mapping[str, Mapping[str, Scores]], settings: Mapping[str, tuple[int, bool]]
) -> tuple[str, dict[str, str], dict[str, float]]:
    """(the chosen setting, its plan: kind → variant label, every setting's score: its plan's mean score)."""
    plans = {
        setting: {
            kind: best_choice(by_label) if kind == Kind.CHOICE else best(by_label, kind) or FALLBACK_VARIANT
            for kind in next(iter(by_label.values()))
        }
        for setting, by_label in selection.items()
    }
    score = {s: mean(selection[s][plan[kind]][kind]["score"] for kind in plan) for s, plan in plans.items()}
    # a setting whose plan falls back to a variant that is not eligible (order reads can move top answers: raw
    # with 3 reads may be less accurate than raw with 1) breaks the accuracy rule: it is chosen only if all do
    honest = [s for s, plan in plans.items() if all(selection[s][plan[k]][k]["eligible"] for k in plan)] or score
    # order reads cost up to 2.3x one read: they must lower the score by READS_MARGIN to be chosen
    setting = min(honest, key=lambda s: score[s] + READS_MARGIN * (settings[s][0] > 1))
    return setting, plans[setting], score
