"""docs/architecture.md matches the code: its file tree names every module of the package, and only modules that
exist, each under its folder; the layer order it, the README and the import contract (pyproject.toml) state is one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "typedlm"
PAGE = ROOT / "docs" / "architecture.md"


def _tree() -> list[str]:
    """The lines of the page's package tree: from `src/typedlm/` to the next top-level entry."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index("src/typedlm/")
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" "))
    return lines[start + 1 : end]


def _listed() -> dict[str, set[str]]:
    """Folder (relative to the package, "" for its root) → the files the tree names in it: a name at the start of a
    line indented under the folder, or a name.py mentioned inside a nested folder's description (server/routes/)."""
    listed: dict[str, set[str]] = {}
    folder = ""
    nested: str | None = None
    for line in _tree():
        match = re.match(r"^( +)(\S+)", line)
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2)
        if indent == 2:  # a layer's folder, or a file at the package's root
            if name.endswith("/"):
                folder, nested = name.rstrip("/"), None
            else:
                listed.setdefault("", set()).add(name)
            continue
        if indent == 4 and name.endswith("/"):
            nested = f"{folder}/{name.rstrip('/')}"
        elif indent == 4 and name.endswith(".py"):
            listed.setdefault(folder, set()).add(name)
            nested = None
        if nested is not None:  # a nested folder lists its modules inside its description
            listed.setdefault(nested, set()).update(re.findall(r"\b(\w+\.py)\b", line))
    return listed


def _modules() -> dict[str, set[str]]:
    """Folder → its modules."""
    found: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        folder = path.parent.relative_to(SOURCE).as_posix()
        found.setdefault("" if folder == "." else folder, set()).add(path.name)
    return found


def test_the_page_lists_every_module_of_the_package_and_no_other():
    """Every module is named (a folder's `__init__.py` may be: the CLI's holds its parser), none that is not."""
    listed, modules = _listed(), _modules()
    missing = {
        f"{folder}/{name}"
        for folder, names in modules.items()
        for name in names - listed.get(folder, set())
        if name != "__init__.py" or not folder
    }
    stale = {f"{folder}/{name}" for folder, names in listed.items() for name in names - modules.get(folder, set())}
    stale = {entry for entry in stale if entry.endswith(".py")}
    assert not missing, f"docs/architecture.md's tree lacks {sorted(missing)}"
    assert not stale, f"docs/architecture.md's tree names modules that do not exist: {sorted(stale)}"


def _contract_order() -> str:
    """The layers contract's order (pyproject.toml's `layers = [...]`), written as the pages write it."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (block,) = re.findall(r'type = "layers"\nlayers = \[(.*?)\]', text, re.DOTALL)
    layers = re.findall(r'"([^"]+)"', block)
    return " → ".join(layer.replace("typedlm.", "") for layer in layers)


def test_the_page_the_readme_and_the_import_contract_state_one_layer_order():
    order = _contract_order()
    page = PAGE.read_text(encoding="utf-8").replace("`", "")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"\n{order}\n" in page, f"docs/architecture.md does not state the contract's order: {order}"
    assert re.search(rf"^\s+{re.escape(order)}$", readme, re.MULTILINE), f"README.md does not state {order}"
    assert "serving" not in order and "hosting" in order and "calibrate" in order


MAX_MODULE_LINES = 400  # past it a module is split along a seam a reader can name


def test_no_module_of_the_package_or_the_benchmarks_is_over_the_line_limit():
    long = {
        str(path.relative_to(ROOT)): n
        for folder in (SOURCE, ROOT / "benchmarks")
        for path in folder.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
