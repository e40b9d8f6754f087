"""A served model's start: its decider loaded from its settings, and what was loaded said on stderr.

    decider = load_served(settings)   # `typedlm serve` (in its model process or its own), and each replica

The one start-up of every place that serves: `typedlm serve` hands it to the model process (or runs it on a thread
of the server's), and each replica on Ray Serve runs it.
"""

from __future__ import annotations

import sys
import time

from typedlm.core.settings import ServerSettings
from typedlm.decide.config import served_config
from typedlm.decide.decider import Decider


def load_served(settings: ServerSettings) -> Decider:
    """The decider a server answers with, loaded as `settings` say; the lines that say what was loaded."""
    started = time.perf_counter()
    decider = Decider.load(settings.model, settings.device, settings.dtype, config=served_config(settings))
    about = decider.describe()
    print(
        f"typedlm: loaded {about.model} in {time.perf_counter() - started:.1f} s: {about.device}, "
        f"{about.dtype}, context {about.context or 'unknown'} tokens, calibration {about.calibration} "
        f"(order reads {about.order_reads}), fingerprint {about.fingerprint}",
        file=sys.stderr,
    )
    for line in decider.features.summary():
        print(f"typedlm: {line}", file=sys.stderr)
    if decider.feedback is not None:
        feedback = decider.feedback
        print(
            f"typedlm: feedback: {feedback.learned} labels learned from {feedback.store.path} "
            "(POST /v1/systemone/feedback; --feedback-db none keeps nothing)",
            file=sys.stderr,
        )
    return decider
