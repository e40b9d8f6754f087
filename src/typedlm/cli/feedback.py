"""`typedlm feedback`: the feedback database from the command line (`typedlm.store.feedback`).

    typedlm feedback stats --feedback-db feedback.sqlite            # labels per kind and family, posts, dates
    typedlm feedback export labels.jsonl --feedback-db feedback.sqlite
    typedlm feedback import labels.jsonl --feedback-db merged.sqlite  # skips labels already there (by uid)

`typedlm.cli` registers it (`add_parser`, `run`). A database that cannot be opened, a file that is not one, or a line
that is not a label prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from typedlm.cli.common import EXIT_BAD_INPUT
from typedlm.core.errors import StoreError
from typedlm.store.feedback import FeedbackStore


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add `feedback export|import|stats` to the command line's subcommands."""
    database = argparse.ArgumentParser(add_help=False)
    database.add_argument(
        "--feedback-db", required=True, metavar="PATH", help="the feedback database (SQLite file) to read or write"
    )
    feedback = commands.add_parser("feedback", help="the feedback database: its labels as JSONL, its figures")
    actions = feedback.add_subparsers(dest="action", required=True)
    export = actions.add_parser("export", parents=[database], help="write every label as JSONL, one per line")
    export.add_argument("out", metavar="OUT.jsonl", help="the file to write (- for stdout)")
    imports = actions.add_parser(
        "import", parents=[database], help="add the labels of a JSONL file, skipping those already stored"
    )
    imports.add_argument("input", metavar="IN.jsonl", help="the file to read (- for stdin)")
    stats = actions.add_parser("stats", parents=[database], help="labels per kind and family, posts, first and last")
    stats.add_argument("--json", action="store_true", help="as JSON")


def run(args: argparse.Namespace) -> int:
    """Run `typedlm feedback ACTION`; a `StoreError` is one line on stderr and exit code 2."""
    try:
        if args.action != "import" and not Path(args.feedback_db).is_file():  # reading: never create an empty one
            raise StoreError(f"no feedback database at {args.feedback_db}; give the path of one (--feedback-db)")
        with FeedbackStore(args.feedback_db) as store:
            if args.action == "export":
                written = store.export(sys.stdout if args.out == "-" else args.out)
                print(f"typedlm: wrote {written} labels to {args.out}", file=sys.stderr)
            elif args.action == "import":
                added, skipped = store.import_(sys.stdin if args.input == "-" else args.input)
                print(f"typedlm: {added} labels added, {skipped} already in {args.feedback_db}", file=sys.stderr)
            else:
                stats = store.stats()
                print(json.dumps(stats, indent=1, ensure_ascii=False) if args.json else _table(stats))
    except StoreError as exc:
        print(f"typedlm: feedback: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _when(unix: float | None) -> str:
    return "-" if unix is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


def _short(text: object, width: int = 60) -> str:
    text = "" if text is None else text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(stats: dict) -> str:
    """The figures of `FeedbackStore.stats` for a reader: a few lines, then a row per question family."""
    kinds = ", ".join(f"{kind} {n}" for kind, n in stats["kinds"].items()) or "-"
    lines = [
        f"database  {stats['path']} ({stats['bytes'] / 1e6:.1f} MB)",
        f"labels    {stats['labels']} in {stats['posts']} posts",
        f"kinds     {kinds}",
        f"first     {_when(stats['first'])}",
        f"last      {_when(stats['last'])}",
    ]
    if stats["families"]:
        lines += ["", f"{'family':<18} {'kind':<7} {'labels':>7}  instructions"]
        for row in stats["families"]:
            lines.append(f"{row['family']:<18} {row['kind']:<7} {row['labels']:>7}  {_short(row['instructions'])}")
    return "\n".join(lines)
