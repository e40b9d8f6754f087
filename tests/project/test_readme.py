"""The README's first request and the response it shows: the model `make serve` serves (`catalog.DEFAULT_ORDER`'s
first) answers it so. Run where that model is installed, skipped with a message elsewhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from typedlm import Decider
from typedlm.runtime.catalog import DEFAULT_ORDER

from ..conftest import json_leaves

ROOT = Path(__file__).resolve().parents[2]
REQUEST = "examples/request.json"


def _shown_response() -> dict:
    """The JSON block right after the README's curl command that posts examples/request.json."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"-d @{re.escape(REQUEST)}\n```\n+```json\n(.*?)\n```", readme, re.DOTALL)
    assert found, f"the README's curl command posting {REQUEST}, followed by the response it shows"
    return json.loads(found.group(1))


SERVED = DEFAULT_ORDER[0]


@pytest.mark.skipif(
    not SERVED.installed(), reason=f"the README shows {SERVED.name}'s answer: `{SERVED.install_command}`"
)
def test_the_readme_shows_what_the_server_answers_its_first_request():
    shown = _shown_response()
    assert shown["model"] == SERVED.name
    # a decider as `typedlm serve` makes it (the shipped calibration, an empty prefix cache, no feedback)
    served = Decider.load(SERVED.aliases[0], feedback_db="none")
    body = json.loads((ROOT / REQUEST).read_text(encoding="utf-8"))
    got = served.respond(body)
    assert got["usage"] == shown["usage"], "input and cached tokens as the README shows them"
    got_leaves, shown_leaves = dict(json_leaves(got)), dict(json_leaves(shown))
    assert got_leaves.keys() == shown_leaves.keys(), "the same shape"
    for path, value in shown_leaves.items():
        if isinstance(value, float):  # the README rounds to three places
            assert got_leaves[path] == pytest.approx(value, abs=6e-4), path
        else:
            assert got_leaves[path] == value, path
