"""Fold jevcompat JSON reports: every requirement must pass in at least one report and fail in none."""

from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> int:
    status: dict[str, set[str]] = {}
    levels: dict[str, str] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        for result in report["results"]:
            status.setdefault(result["id"], set()).add(result["status"])
            levels[result["id"]] = result["level"]
    failed = sorted(rid for rid, seen in status.items() if "fail" in seen)
    untested = sorted(rid for rid, seen in status.items() if "pass" not in seen)
    for level in ("MUST", "SHOULD"):
        ids = [rid for rid in status if levels[rid] == level]
        passed = sum("pass" in status[rid] and "fail" not in status[rid] for rid in ids)
        print(f"{level}: {passed}/{len(ids)} passed")
    for rid in failed:
        print(f"FAILED {levels[rid]} {rid}")
    for rid in untested:
        print(f"NOT PASSED IN ANY RUN {levels[rid]} {rid}")
    return 1 if failed or untested else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
