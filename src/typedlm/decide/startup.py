"""A served model's start: its decider loaded from its settings, and what was loaded said on stderr.

    decider = load_served(settings)   # `typedlm serve` (in its model process or its own), and each replica

Where the settings name no model, the best named model installed is served (`chosen_default`).

The one start-up of every place that serves: `typedlm serve` hands it to the model process (or runs it on a thread
of the server's), and each replica on Ray Serve runs it.
"""

from __future__ import annotations

import sys
import time

from typedlm.core.settings import ServerSettings
from typedlm.decide.config import served_config
from typedlm.decide.decider import Decider
from typedlm.runtime.catalog import DEFAULT_ORDER, default_model


def chosen_default() -> str:
    """The model a command serves where none is named (`catalog.default_model`: the best named model installed),
    said on stderr with the rule."""
    model = default_model()
    order = " > ".join(m.aliases[0] for m in DEFAULT_ORDER)
    print(
        f"typedlm: no --model given: {model.aliases[0]}, the best named model installed ({order}; "
        "`typedlm models` lists them, --model or $TYPEDLM_MODEL chooses)",
        file=sys.stderr,
    )
    return model.name


def load_served(settings: ServerSettings) -> Decider:
    """The decider a server answers with, loaded as `settings` say; the lines that say what was loaded."""
    started = time.perf_counter()
    model = settings.model or chosen_default()
    decider = Decider.load(model, settings.device, settings.dtype, config=served_config(settings))
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
