"""Leave-one-set-out calibration on recorded readouts: fit on every set but one, score on the one left out.

    python scripts/calibration_loso.py --model qwen2.5-coder-0.5b --sets rotten_tomatoes bbc_news sys1bench \
        sys1bench_generated --limit 150 --readouts eval/readouts/qwen0.5b --out eval/loso-qwen0.5b.json \
        [--calibration-file calibration.json]

Readouts (every answer's label masses for 3 option orders and their content-free priors) are recorded once per
set and split into --readouts (JSONL) and reused by later runs. Then:
1. per question kind, the variant (base raw or contextual, one temperature or the feature calibrator, with or without
   a bias on yes for noul, and on the raw base with or without a prior weight: a share of the content-free prior
   divided out, fitted between raw's 0 and contextual's 1) is chosen on train splits: each set's calibrator fitted on
   the other sets' train splits, scored on its own train split. Eligible are the variants that lower no set's
   accuracy below raw's by more than ACCURACY_SLACK (raw with one temperature never changes a top answer, so one
   always is); among them the lowest mean + worst ECE over the sets that ask that kind wins (worst: every set must be
   honest, not the average). Each variant is fitted with every answer weighing the same and with every set weighing
   the same; 3 order reads instead of 1 only where they lower that score by READS_MARGIN, and only where every
   kind has an eligible variant with them (order reads move top answers: raw with 3 reads may lose accuracy). With
   --name-readouts, choice questions are also read with their options answered by name (with and without length
   normalisation): the best variant of each way, by the rule above, and of those the one with the lowest log loss
   (ECE cannot tell an accurate reader from one at chance). With --coherence-readouts, yes/no questions are scored
   for coherence too: each train split's yes/no questions are asked with their negations
   (`offline.coherence.negations`), and the mean |P(q) + P(not q) − 1| over the sets, each through the calibrator
   fitted without it, is added to the yes/no score (NEGATION_WEIGHT): a bias on yes that pays in ECE on the other
   sets' base rates but makes a question and its negation disagree is not chosen for that;
2. the chosen variant is reported on the held-out splits: raw, contextual, fitted in-set, fitted on the set's own
   train split only, fitted with the set left out (accuracy, ECE, Brier), and the ECE a perfectly calibrated model
   would measure with the left-out confidences (the floor), and written as JSON;
3. with --calibration-file, the chosen variant fitted on every set's train split is written as this model's
   calibration file (its order reads recorded in its data).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from statistics import mean

from typedlm import Decider
from typedlm.calibrate.calibration import CALIBRATOR_FEATURES, CalibrationFile
from typedlm.offline.coherence import negations
from typedlm.offline.evaluate import load_examples
from typedlm.offline.fitting import fit_calibrators
from typedlm.offline.loso import answers_of, leave_one_set_out, left_out_negation, set_weights
from typedlm.offline.metrics import KINDS
from typedlm.offline.readouts import load, record, save
from typedlm.text.prompt import PROMPT_VERSION, WORDINGS

READS = 3  # option orders recorded per choice/score question; fewer are read from them
READS_MARGIN = 0.01  # order reads cost up to 2.3x one read: they are turned on only if they lower the score this much
ACCURACY_SLACK = 0.01  # a variant may lower no set's accuracy (of a kind) below raw's by more than this
FALLBACK_VARIANT = "raw, temperature"  # where none is eligible: it never moves a top answer
NEGATION_WEIGHT = 1.0  # the yes/no score's weight on the mean negation gap (both in probability, as ECE is)


def _by_kind(summary: dict, key: str) -> dict[str, float]:
    return {kind: values[key] for kind, values in summary.items() if kind in KINDS}


def _kind_scores(
    result: dict, reference: dict[str, dict[str, float]], negation: dict[str, float] | None = None
) -> dict[str, dict[str, float]]:
    """Per kind, over the sets that ask it, the left-out calibrators' ECE (mean, worst, their sum: the score), NLL,
    accuracy, and whether no set's accuracy fell below raw's by more than ACCURACY_SLACK. With `negation` (set →
    mean negation gap, `loso.left_out_negation`), the yes/no score adds NEGATION_WEIGHT × its mean over the sets."""
    scores = {}
    for kind in KINDS:
        rows = {n: e["rows"]["calibrated, set left out"] for n, e in result.items() if kind in e["rows"]["raw"]}
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
        if kind == "noul" and negation:
            scores[kind]["negation"] = mean(negation.values())
            scores[kind]["score"] += NEGATION_WEIGHT * scores[kind]["negation"]
    return scores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--sets", nargs="+", required=True)
    parser.add_argument("--limit", type=int, default=150, help="examples per set and split (class-balanced sample)")
    parser.add_argument("--readouts", required=True, help="folder of recorded readouts (made if missing)")
    parser.add_argument("--out", required=True, help="JSON report")
    parser.add_argument("--calibration-file", default=None, help="write the calibrator fitted on every set here")
    parser.add_argument(
        "--prompt-version",
        default=PROMPT_VERSION,
        choices=sorted(WORDINGS),
        help="the prompt's wording the readouts are recorded with (text.prompt.WORDINGS; give each its own folders)",
    )
    parser.add_argument(
        "--order-reads",
        type=int,
        default=READS,
        choices=range(1, READS + 1),
        metavar=f"1..{READS}",
        help="option orders recorded per choice/score question (fewer: faster to record; 1 and this many compared)",
    )
    parser.add_argument(
        "--name-readouts",
        default=None,
        help="folder of choice readouts with options answered by name (made if missing): choice questions then "
        "compare letters, names and names per token",
    )
    parser.add_argument(
        "--coherence-readouts",
        default=None,
        help="folder of readouts of the train splits' yes/no questions and their negations (made if missing): the "
        "yes/no variant is then chosen for coherence too",
    )
    parser.add_argument(
        "--select-only",
        action="store_true",
        help="train splits only: choose the variant and write its selection scores (to compare prompt versions, "
        "each with its own readouts), no held-out report, no calibration file",
    )
    args = parser.parse_args()
    # by letter whatever the model's shipped file reads choices by: the readouts are what every variant starts from
    decider = Decider.load(args.model, calibration="raw", choice_answers="letters", prompt_version=args.prompt_version)
    folder = Path(args.readouts)
    readouts = {}
    for name in args.sets:
        readouts[name] = {}
        for split in ("train",) if args.select_only else ("train", "held_out"):
            path = folder / f"{name}.{split}.jsonl"
            if not path.is_file():
                save(path, record(decider, load_examples(name, split, args.limit, 0), name, args.order_reads))
                print(f"recorded {path}", file=sys.stderr, flush=True)
            readouts[name][split] = load(path)
    formats = {"letters": readouts}  # how choice options are answered → the readouts read that way
    if args.name_readouts:
        formats.update(_named(args, readouts))
    derived = _negation_readouts(args, decider) if args.coherence_readouts else {}
    # 1. choose, per question kind, the variant on train splits: each set's calibrator is fitted without it and
    #    scored on its own train split; the kind's score is its mean ECE over the sets that ask it (then NLL)
    variants = {
        f"{base}, {label}{', prior weight' * with_prior}": (base, (*use, *("prior_weight",) * with_prior))
        for base in ("raw", "contextual")
        for with_prior in ((False, True) if base == "raw" else (False,))  # contextual divides the whole prior out
        for label, use in (
            ("temperature", ("bias",)),
            ("features", CALIBRATOR_FEATURES),
            ("temperature, yes bias", ("bias", "yes_bias")),
            ("features, yes bias", (*CALIBRATOR_FEATURES, "yes_bias")),
        )
    }
    # each fit's setting: order reads, and whether every set weighs the same in it (else every answer does)
    settings = {
        f"{reads} read{'s' * (reads > 1)}{', sets weighed equally' * balanced}": (reads, balanced)
        for reads in sorted({1, args.order_reads})
        for balanced in (False, True)
    }
    selection: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    reference: dict[str, dict[str, float]] = {}  # set → kind → accuracy of raw with one read (the floor's reference)
    print(f"{decider.name}: variants, each set left out, scored on its train split (per kind: mean / worst ECE)")
    for setting, (reads, balanced) in settings.items():
        selection[setting] = {}
        for answers_by, by_format in formats.items():
            if answers_by != "letters":  # another way of answering choice questions: only their answers are fitted
                by_format = {
                    name: {split: [r for r in rows if r.kind == "choice"] for split, rows in splits.items()}
                    for name, splits in by_format.items()
                    if any(r.kind == "choice" for r in splits["train"])
                }
            for variant, (base, use) in variants.items():
                if answers_by != "letters" and "yes_bias" in use:  # a bias on yes changes no choice answer
                    continue
                result = leave_one_set_out(by_format, base, reads, use, scored="train", balanced=balanced)
                if not reference:  # raw, letters, one read: the accuracy floor's reference
                    reference = {name: _by_kind(entry["rows"]["raw"], "accuracy") for name, entry in result.items()}
                negation = left_out_negation(derived, result, base, reads) if answers_by == "letters" else None
                scores = _kind_scores(result, reference, negation)
                label = variant if answers_by == "letters" else f"{answers_by}: {variant}"
                selection[setting][label] = scores
                line = "  ".join(
                    f"{kind} ece {v['ece_mean']:.3f}/{v['ece_worst']:.3f}"
                    + (f" negation {v['negation']:.3f}" if "negation" in v else "")
                    + ("" if v["eligible"] else " (acc)")
                    for kind, v in scores.items()
                )
                print(f"  {setting}, {label:<50} {line}", flush=True)

    def best(by_label: dict[str, dict[str, dict[str, float]]], kind: str) -> str | None:
        """The eligible variant with the lowest score (then log loss); None where none is eligible."""
        eligible = [label for label in by_label if by_label[label].get(kind, {}).get("eligible")]
        if not eligible:
            return None
        return min(eligible, key=lambda label: (by_label[label][kind]["score"], by_label[label][kind]["nll"]))

    def variant_of(label: str) -> tuple[str, str]:
        """(how choice options are answered, the calibrator variant) of a selection label."""
        answers_by, _, variant = label.rpartition(": ")
        return answers_by or "letters", variant

    def best_choice(by_label: dict[str, dict[str, dict[str, float]]]) -> str:
        """Choice questions: the best variant of each way of answering them, then the way whose variant has the
        lowest log loss. ECE alone cannot compare them: a model that answers at chance can be calibrated, and
        answering by name may be far more accurate (Qwen 0.5B on bbc_news: 0.30 by letter, 0.76 by name)."""
        ways = {variant_of(label)[0] for label in by_label if "choice" in by_label[label]}
        candidates = [best({k: v for k, v in by_label.items() if variant_of(k)[0] == way}, "choice") for way in ways]
        candidates = [label for label in candidates if label is not None]  # a way with no eligible variant is out
        if not candidates:
            return FALLBACK_VARIANT
        return min(candidates, key=lambda label: by_label[label]["choice"]["nll"])

    plans = {
        setting: {
            kind: best_choice(by_label) if kind == "choice" else best(by_label, kind) or FALLBACK_VARIANT
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
    reads, balanced = settings[setting]
    plan = plans[setting]
    bases = {kind: variants[variant_of(label)[1]][0] for kind, label in plan.items()}
    uses = {kind: variants[variant_of(label)[1]][1] for kind, label in plan.items()}
    choice_answers = variant_of(plan["choice"])[0] if "choice" in plan else "letters"
    readouts = formats[choice_answers]
    chosen = f"{setting}; " + "; ".join(f"{kind}: {label}" for kind, label in plan.items())
    print(
        f"chosen: {chosen}\n(mean + worst ECE{' (+ negation gap for yes/no)' * bool(derived)}, mean over kinds: "
        + ", ".join(f"{s} {v:.3f}" for s, v in score.items())
        + ")"
    )
    if args.select_only:
        _write(
            args.out,
            {
                "model": decider.name,
                "prompt_version": args.prompt_version,
                "selection": selection,
                "chosen": chosen,
                "score": score[setting],
                "raw_accuracy": reference,
            },
        )
        return 0
    # 2. report it on the held-out splits
    result = leave_one_set_out(readouts, bases, reads, uses, scored="held_out", balanced=balanced)
    print(f"\n{decider.name}, {chosen}, held-out splits\n")
    print("| set | method | answers | accuracy | ECE | Brier |\n|---|---|---:|---:|---:|---:|")
    for name, entry in result.items():
        for method, summary in entry["rows"].items():
            o = summary["overall"]
            print(f"| {name} | {method} | {o['n']} | {o['accuracy']:.3f} | {o['ece']:.3f} | {o['brier']:.3f} |")
    print("\nThe ECE a perfectly calibrated model would measure with the left-out confidences (metrics.ece_floor)\n")
    print("| set | answers | set left out ECE | own set ECE | floor: mean | 90th percentile | share ≤ 0.05 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, entry in result.items():
        rows, floor = entry["rows"], entry["ece_floor"]
        print(
            f"| {name} | {rows['raw']['overall']['n']} | {rows['calibrated, set left out']['overall']['ece']:.3f} "
            f"| {rows['calibrated, own set']['overall']['ece']:.3f} | {floor['mean']:.3f} | {floor['p90']:.3f} "
            f"| {floor['share_at_most_0.05']:.2f} |"
        )
    report = {
        "model": decider.name,
        "fingerprint": decider.fingerprint,
        "limit": args.limit,
        "selection": selection,
        "chosen": chosen,
        "reads": reads,
        "balanced": balanced,
        "choice_answers": choice_answers,
        "variants": plan,
        "negation_weight": NEGATION_WEIGHT if derived else None,  # None: chosen without the coherence term
        "held_out": result,
    }
    _write(args.out, report)
    if args.calibration_file:
        by_set = {name: answers_of(splits["train"], bases, reads) for name, splits in readouts.items()}
        train = [a for answers in by_set.values() for a in answers]
        data = {
            "sets": args.sets,
            "split": "train",
            "seed": 0,
            "examples": {name: len({r.example for r in splits["train"]}) for name, splits in readouts.items()},
            "answers": len(train),
            "variant": chosen,
            "sets_weighed_equally": balanced,
            "variants": plan,
            "order_reads": reads,
            "choice_answers": choice_answers,
            "negation_weight": NEGATION_WEIGHT if derived else None,
        }
        weights = set_weights({n: answers_of(splits["train"], bases, reads) for n, splits in readouts.items()})
        calibrators = fit_calibrators(
            train, uses, bases, [w for ws in weights.values() for w in ws] if balanced else None
        )
        base = max(set(bases.values()), key=list(bases.values()).count)  # the file's own: any kind's would do
        file = CalibrationFile(
            decider.name, decider.fingerprint, decider.prompt_version, base, {}, data, {}, calibrators
        )
        file.save(args.calibration_file)
        print(f"wrote {args.calibration_file}", file=sys.stderr)
    return 0


def _write(path: str, report: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def _negation_readouts(args: argparse.Namespace, decider: Decider) -> dict[str, list]:
    """Per set, the readouts of its train split's yes/no questions and their negations (`coherence.negations`),
    recorded into --coherence-readouts where missing (a set without yes/no questions has none)."""
    folder, derived = Path(args.coherence_readouts), {}
    for name in args.sets:
        path = folder / f"{name}.train.jsonl"
        if not path.is_file():
            save(path, record(decider, negations(load_examples(name, "train", args.limit, 0)), name, 1))
            print(f"recorded {path}", file=sys.stderr, flush=True)
        derived[name] = load(path)
    return derived


def _named(args: argparse.Namespace, readouts: dict) -> dict[str, dict]:
    """The readouts with every choice answer read with its options answered by name (recorded into
    --name-readouts where missing; other kinds read the same either way), as is and length-normalised."""
    folder, decider, named = Path(args.name_readouts), None, {}
    for name, splits in readouts.items():
        named[name] = {}
        for split, rows in splits.items():
            if not any(r.kind == "choice" for r in rows):
                named[name][split] = rows
                continue
            path = folder / f"{name}.{split}.jsonl"
            if not path.is_file():
                decider = decider or Decider.load(
                    args.model, calibration="raw", choice_answers="names", prompt_version=args.prompt_version
                )
                examples = load_examples(name, split, args.limit, 0)
                save(path, record(decider, examples, name, args.order_reads, kinds=("choice",)))
                print(f"recorded {path}", file=sys.stderr, flush=True)
            by_answer = {(r.example, r.question): r for r in load(path)}
            named[name][split] = [by_answer.get((r.example, r.question), r) for r in rows]
    per_token = {
        name: {split: [replace(r, length_normalised=r.lengths is not None) for r in rows] for split, rows in s.items()}
        for name, s in named.items()
    }
    return {"names": named, "names_per_token": per_token}


if __name__ == "__main__":
    sys.exit(main())
