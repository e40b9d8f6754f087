"""Fold jevcompat JSON reports: every requirement must pass in at least one report and fail in none.

    python scripts/check_conformance.py REPORT.json...

`judge` is the rule, also for tests/replicas/, which runs jevcompat against the replicas it starts and judges that
one report with it."""

from __future__ import annotations

import json
import sys
from typing import Any, NamedTuple


class Verdict(NamedTuple):
    """Reports folded; a requirement is named "LEVEL id", the lists sorted by id."""

    counts: dict[str, tuple[int, int]]  # MUST, SHOULD -> (passed in one report and failed in none, requirements)
    failed: list[str]  # failed in at least one report
    unpassed: list[str]  # passed in none

    @property
    def ok(self) -> bool:
        return not self.failed and not self.unpassed

    def lines(self) -> list[str]:
        counts = [f"{level}: {passed}/{total} passed" for level, (passed, total) in self.counts.items()]
        return [*counts, *(f"FAILED {r}" for r in self.failed), *(f"NOT PASSED IN ANY RUN {r}" for r in self.unpassed)]


def judge(reports: list[dict[str, Any]]) -> Verdict:
    """Fold decoded `jevcompat test --json` reports."""
    status: dict[str, set[str]] = {}
    levels: dict[str, str] = {}
    for report in reports:
        for result in report["results"]:
            status.setdefault(result["id"], set()).add(result["status"])
            levels[result["id"]] = result["level"]
    counts = {}
    for level in ("MUST", "SHOULD"):
        ids = [rid for rid in status if levels[rid] == level]
        counts[level] = (sum("pass" in status[rid] and "fail" not in status[rid] for rid in ids), len(ids))
    failed = [f"{levels[rid]} {rid}" for rid in sorted(status) if "fail" in status[rid]]
    unpassed = [f"{levels[rid]} {rid}" for rid in sorted(status) if "pass" not in status[rid]]
    return Verdict(counts, failed, unpassed)


def main(paths: list[str]) -> int:
    reports = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            reports.append(json.load(f))
    verdict = judge(reports)
    print("\n".join(verdict.lines()))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
