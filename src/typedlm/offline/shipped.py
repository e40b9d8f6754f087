r"""The calibration files typedlm ships for its named models, fitted leave-one-set-out on recorded readouts: fit on
every set but one, score on the one left out.

    typedlm fit-shipped --model qwen2.5-coder-1.5b --sets rotten_tomatoes bbc_news sys1bench \
        sys1bench_generated boolq arc trec_questions amazon_sentiment --limit 400 \
        --readouts eval/readouts/qwen1.5b/1-letters --name-readouts eval/readouts/qwen1.5b/1-names \
        --coherence-readouts eval/readouts/qwen1.5b-negations/1-letters \
        --out docs/results/loso-qwen2.5-coder-1.5b.json \
        --calibration-file src/typedlm/calibrate/shipped/qwen2.5-coder-1.5b-instruct.json

(`typedlm fit-shipped`, the command `typedlm.cli.shipped`, runs it with the model loaded, which offline/ cannot
do: see "The model" below.)

Reads (`offline.readouts`: one readout per line, an answer's label masses for each order read and their
content-free priors; file names end in `.jsonl`):
- --readouts DIR: DIR/SET.train.jsonl and DIR/SET.held_out.jsonl for every set of --sets, choices answered by
  letter (with --select-only, the train splits only);
- --name-readouts DIR (optional): the same files with choice questions answered by name, for the sets that ask
  choice questions (other kinds read the same either way, and are taken from --readouts);
- --coherence-readouts DIR (optional): DIR/SET.train.jsonl, each set's train split's yes/no questions with their
  negations (`offline.coherence.negations`; empty for a set without yes/no questions).
A file that is missing is recorded there first, with --limit examples per set and split (a class-balanced sample,
seed 0) and --order-reads option orders, by the model. `scripts/record_readouts.py record` writes the same files,
in parallel on a GPU, to OUT/1-letters, OUT/1-names and (from `export --coherence`'s negations) another
OUT/1-letters. Readouts are kept gzip-compressed under `docs/results/readouts/MODEL/` (`1-letters/`, `1-names/`,
`negations/1-letters/`); the 1.5B's are those its shipped file was fitted on (the others' are other samples, for
the feedback simulation): decompress them into a folder (`SET.SPLIT.jsonl`) to read them here.

Writes:
- --out PATH: the JSON report (model, fingerprint, every variant's selection scores, the chosen variant, the
  held-out rows and ECE floors); the shipped models' reports are `docs/results/loso-MODEL.json`;
- --calibration-file PATH (optional, none by default): the chosen variant fitted on every set's train split, as a
  calibration file (`calibrate.calibration.CalibrationFile`, its order reads and way of answering choices in its
  data); a named model's shipped file is `src/typedlm/calibrate/shipped/NAME.json` (NAME: the model's full name,
  `smollm2-135m-instruct` for the embedded default);
- stdout: every variant's selection line, the chosen variant, and the held-out tables (Markdown);
- stderr: each readout file recorded, and the calibration file written.

The steps:
1. per question kind, the variant is chosen on train splits (`offline.selection`: every variant fitted for each
   set on the other sets' train splits and scored on its own; the lowest mean + worst ECE among those that lower
   no set's accuracy, with order reads and sets weighed equally compared; with --name-readouts, choice questions
   compared by letter, by name and by name per token; with --coherence-readouts, yes/no questions scored for
   coherence with their negations too);
2. the chosen variant is reported on the held-out splits: raw, contextual, fitted in-set, fitted on the set's own
   train split only, fitted with the set left out (accuracy, ECE, Brier), and the ECE a perfectly calibrated model
   would measure with the left-out confidences (the floor), and written to --out;
3. with --calibration-file, the chosen variant fitted on every set's train split is written there.
With --select-only, step 1 only on the train splits, its scores written to --out (to compare prompt versions).

The model (--model; default: the embedded model): a decider names the model and its fingerprint in the report and
the calibration file, and records the readouts a folder lacks. offline/ never imports the decider (the layers
contract in pyproject.toml), so `main(args, load_decider)` takes `load_decider(model, choice_answers,
prompt_version)` from its caller, and `add_arguments(parser)` gives a caller's parser these options: `typedlm
fit-shipped` (`typedlm.cli.shipped`) passes `Decider.load(model, calibration="raw", ...)`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from typedlm.calibrate.calibration import CalibrationFile
from typedlm.core.names import CalibrationMethod, ChoiceAnswers, Kind
from typedlm.offline.coherence import negations
from typedlm.offline.evaluate import load_examples
from typedlm.offline.fitting import fit_calibrators
from typedlm.offline.loso import answers_of, leave_one_set_out, set_weights
from typedlm.offline.readouts import load, record, save
from typedlm.offline.selection import NEGATION_WEIGHT, VARIANTS, choose, score_variants, settings, variant_of
from typedlm.text.prompt import PROMPT_VERSION, WORDINGS

READS = 3  # option orders recorded per choice/score question; fewer are read from them

# (model, how choice options are answered: "letters" or "names", prompt version) → a decider reading raw
DeciderLoader = Callable[[str | None, str, str], Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The fit's options (the module docstring's), added to `parser`; `main` reads them back."""
    parser.add_argument("--model", default=None, help="a named model, HF id or path (default: the embedded model)")
    parser.add_argument("--sets", nargs="+", required=True, help="the labeled sets (built-in datasets), each left out")
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


