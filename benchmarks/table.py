"""Markdown tables from latency's results files, for docs/performance.md.

python -m benchmarks.table benchmarks/results/latency/2026-11-29-cuda.json
"""

from __future__ import annotations

import argparse
import json


def tables(report: dict) -> str:
    qs = sorted({row["questions"] for row in report["rows"]})
    names = list(dict.fromkeys(row["strategy"] for row in report["rows"]))
    rows = {(row["strategy"], row["questions"]): row for row in report["rows"]}
    out = [
        f"{report['model']} on {report['device']}, {report['dtype']}, torch {report['torch']}, "
        f"median of {report['repeats']} after a warm-up, {report['date']}. In brackets: time / typedlm's.",
        "",
        "| strategy | " + " | ".join(f"Q = {q}" for q in qs) + " | fixed | per question |",
        "|---|" + "---:|" * (len(qs) + 2),
    ]
    for name in names:
        cells = [
            f"{rows[name, q]['ms']:.1f} ms ({rows[name, q]['x_typedlm']:.2f}×)"
            + ("¹" if rows[name, q].get("repeats") else "")
            if (name, q) in rows
            else "-"
            for q in qs
        ]
        fit = report["fits"].get(name, {})
        fixed = f"{fit['fixed_ms']:.1f} ms" if fit else "-"
        marginal = f"{fit['marginal_ms_per_question']:.2f} ms" if fit else "-"
        out.append(f"| {name} | " + " | ".join(cells) + f" | {fixed} | {marginal} |")
    generated = [rows["generate", q] for q in qs if ("generate", q) in rows]
    if generated:
        agree = ", ".join(
            f"Q = {r['questions']}: {r['parsed']} parsed, {r['agree_with_typedlm']} agree" for r in generated
        )
        out += ["", f"generate, labels parsed from its JSON and agreeing with typedlm's argmax: {agree}."]
    if any(row.get("repeats") for row in report["rows"]):
        out += [
            "",
            "¹ one run after a warm-up, in a run of its own beside typedlm (the ratio is to that run's typedlm).",
        ]
    if "typedlm_eager" in names:  # buffers and graphs are allocated at warm-up: memory.py measures them
        out += ["", "Memory with CUDA graphs: see memory.py (the timed runs allocate nothing new)."]
    elif "work_mb" in report["rows"][0]:
        out += ["", "| Q | typedlm's own peak | + the model's weights | total |", "|---:|---:|---:|---:|"]
        for q in qs:
            work = rows["typedlm", q]["work_mb"]
            out.append(f"| {q} | {work:.0f} MB | {report['model_mb']:.0f} MB | {work + report['model_mb']:.0f} MB |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="results files of latency")
    for path in parser.parse_args().paths:
        with open(path, encoding="utf-8") as f:
            print(tables(json.load(f)) + "\n")


if __name__ == "__main__":
    main()
