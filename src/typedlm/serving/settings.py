"""Server settings: one object, built by the CLI (or tests) and handed to `create_app`."""

from __future__ import annotations

import os
from dataclasses import dataclass

from typedlm.serving.batching import MAX_BATCH

DEFAULT_ALIASES = ("jev-latest",)
API_KEYS_ENV = "TYPEDLM_API_KEYS"
HEAD_TIMEOUT_S = 10.0  # seconds a request's line and headers may take to arrive (see server.protocol)
BODY_TIMEOUT_S = 30.0  # seconds a request's body may take to arrive whole after its head (see server.protocol)


def keys_from_env(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """API keys from TYPEDLM_API_KEYS (comma-separated; blanks ignored)."""
    raw = (environ if environ is not None else os.environ).get(API_KEYS_ENV, "")
    return tuple(key.strip() for key in raw.split(",") if key.strip())


PREFIX_CACHE_MB = 1024  # memory for prefilled documents reused across requests, by default


@dataclass(frozen=True)
class ServerSettings:
    """What the app and its model worker are told (`create_app`). Its defaults are the only ones: `ServeOptions`
    and `typedlm serve`'s options take theirs from here."""

    api_keys: tuple[str, ...] = ()  # empty: auth off
    max_queue: int = 16  # requests running or waiting for the model; more get 503 + Retry-After
    # requests one forward may answer, where the decider can (`serving.worker`): several documents per forward pay on
    # a GPU from 8 clients on (docs/performance.md, "Throughput"); a decider that runs one document per forward (a
    # CPU) takes one whatever this says
    max_batch: int = MAX_BATCH
    request_timeout_s: float = 300.0
    max_body_bytes: int = 8 * 1024 * 1024  # after decompression too
    aliases: tuple[str, ...] = DEFAULT_ALIASES  # model names that mean "the served model"
    retry_after_s: int = 1
    release_date: str = "2026-11-29"  # reported by /v1/models
    log_format: str = "text"  # the per-request log line: "text" (key=value) or "json"


# bodies of the largest size (`max_body_bytes`) that may be arriving at once, by default: the bytes of bodies not yet
# whole are held in the server's memory, bounded across connections by this many times the body limit (see
# server.protocol; 64 MiB by default, against the ~70 MB the HTTP process holds at rest)
PENDING_BODIES = 8
MAX_PENDING_BODY_BYTES = PENDING_BODIES * ServerSettings.max_body_bytes
