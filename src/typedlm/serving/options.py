"""`ServeOptions`: all that `typedlm serve` is told, the model to load and the server's settings, as one object,
from the command line or from Ray Serve's application args (`typedlm.replicas.app`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from typedlm.core.options import EngineOptions
from typedlm.serving.settings import DEFAULT_ALIASES, PREFIX_CACHE_MB, ServerSettings

_SERVER = ServerSettings()  # the server's defaults, taken from here rather than repeated


class ServeOptions(BaseModel):
    """What `typedlm serve` runs: the model to load (`decider_options`, the keyword arguments of `Decider.load`)
    and the server's settings (`settings`). One object for the single server and for each replica on Ray Serve."""

    model: str | None = None  # None: the embedded default; a named model, hub id or path otherwise
    device: str = "cpu"
    dtype: str | None = None
    api_keys: list[str] = []
    max_queue: int = Field(_SERVER.max_queue, ge=1)
    max_batch: int = Field(_SERVER.max_batch, ge=1)
    timeout: float = Field(_SERVER.request_timeout_s, gt=0)
    max_body_bytes: int = Field(_SERVER.max_body_bytes, ge=1)
    log_format: Literal["text", "json"] = _SERVER.log_format  # type: ignore[assignment]
    max_input_tokens: int | None = Field(None, ge=1)
    max_forward_mb: int | None = Field(None, ge=1)  # None: the decider's default for its device
    prefix_cache_mb: int = Field(PREFIX_CACHE_MB, ge=0)
    cuda_graphs: bool = True
    fused_kernels: bool = True
    calibration: str | None = None  # None: the decider's default ("fitted" with a calibration file)
    calibration_file: str | None = None
    order_reads: int | None = None
    feedback_db: str = "default"  # a path, "default" (the model's file in the cache folder) or "none"

    def settings(self, aliases: tuple[str, ...] = DEFAULT_ALIASES) -> ServerSettings:
        return ServerSettings(
            api_keys=tuple(self.api_keys),
            max_queue=self.max_queue,
            max_batch=self.max_batch,
            request_timeout_s=self.timeout,
            max_body_bytes=self.max_body_bytes,
            aliases=aliases,
            log_format=self.log_format,
        )

    def decider_options(self) -> dict[str, Any]:
        engine = EngineOptions(
            cuda_graphs=None if self.cuda_graphs else False, fused_kernels=None if self.fused_kernels else False
        )
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "engine": engine,
            "max_input_tokens": self.max_input_tokens,
            "max_forward_bytes": self.max_forward_mb << 20 if self.max_forward_mb else None,
            "prefix_cache_bytes": self.prefix_cache_mb << 20,
            "calibration": self.calibration,
            "calibration_file": self.calibration_file,
            "order_reads": self.order_reads,
            "feedback_db": self.feedback_db,
        }