def main(args: argparse.Namespace, load_decider: DeciderLoader) -> int:
    """Steps 1–3 of the module docstring for the options of `add_arguments`, read from `load_decider`'s model.

    Args:
        args: the parsed options.
        load_decider: `(model, choice_answers, prompt_version)` → a decider reading raw probabilities.

    Returns:
        0 (the exit status).
    """
    # by letter whatever the model's shipped file reads choices by: the readouts are what every variant starts from
    decider = load_decider(args.model, ChoiceAnswers.LETTERS, args.prompt_version)
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
    formats = {ChoiceAnswers.LETTERS: readouts}  # how choice options are answered → the readouts read that way
    if args.name_readouts:
        formats.update(_named(args, readouts, load_decider))
    derived = _negation_readouts(args, decider) if args.coherence_readouts else {}
    # 1. choose, per question kind, the variant on train splits (offline.selection)
    by_setting = settings(args.order_reads)
    print(f"{decider.name}: variants, each set left out, scored on its train split (per kind: mean / worst ECE)")
    selection, reference = score_variants(formats, by_setting, derived)
    setting, plan, score = choose(selection, by_setting)
    reads, balanced = by_setting[setting]
    bases = {kind: VARIANTS[variant_of(label)[1]][0] for kind, label in plan.items()}
    uses = {kind: VARIANTS[variant_of(label)[1]][1] for kind, label in plan.items()}
    choice_answers = variant_of(plan[Kind.CHOICE])[0] if Kind.CHOICE in plan else ChoiceAnswers.LETTERS
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
    _print_held_out(f"{decider.name}, {chosen}", result)
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
    # 3. the calibration file: the chosen variant fitted on every set's train split
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


def _print_held_out(title: str, result: dict) -> None:
    """The held-out rows of every set and method, then the left-out ECE beside its floor, as Markdown tables."""
    print(f"\n{title}, held-out splits\n")
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
        answers = rows[CalibrationMethod.RAW]["overall"]["n"]
        print(
            f"| {name} | {answers} | {rows['calibrated, set left out']['overall']['ece']:.3f} "
            f"| {rows['calibrated, own set']['overall']['ece']:.3f} | {floor['mean']:.3f} | {floor['p90']:.3f} "
            f"| {floor['share_at_most_0.05']:.2f} |"
        )


def _write(path: str, report: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def _negation_readouts(args: argparse.Namespace, decider: Any) -> dict[str, list]:
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


def _named(args: argparse.Namespace, readouts: dict, load_decider: DeciderLoader) -> dict[str, dict]:
    """The readouts with every choice answer read with its options answered by name (recorded into
    --name-readouts where missing; other kinds read the same either way), as is and length-normalised."""
    folder, decider, named = Path(args.name_readouts), None, {}
    for name, splits in readouts.items():
        named[name] = {}
        for split, rows in splits.items():
            if not any(r.kind == Kind.CHOICE for r in rows):
                named[name][split] = rows
                continue
            path = folder / f"{name}.{split}.jsonl"
            if not path.is_file():
                decider = decider or load_decider(args.model, ChoiceAnswers.NAMES, args.prompt_version)
                examples = load_examples(name, split, args.limit, 0)
                save(path, record(decider, examples, name, args.order_reads, kinds=(Kind.CHOICE,)))
                print(f"recorded {path}", file=sys.stderr, flush=True)
            by_answer = {(r.example, r.question): r for r in load(path)}
            named[name][split] = [by_answer.get((r.example, r.question), r) for r in rows]
    per_token = {
        name: {split: [replace(r, length_normalised=r.lengths is not None) for r in rows] for split, rows in s.items()}
        for name, s in named.items()
    }
    return {ChoiceAnswers.NAMES: named, ChoiceAnswers.NAMES_PER_TOKEN: per_token}
