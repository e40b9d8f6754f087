"""The recorded response bodies (`scripts/record_bodies.py`): 72 requests answered by the embedded model under every
calibration method and both ways of reading choices, as they were recorded. A change meant to leave answers alone
(calibration code moved, the server's plumbing) must pass this; `record_bodies.py --check` is the same comparison
bit for bit, here relaxed to 1e-4 (absolute: every float in a body is a probability, a mass or a standard error)
since another CPU sums float32 in another order: up to 1.5e-5 measured between two Xeons.

The bodies were recorded in order by one decider, whose prefix cache each request leaves warmer for the next
(`x_cached_tokens`, and the floats read over a cached prefix): they replay in that order in one process, which is why
`make test` hands pytest-xdist's workers whole files (`--dist loadfile`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from typedlm import Decider
from typedlm.core.errors import TypedLMError

RECORDED = Path(__file__).parents[1] / "data" / "recorded-bodies.jsonl"
ROWS = [json.loads(line) for line in RECORDED.read_text(encoding="utf-8").splitlines()]


def close(a, b, path="") -> list[str]:
    """Where two JSON values differ (floats to 1e-4), as paths."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in close(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=0.0, abs_tol=1e-4) else [f"{path}: {a} != {b}"]
    return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} != {b!r}"]


@pytest.fixture(scope="module")
def deciders():
    return {way: Decider.load(choice_answers=way) for way in ("letters", "names")}


def test_there_are_72():
    assert len(ROWS) == 72
    assert {(row["way"], row["method"]) for row in ROWS} == {
        (way, method) for way in ("letters", "names") for method in ("raw", "contextual", "fitted")
    }


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['way']}-{r['method']}-{i % 12}" for i, r in enumerate(ROWS)])
def test_a_recorded_body_is_answered_as_recorded(deciders, row):
    try:
        response = deciders[row["way"]].respond(row["request"])
    except TypedLMError as exc:
        response = {"error": type(exc).__name__, "message": str(exc)}
    assert close(response, row["response"]) == []


def test_the_comparison_can_fail():
    row = next(r for r in ROWS if "answers" in r["response"])
    changed = json.loads(json.dumps(row["response"]))
    answer = next(iter(changed["answers"].values()))
    answer["x_raw_mass"] += 0.001
    assert close(changed, row["response"]) != []
