"""Readouts recorded on another machine (a GPU without the labeled sets' packages), many in parallel.

1. Where the sets are installed, write their class-balanced samples as JSONL (one file per set and split):

    python scripts/record_readouts.py export --sets rotten_tomatoes bbc_news ... --limit 300 --out eval/examples

   (`--train-limit` and `--held-out-limit` set each split's apart; `--limit` is the default of both.)

2. Where the model runs (the examples folder and the model file carried over), record every file's readouts by
   letter, and by name for files with choice questions, in `--workers` processes (a GPU is mostly idle under one
   process that reads one example at a time); `--prompt-versions` adds other wordings' train splits:

    python scripts/record_readouts.py record --model MODEL.gguf --examples eval/examples --out eval/readouts/m \
        --device cuda --workers 14 [--prompt-versions 1 2-system 2-question]

   Readouts go to OUT/VERSION-letters/SET.SPLIT.jsonl and OUT/VERSION-names/SET.SPLIT.jsonl, the folders that
   `typedlm.offline.shipped`'s `--readouts` and `--name-readouts` read (3 order reads, as it records them).

With `export --coherence`, two more folders are written beside the samples, each recorded the same way
(`record --examples OUT/negations`, then `OUT/coherence`): the train splits' yes/no questions with their
negations (what `offline.shipped`'s `--coherence-readouts` reads), and the held-out splits' coherence questions
(`coherence.py --readouts`; its 100 examples per set).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ORDER_READS = 3  # as typedlm.offline.shipped records them
COHERENCE_LIMIT = 100  # held-out examples per set of coherence.py's questions (its default)


def export(args: argparse.Namespace) -> None:
    from typedlm.offline.coherence import derive, negations
    from typedlm.offline.evaluate import load_examples

    out = Path(args.out)
    for name in args.sets:
        limits = {"train": args.train_limit, "held_out": args.held_out_limit}
        files = {f"{name}.{split}.jsonl": load_examples(name, split, limits[split], 0) for split in limits}
        if args.coherence:  # named so that `record` writes them where offline.shipped and coherence.py look
            files[f"negations/{name}.train.jsonl"] = negations(files[f"{name}.train.jsonl"])
            files[f"coherence/{name}.coherence.jsonl"] = derive(load_examples(name, "held_out", COHERENCE_LIMIT, 0))
        for path, examples in files.items():
            (out / path).parent.mkdir(parents=True, exist_ok=True)
            with (out / path).open("w", encoding="utf-8") as f:
                f.writelines(json.dumps(example.to_json()) + "\n" for example in examples)
            print(f"{path}: {len(examples)} examples")


def _record_one(job: tuple[str, str, str, str, str, str, str, int]) -> str:
    """One file's readouts in a process of its own (one thread: the processes share the cores)."""
    import torch

    from typedlm import Decider
    from typedlm.core.names import CalibrationMethod, Kind
    from typedlm.offline.evaluate import load_examples
    from typedlm.offline.readouts import record, save

    model, device, path, way, version, out, name, order_reads = job
    torch.set_num_threads(1)
    start = time.perf_counter()
    options = {"choice_answers": "names" if way == "names" else "letters"}  # not the shipped file's way
    decider = Decider.load(
        model, device=device, dtype="float32", calibration=CalibrationMethod.RAW, prompt_version=version, **options
    )
    rows = record(
        decider, load_examples(path, "all"), name, order_reads, kinds=(Kind.CHOICE,) if way == "names" else None
    )
    save(Path(out) / f"{version}-{way}" / Path(path).name, rows)
    return f"{Path(path).name} {version}-{way}: {len(rows)} readouts, {time.perf_counter() - start:.0f} s"


def record_all(args: argparse.Namespace) -> None:
    from typedlm import Decider
    from typedlm.core.names import Kind

    Decider.load(args.model, device="cpu", dtype="float32")  # a GGUF converted once, before the workers (on the CPU)
    jobs = []
    for version in args.prompt_versions:
        for path in sorted(Path(args.examples).glob("*.jsonl")):
            name, split = path.stem.split(".")
            if version != args.prompt_versions[0] and split != "train":  # other wordings are compared on train
                continue
            examples = [json.loads(line) for line in path.open(encoding="utf-8")]
            kinds = {q.get("type") for e in examples for q in e["questions"].values()}
            ways = [way for way in args.ways if way == "letters" or Kind.CHOICE in kinds]
            if not args.letters_for_choice and "names" in ways and kinds == {Kind.CHOICE}:
                ways.remove("letters")  # only choice questions, read by name: their letters are not wanted
            for way in ways:
                if not (Path(args.out) / f"{version}-{way}" / path.name).is_file():
                    jobs.append((args.model, args.device, str(path), way, version, args.out, name, args.order_reads))
    jobs.sort(key=lambda job: -Path(job[2]).stat().st_size)  # the longest first, so the pool ends together
    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked process
    with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        for line in pool.map(_record_one, jobs):
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    exporting = commands.add_parser("export", help="write the sets' samples as JSONL")
    exporting.add_argument("--sets", nargs="+", required=True)
    exporting.add_argument("--limit", type=int, default=300, help="examples per set and split")
    exporting.add_argument("--train-limit", type=int, default=None, help="examples per set's train split (--limit)")
    exporting.add_argument(
        "--held-out-limit", type=int, default=None, help="examples per set's held-out split (--limit)"
    )
    exporting.add_argument("--out", required=True)
    exporting.add_argument(
        "--coherence", action="store_true", help="also the negation pairs (train) and coherence questions (held out)"
    )
    recording = commands.add_parser("record", help="record readouts from exported samples")
    recording.add_argument("--model", required=True)
    recording.add_argument("--examples", required=True)
    recording.add_argument("--out", required=True)
    recording.add_argument("--device", default="cuda")
    recording.add_argument("--workers", type=int, default=8)
    recording.add_argument("--prompt-versions", nargs="+", default=["1"], help="the first: every split; others: train")
    recording.add_argument(
        "--order-reads", type=int, default=ORDER_READS, help=f"option orders read (default {ORDER_READS})"
    )
    recording.add_argument(
        "--ways", nargs="+", choices=("letters", "names"), default=["letters", "names"], help="how choices are read"
    )
    recording.add_argument(
        "--no-letters-for-choice",
        dest="letters_for_choice",
        action="store_false",
        help="with --ways letters names: a file of choice questions only is read by name only",
    )
    args = parser.parse_args()
    if args.command == "export":
        args.train_limit = args.limit if args.train_limit is None else args.train_limit
        args.held_out_limit = args.limit if args.held_out_limit is None else args.held_out_limit
        export(args)
    else:
        record_all(args)


if __name__ == "__main__":
    main()
