"""The simulated user's inputs from recorded readouts: each set's train and held-out readouts read as the model's
shipped calibration file reads choices, each readout's question (for the learner's keys), the shipped variant per
kind and the prompt version. Shared by the feedback simulation and the guarantees' simulation.

    inputs = SimulationInputs.load("qwen2.5-coder-1.5b", readouts_folder, examples_folder)

`readouts_folder` holds `record_readouts.py record`'s folders (`1-letters/`, `1-names/`: SET.SPLIT.jsonl[.gz]);
`examples_folder` the exported samples (SET.SPLIT.jsonl).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from typedlm.calibrate.calibration import shipped_calibration
from typedlm.core.names import CalibrationMethod, Kind
from typedlm.core.questions import Question, parse_question
from typedlm.offline.readouts import Readout, load
from typedlm.offline.simulation import ShippedVariant
from typedlm.runtime.catalog import named_model


def _load(folder: Path, name: str, split: str) -> list[Readout] | None:
    for suffix in (".jsonl.gz", ".jsonl"):
        path = folder / f"{name}.{split}{suffix}"
        if path.is_file():
            return load(path)
    return None


def _questions(examples: Path, name: str) -> dict[tuple[str, str], Question]:
    out = {}
    for split in ("train", "held_out"):
        with (examples / f"{name}.{split}.jsonl").open(encoding="utf-8") as f:
            for line in f:
                example = json.loads(line)
                for qid, raw in example["questions"].items():
                    out[(example["id"], qid)] = parse_question(raw, ("questions", qid))
    return out


@dataclass(frozen=True)
class SimulationInputs:
    variants_text: dict[str, str]  # the shipped file's variant per kind, as written there
    variants: dict[str, ShippedVariant]
    prompt_version: str
    readouts: dict[str, dict[str, list[Readout]]]  # set -> split -> readouts
    questions: dict[str, dict[tuple[str, str], Question]]  # set -> (example id, question id) -> question

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, *, seeds: int, ks: tuple[int, ...]) -> None:
        """A simulation script's inputs, output and stream: --model, --readouts, --examples, --out, and --seeds and
        --ks with the simulation's own defaults."""
        parser.add_argument("--model", required=True, help="the named model whose shipped calibration is the default")
        parser.add_argument("--readouts", required=True, type=Path)
        parser.add_argument("--examples", required=True, type=Path)
        parser.add_argument("--out", required=True, type=Path)
        parser.add_argument("--seeds", type=int, default=seeds, help=f"orders of the stream (default {seeds})")
        parser.add_argument("--ks", type=int, nargs="+", default=list(ks), help="labels posted (default %(default)s)")

    @classmethod
    def load(cls, model: str, readouts: Path, examples: Path) -> SimulationInputs:
        named = named_model(model)
        shipped = shipped_calibration(named.name if named is not None else model)
        if shipped is None:
            raise SystemExit(f"no shipped calibration for {model}")
        data: dict[str, Any] = shipped.data
        variants = {kind: ShippedVariant.parse(text) for kind, text in data["variants"].items()}
        reading = variants.get(Kind.CHOICE, ShippedVariant("letters", CalibrationMethod.RAW, ())).reading
        by_name, per_token = reading in ("names", "names_per_token"), reading == "names_per_token"
        found = {
            p.name.split(".")[0] for way in ("1-letters", "1-names") for p in (readouts / way).glob("*.train.jsonl*")
        }
        sets = {}
        for name in sorted(found):
            splits = {}
            for split in ("train", "held_out"):
                letters = _load(readouts / "1-letters", name, split) or []
                names = _load(readouts / "1-names", name, split) or []
                rows = [r for r in letters if not (by_name and r.kind == Kind.CHOICE)]
                if by_name:  # length-normalised where the file reads names per token
                    rows += [
                        replace(r, length_normalised=per_token and r.lengths is not None)
                        for r in names
                        if r.kind == Kind.CHOICE
                    ]
                if rows:
                    splits[split] = rows
            if len(splits) == 2:
                sets[name] = splits
        questions = {name: _questions(examples, name) for name in sets}
        return cls(dict(data["variants"]), variants, shipped.prompt_version, sets, questions)
