r"""Leave-one-set-out calibration with the model loaded: `typedlm.offline.shipped` (its docstring: the readouts it
reads, the report and calibration file it writes, the selection rule) given the decider it needs, which offline/
cannot import. The same options (`--help`):

    python scripts/calibration_loso.py --model qwen2.5-coder-0.5b --sets rotten_tomatoes bbc_news sys1bench \
        sys1bench_generated --limit 150 --readouts eval/readouts/qwen0.5b --out eval/loso-qwen0.5b.json \
        [--calibration-file calibration.json]
"""

from __future__ import annotations

import sys

from typedlm import Decider
from typedlm.offline.shipped import main


def load_decider(model: str | None, choice_answers: str, prompt_version: str) -> Decider:
    """The decider whose readouts every variant starts from: raw probabilities, choices read by `choice_answers`
    whatever the model's shipped file reads them by."""
    return Decider.load(model, calibration="raw", choice_answers=choice_answers, prompt_version=prompt_version)


if __name__ == "__main__":
    sys.exit(main(load_decider=load_decider))
