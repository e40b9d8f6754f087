"""`ServerSettings`: everything a served model is told, as one object whose fields are named once.

    settings = ServerSettings(max_queue=32, model="qwen2.5-coder-1.5b")   # a test, a library caller
    settings = settings_from_args(args)                                   # `typedlm serve` (`typedlm.cli.options`)

From it are built: `typedlm serve`'s options (each field's flag, type, default and help, `typedlm.cli.options`), the
HTTP app and its model worker (`create_app`), the model process, the decider's config
(`typedlm.decide.config.DeciderConfig.served`) and each replica on Ray Serve (`typedlm.replicas.app.ReplicaArgs`,
this plus the replicas' own fields). Every default is here and nowhere else.

A field's `description` is its command-line help; `json_schema_extra` may name its `flag` (where it is not the
field's name) and whether it is a command-line option at all (`cli: False`).
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from typedlm.core.names import CalibrationMethod

DEFAULT_ALIASES = ("jev-latest",)
API_KEYS_ENV = "TYPEDLM_API_KEYS"
FEEDBACK_DB_ENV = "TYPEDLM_FEEDBACK_DB"
MODEL_ENV = "TYPEDLM_MODEL"
MAX_BATCH = 64  # requests answered by one forward, at most
ANSWER_WINDOW_MB = 128  # recent answers held for labels by id (x_id), in MiB ...
ANSWER_WINDOW_S = 86400.0  # ... and for at most this many seconds (a day)
# bodies of the largest size (`max_body_bytes`) that may be arriving at once, by default: the bytes of bodies not yet
# whole are held in the server's memory, bounded across connections by this many times the body limit (see
# server.protocol; 64 MiB by default, against the ~70 MB the HTTP process holds at rest)
PENDING_BODIES = 8


def keys_from_env(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """API keys from TYPEDLM_API_KEYS (comma-separated; blanks ignored)."""
    raw = (environ if environ is not None else os.environ).get(API_KEYS_ENV, "")
    return tuple(key.strip() for key in raw.split(",") if key.strip())


def _flag(name: str, **more: object) -> dict[str, object]:
    return {"flag": name, **more}


class ServerSettings(BaseModel):
    """What a served model runs with: where it listens, what its server enforces, the model it loads and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # -- where and how it listens ---------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port")
    model_process: bool = Field(
        True,
        description="run the model in a process of its own, so that HTTP work and the model's threads do not share "
        "one interpreter lock; --no-model-process: the model in the server's process",
    )
    # -- what the server enforces ---------------------------------------------------------------------------
    api_keys: tuple[str, ...] = Field(
        (),
        description=f"require Authorization: Bearer KEY (repeatable; also {API_KEYS_ENV}, comma-separated; default: "
        "none, auth off)",
        json_schema_extra=_flag("--api-key", metavar="KEY"),
    )
    max_queue: int = Field(16, ge=1, description="requests running or waiting; more get 503 + Retry-After")
    # several documents per forward pay on a GPU from 8 clients on (docs/performance.md, "Throughput"); a decider
    # that runs one document per forward (a CPU) takes one whatever this says
    max_batch: int = Field(
        MAX_BATCH,
        ge=1,
        description="requests one forward may answer together, where the model runs several documents per forward "
        "(a GPU with static shapes); 1: one forward per request, the next tokenized meanwhile",
    )
    request_timeout_s: float = Field(
        300.0, gt=0, description="seconds per request before a 504", json_schema_extra=_flag("--timeout")
    )
    head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="seconds a request's line and headers may take to arrive, else 408",
        json_schema_extra=_flag("--head-timeout"),
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="seconds a request's body may take to arrive whole after its head, else 408",
        json_schema_extra=_flag("--body-timeout"),
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1, description="request body limit, after decompression")
    max_pending_body_bytes: int | None = Field(
        None,
        ge=1,
        description="bytes of request bodies still arriving, held across connections; a request that would pass it "
        f"gets 503 + Retry-After (default: {PENDING_BODIES} x --max-body-bytes, 64 MiB)",
    )
    log_format: Literal["text", "json"] = Field("text", description="the one line logged per request: text or JSON")
    aliases: tuple[str, ...] = Field(DEFAULT_ALIASES, json_schema_extra={"cli": False})  # names of the served model
    retry_after_s: int = Field(1, ge=0, json_schema_extra={"cli": False})
    release_date: str = Field("2026-11-29", json_schema_extra={"cli": False})  # reported by /v1/models
    # -- the model and how it is read ------------------------------------------------------------------------
    model: str | None = Field(
        None,
        description="a named model, a Hugging Face id, a local directory or a .gguf file (default: the embedded model)",
    )
    device: str = Field("cpu", description="cpu, cuda, cuda:N or mps")
    dtype: str | None = Field(None, description="float32 or bfloat16 (default: float32 on CPU, bfloat16 on CUDA)")
    max_input_tokens: int | None = Field(
        None,
        ge=1,
        description="tokens per request (default: what --max-forward-mb admits; each question with the document within "
        "the model's context either way)",
    )
    max_forward_mb: int | None = Field(
        None,
        ge=1,
        description="memory one request's forward may take, estimated before it runs, else 413 (default: 1024 on a "
        "CPU, a quarter of a GPU's memory)",
    )
    prefix_cache_mb: int = Field(
        1024, ge=0, description="memory for prefilled documents reused across requests (0: off)"
    )
    cuda_graphs: bool = Field(
        True,
        description="on CUDA, replay captured graphs; --no-cuda-graphs runs each forward eagerly",
        json_schema_extra=_flag("--no-cuda-graphs"),
    )
    fused_kernels: bool = Field(
        True,
        description="on CUDA, fused kernels; --no-fused-kernels keeps the model's own norms, MLPs and rotary and "
        "torch's attention kernels",
        json_schema_extra=_flag("--no-fused-kernels"),
    )
    calibration: CalibrationMethod | None = Field(
        None,
        description="default calibration method (requests may pick another with x_calibration; default: feedback with "
        "a feedback database, else fitted with --calibration-file or the file shipped for a named model, else "
        "contextual)",
    )
    calibration_file: str | None = Field(
        None,
        description="parameters fitted by `typedlm calibrate` (default: the file shipped for a named model, if any)",
    )
    order_reads: int | None = Field(
        None,
        ge=1,
        description="option orders read per choice/score question, averaged (requests: x_order_reads; default: what "
        "the calibration file was fitted with, else 1)",
    )
    feedback_db: str = Field(
        "default",
        description="the SQLite file gold answers are posted to and learned from (POST /v1/systemone/feedback); "
        "none: keep nothing; default: feedback/<model fingerprint>.sqlite in the cache folder ($TYPEDLM_CACHE or "
        f"~/.cache/typedlm; ${FEEDBACK_DB_ENV} sets another default)",
        json_schema_extra={"metavar": "PATH"},
    )

    answer_window_mb: int = Field(
        ANSWER_WINDOW_MB,
        ge=0,
        description="with a feedback database: memory for recent answers held so that a label may name one by its "
        "x_id and cost no second forward (0: none held, answers carry no x_id)",
    )
    answer_window_s: float = Field(
        ANSWER_WINDOW_S,
        gt=0,
        description="seconds a recent answer is held for a label by its x_id (the oldest go first when the memory "
        "is full)",
    )
    answer_origin: str | None = Field(None, json_schema_extra={"cli": False})  # a replica's id, in its answers' ids

    @field_validator("max_pending_body_bytes")
    @classmethod
    def _one_body_fits(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < info.data.get("max_body_bytes", 0):
            raise ValueError("must be at least --max-body-bytes (one whole body must fit)")
        return value

    @property
    def pending_body_bytes(self) -> int:
        """Bytes of bodies still arriving that the server holds at once (`max_pending_body_bytes` or its default)."""
        return self.max_pending_body_bytes or PENDING_BODIES * self.max_body_bytes


DEFAULTS = ServerSettings()
HEAD_TIMEOUT_S = DEFAULTS.head_timeout_s
BODY_TIMEOUT_S = DEFAULTS.body_timeout_s
MAX_PENDING_BODY_BYTES = DEFAULTS.pending_body_bytes
