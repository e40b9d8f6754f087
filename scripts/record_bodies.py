"""Recorded response bodies: what the embedded model answers to a fixed set of requests, under every calibration
method and both ways of reading choices, kept so that a change meant to leave answers alone can be shown to.

    python scripts/record_bodies.py            # (re)write tests/data/recorded-bodies.jsonl from this checkout
    python scripts/record_bodies.py --check    # compare this checkout's answers with the file, bit for bit

`tests/decide/test_recorded_bodies.py` checks the same file to 1e-4 (another CPU may sum float32 in
another order); `--check` is the exact comparison, run on the machine that recorded the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "recorded-bodies.jsonl"
METHODS = ("raw", "contextual", "fitted")
WAYS = ("letters", "names")


def bodies() -> list[dict]:
    """Twelve request bodies: the examples, a wide choice among many yes/no questions, a long state read in three
    option orders, and one that names its own calibration."""
    examples = ROOT / "examples"
    found = [json.loads((examples / "request.json").read_text())]
    found += [json.loads(line) for line in (examples / "requests.jsonl").read_text().splitlines() if line.strip()]
    questions = json.loads((examples / "questions.json").read_text())
    for line in (examples / "tickets.jsonl").read_text().splitlines():
        if line.strip():
            found.append({"state": json.loads(line)["state"], "questions": questions})
    wide = {"type": "choice", "criteria": {f"option number {i}": None for i in range(60)}}
    yes_no = {f"q{i}": {"type": "noul", "instructions": f"Is it about item {i}?"} for i in range(20)}
    found.append({"state": "The parcel never arrived.", "questions": {"big": wide, **yes_no}})
    found.append(
        {
            "state": "A long note. " * 300,
            "questions": {
                "s": {"type": "score", "criteria": ["a", "b", "c", "d"]},
                "c": {"type": "choice", "criteria": {"x": None, "y": "why"}},
            },
            "x_order_reads": 3,
        }
    )
    found.append({"state": "Short.", "questions": {"n": {"type": "noul"}}, "x_calibration": "raw"})
    return [{k: v for k, v in body.items() if k != "id"} for body in found]


def cases() -> list[tuple[str, str, dict]]:
    """(way, method, body) for every body under every method (a body naming its own keeps it) and way: 72."""
    out = []
    for way in WAYS:
        for method in METHODS:
            for body in bodies():
                out.append((way, method, {"x_calibration": method, **body}))
    return out


def answer_all() -> list[dict]:
    from typedlm import Decider
    from typedlm.core.errors import TypedLMError

    rows, deciders = [], {}
    for way, method, body in cases():
        if way not in deciders:
            deciders[way] = Decider.load(choice_answers=way)
        try:
            response = deciders[way].respond(body)
        except TypedLMError as exc:  # a refusal is an answer too: its message must not change either
            response = {"error": type(exc).__name__, "message": str(exc)}
        rows.append({"way": way, "method": method, "request": body, "response": response})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the recorded file instead of writing it")
    args = parser.parse_args()
    rows = answer_all()
    if not args.check:
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        RECORDED.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        print(f"{len(rows)} bodies written to {RECORDED.relative_to(ROOT)}")
        return 0
    recorded = [json.loads(line) for line in RECORDED.read_text(encoding="utf-8").splitlines()]
    differ = [i for i, (a, b) in enumerate(zip(rows, recorded, strict=True)) if a != b]
    same = len(rows) - len(differ)
    print(f"{same} of {len(rows)} bodies identical bit for bit", f"(differ: {differ})" if differ else "")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
