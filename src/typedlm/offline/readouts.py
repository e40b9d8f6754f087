"""Readouts: what a model read for every labeled answer, recorded once, so that calibrators can be fitted and
compared (leave-one-set-out, many variants) without running the model again.

A `Readout` holds one answer's raw label masses for each order read (in the question's own option order), the
same reads' masses on the content-free document (contextual calibration's priors), the gold class and, where it
was recorded with them, the first read's features (its decision row's hidden state projected, as a label stores
them: `typedlm.calibrate.projection`).
`record` runs a decider over examples (one forward per example, `Decider.read`); `save` / `load` keep them as
JSONL, one readout per line, gzip-compressed where the file's name ends in `.gz` (as the recorded readouts kept in
the repository are).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from typedlm.calibrate.calibration import BASES, calibrate_reads, combined_prior, signature
from typedlm.calibrate.projection import encode
from typedlm.core.questions import parse_questions, parse_state
from typedlm.offline.evaldata import Example


@dataclass(frozen=True)
class Readout:
    set: str  # the labeled set it comes from
    example: str  # the example's id
    question: str  # the question's id in the example
    kind: str  # "noul", "choice" or "score"
    signature: str  # the question as the model reads it (see `calibration.signature`)
    masses: list[list[float]]  # [reads][answers]
    priors: list[list[float]]  # [reads][answers], on the content-free document
    gold: int  # the true answer's index
    lengths: list[int] | None = None  # each answer's label length in tokens, where options were read by name
    length_normalised: bool = False  # whether `base` reads the masses length-normalised (calibration.per_token)
    features: str | None = None  # the first read's features, encoded (`projection.encode`); None: not recorded

    @property
    def size(self) -> int:
        return len(self.masses[0])

    def base(self, method: str, reads: int | None = None) -> tuple[list[float], float, float]:
        """(probabilities, raw mass, disagreement) of this answer under `method` ("raw" or "contextual") from its
        first `reads` reads (all: None), computed as the decider computes them: each read calibrated, then averaged;
        the raw mass averaged; disagreement = the share of reads whose top answer is not the combined one."""
        lengths = self.lengths if self.length_normalised else None
        probs, mass, _, agreement = calibrate_reads(BASES[method], self.masses[:reads], self.priors[:reads], lengths)
        return probs, mass, 1.0 - agreement

    def prior(self, reads: int | None = None) -> list[float]:
        """The content-free prior of this answer's first `reads` reads, combined as the decider combines them for a
        calibrator's prior weight (`calibration.combined_prior`)."""
        return combined_prior(self.priors[:reads], self.lengths if self.length_normalised else None)


def record(
    decider,
    examples: Iterable[Example],
    set_name: str,
    order_reads: int = 1,
    progress: Callable[[Iterable], Iterable] = lambda it: it,
    kinds: Collection[str] | None = None,
) -> list[Readout]:
    """Every answer of every example read by `decider` with `order_reads` option orders and their priors; with
    `kinds`, only the questions of those kinds (an example without one is skipped)."""
    readouts = []
    for example in progress(list(examples)):
        questions = parse_questions(example.questions)
        if kinds is not None:
            questions = {qid: q for qid, q in questions.items() if q.kind in kinds}
            if not questions:
                continue
        reading = decider.read(parse_state(example.state), questions, order_reads, contextual=True)
        for qid, question in questions.items():
            reads = reading.reads[qid]
            gold = question.gold_index(example.gold[qid])
            readouts.append(
                Readout(
                    set_name,
                    example.id,
                    qid,
                    reads.kind,
                    signature(question, decider.prompt_version),
                    reads.masses,
                    reads.priors,
                    gold,
                    reads.lengths,
                    features=None if reads.features is None else encode(reads.features),
                )
            )
    return readouts


def _open(path: Path, mode: str) -> IO[str]:
    """A text file, read or written through gzip where its name ends in `.gz`."""
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def save(path: str | Path, readouts: Iterable[Readout]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "w") as f:
        for readout in readouts:
            f.write(json.dumps(asdict(readout)) + "\n")


def load(path: str | Path) -> list[Readout]:
    """The readouts saved in `path` (JSONL, or JSONL gzip-compressed where the name ends in `.gz`)."""
    with _open(Path(path), "r") as f:
        return [Readout(**json.loads(line)) for line in f if line.strip()]
