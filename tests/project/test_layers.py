"""The package's layers hold in fact: the plain-data layer and the HTTP server load without torch, the
package's own exports load lazily (`import typedlm` alone imports nothing heavy), no module imports one that imports
it back, and only the adapter (`runtime/hf.py`) names transformers' model parts and config fields."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "numpy")


@pytest.mark.parametrize(
    "modules",
    [
        "typedlm",
        "typedlm.core.questions, typedlm.core.answers, typedlm.core.errors, typedlm.core.options",
        "typedlm.server, typedlm.server.app, typedlm.server.chat",
        "typedlm.hosting.worker, typedlm.hosting.served, typedlm.hosting.model_process, typedlm.core.settings",
    ],
)
def test_importing_leaves_torch_transformers_and_numpy_unloaded(modules):
    code = f"import sys\nimport {modules}\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "", f"importing {modules} loaded {loaded}"


def test_the_command_line_reads_its_arguments_without_torch():
    """`typedlm --help` and a request refused before the model loads never pay for torch or transformers."""
    code = "import sys\nimport typedlm.cli\nprint(','.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "", f"importing typedlm.cli loaded {loaded}"


def test_the_package_exports_load_on_first_use():
    code = (
        "import sys, typedlm\n"
        "assert 'torch' not in sys.modules\n"
        "from typedlm import NoulQuestion\n"
        "assert 'torch' not in sys.modules\n"
        "from typedlm import Decider\n"
        "assert 'torch' in sys.modules and Decider.__module__ == 'typedlm.decide.decider'\n"
        "assert set(typedlm.__all__) <= set(dir(typedlm)) and all(getattr(typedlm, n) for n in typedlm.__all__)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_name_is_an_attribute_error():
    import typedlm

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        typedlm.Nope  # noqa: B018


SOURCE = Path(__file__).resolve().parents[2] / "src" / "typedlm"


def _module_names() -> dict[str, Path]:
    """Every module under src/typedlm by its dotted name (a package by its own name, not `__init__`)."""
    names = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = ("typedlm", *path.relative_to(SOURCE).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: those outside functions (a function's are lazy, by choice);
    those under `if TYPE_CHECKING:` count, as a type checker follows them."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module → the typedlm modules it imports at module level. `from P import name` counts as importing P.name
    where that is a module, else P; a parent package run first by Python is not an edge (every submodule would
    close a loop with its package's `__init__`)."""
    modules = _module_names()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _module_level_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph, as the modules along it back to the first; None if there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_module_imports_a_module_that_imports_it_back():
    graph = _import_graph()
    assert "typedlm.offline.corpora" in graph["typedlm.offline.evaldata"], "the graph sees module-level imports"
    cycle = _cycle(graph)
    assert cycle is None, "an import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle_through_others():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# transformers' names for a model's parts and config fields, read only by `typedlm.runtime.hf`, the adapter:
HF_NAMES = (
    "self_attn", "input_layernorm", "post_attention_layernorm",  # a decoder layer's parts
    "q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm",  # an attention's
    "gate_proj", "up_proj", "down_proj",  # a gated MLP's
    "variance_epsilon",  # a norm's epsilon
    "apply_rotary_pos_emb",  # a family's rotary function
    "get_text_config", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "hidden_size",
    "intermediate_size", "max_position_embeddings", "final_logit_softcapping",  # config fields
    "_attn_implementation", "set_attn_implementation", "get_decoder", "get_output_embeddings",
)  # fmt: skip
ADAPTER = SOURCE / "runtime" / "hf.py"


def _names_in_code(tree: ast.Module) -> set[str]:
    """The identifiers a module's code uses (attributes, names, arguments, keywords, imports) and the words of its
    strings, docstrings left out (prose may name a part)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names.update(re.findall(r"\w+", node.value))
    return names


def test_only_the_adapter_names_transformers_parts_and_config_fields():
    """The generic names among transformers' (a layer's `mlp`, a decoder's `layers` and `norm`, an attention's
    `head_dim`, `scaling` and `sliding_window`, a norm's `eps`) are typedlm's own names too: hf.py reads them on
    transformers' modules as well, but a name alone cannot tell which, so they are not listed."""
    assert set(HF_NAMES) <= _names_in_code(ast.parse(ADAPTER.read_text(encoding="utf-8"))), "hf.py reads them all"
    found = {
        str(path.relative_to(SOURCE)): sorted(set(HF_NAMES) & _names_in_code(ast.parse(path.read_text("utf-8"))))
        for path in sorted(SOURCE.rglob("*.py"))
        if path != ADAPTER
    }
    assert {path: names for path, names in found.items() if names} == {}
