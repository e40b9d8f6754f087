"""The package's layers hold in fact: the plain-data layer and the HTTP server load without torch, and the
package's own exports load lazily (`import typedlm` alone imports nothing heavy)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "numpy")


@pytest.mark.parametrize(
    "modules",
    [
        "typedlm",
        "typedlm.core.questions, typedlm.core.answers, typedlm.core.errors, typedlm.core.options",
        "typedlm.server, typedlm.server.app, typedlm.server.chat",
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
