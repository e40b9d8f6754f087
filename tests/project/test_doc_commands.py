"""The shell blocks of README.md and docs/*.md marked runnable run as written.

A fenced block whose info string is `bash runnable` (docs/development.md, "Commands in these pages") is run with
bash, `set -euo pipefail`, from the repository root, with the virtual environment's `bin` first on the PATH, each
within `TIMEOUT_S`. Only blocks that are cheap and safe on a fresh checkout with the dev install are marked: no
server, no GPU, no network, nothing written into the checkout. A plain `bash` block is documentation and is not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "runnable"
TIMEOUT_S = 60
# a fence opening at the start of a line (indented inside a list item), its info string, its body, its closing fence
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,})(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S
)


def fenced_blocks(page: Path) -> list[tuple[int, str, str]]:
    """Every fenced block of a page: (line of its opening fence, info string, body with the fence's indent removed)."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for found in FENCE.finditer(text):
        line = text.count("\n", 0, found.start()) + 1
        blocks.append((line, found.group("info").strip(), textwrap.dedent(found.group("body"))))
    return blocks


def marked_blocks() -> list[tuple[str, str]]:
    """(`page:line`, body) of every block whose info string is `bash runnable`."""
    return [
        (f"{page.relative_to(ROOT)}:{line}", body)
        for page in PAGES
        for line, info, body in fenced_blocks(page)
        if info.split() == ["bash", MARK]
    ]


def venv_bin() -> Path:
    """The checkout's virtual environment (`make install-dev`), else the one running these tests."""
    local = ROOT / ".venv" / "bin"
    return local if local.is_dir() else Path(sys.executable).parent


def test_marked_blocks_are_found():
    found = marked_blocks()
    assert len(found) >= 5, f"runnable blocks found: {[where for where, _ in found]}"
    assert any(where.startswith("README.md:") for where, _ in found), "the README's runnable block"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_shell_blocks_are_plain_or_marked(page):
    # a misspelt marker (`bash runable`, `sh runnable`) would silently leave a block unrun
    for line, info, _ in fenced_blocks(page):
        words = info.split()
        if words and (MARK in words or words[0] in ("bash", "sh", "shell", "console")):
            assert words in (["bash"], ["bash", MARK]), f"{page.relative_to(ROOT)}:{line}: fence info {info!r}"


@pytest.mark.parametrize(("where", "body"), marked_blocks(), ids=[where for where, _ in marked_blocks()])
def test_marked_block_runs(where, body):
    env = {**os.environ, "PATH": f"{venv_bin()}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + body],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: still running after {TIMEOUT_S} s:\n{body}")
    assert done.returncode == 0, (
        f"{where}: exit {done.returncode}\n{body}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )
