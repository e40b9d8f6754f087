"""`ModelDescription`: what a served model is, as the start-up log, the metrics' model info and the OpenAPI
document's limits read it. Plain data: it crosses into the model process's parent and the HTTP layer."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelDescription:
    """A served model and the limits it enforces. Fields other than `model` may be unknown (None): a stand-in
    model (the tests') describes itself by name only."""

    model: str
    fingerprint: str | None = None
    device: str | None = None
    dtype: str | None = None
    context: int | None = None  # the model's context in tokens (None: unknown)
    calibration: str | None = None  # the default calibration method
    order_reads: int | None = None
    choice_answers: str | None = None
    prompt_version: str | None = None
    max_request_tokens: int | None = None
    max_reads: int | None = None  # reads (questions, every order read) one request may ask for
    max_forward_mb: int | None = None
    feedback_db: str | None = None  # the feedback database's path (None: none open)

    @property
    def keeps_feedback(self) -> bool:
        return self.feedback_db is not None

    def labels(self) -> dict[str, str]:
        """Every field as a string label (the metrics' `typedlm_model_info`): an unknown context says "unknown", no
        feedback database "none"; a stand-in's unknown fields are left out."""
        known = {key: str(value) for key, value in asdict(self).items() if value is not None}
        if self.fingerprint is not None:  # a real model: every field is known but these two may be absent
            known.setdefault("context", "unknown")
            known.setdefault("feedback_db", "none")
        return known
