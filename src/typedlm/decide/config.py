"""`DeciderConfig`: everything a decider is told, as one frozen object, resolved once.

    config = DeciderConfig.of(calibration="raw", feedback_db="none")   # a library call's, the CLI's or a replica's
    config = config.resolved(model_name, fingerprint)                 # what the model's own files fill in
    config = served_config(settings)                                  # a served model's, from its ServerSettings

`of` turns whatever the caller gives (strings from a command line or a settings file, enums, paths) into enums
and checked values, and is the one place a bad option is refused (`InvalidRequest`, naming it). `resolved` fills in
what depends on the model: the calibration file shipped for a named model where it matches these weights, and from
the file in force the prompt version, the order reads and how choices are read; the feedback database's path.
A decider only ever reads a resolved config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from typedlm.calibrate.calibration import CalibrationFile, shipped_calibration
from typedlm.calibrate.feedback import POLL_S
from typedlm.core.errors import InvalidRequest
from typedlm.core.names import CalibrationMethod, ChoiceAnswers
from typedlm.core.options import EngineOptions
from typedlm.core.questions import MAX_ORDER_READS
from typedlm.core.settings import ANSWER_WINDOW_MB, ANSWER_WINDOW_S, ServerSettings
from typedlm.store.feedback import FeedbackStore
from typedlm.text.prompt import PROMPT_VERSION, wording

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30


class FeedbackDB(Enum):
    """Where gold answers are kept, other than a path of the caller's: the model's own file in the cache folder
    (`FeedbackStore.default_path`)."""

    MODEL_DEFAULT = "default"


@dataclass(frozen=True)
class DeciderConfig:
    """What a decider runs with. None: decided for the model when `resolved` (see each field)."""

    engine: EngineOptions = field(default_factory=EngineOptions)  # the engine's feature switches
    max_input_tokens: int | None = None  # tokens per request (None: what max_forward_bytes admits)
    max_forward_bytes: int | None = None  # memory one request's forward may take (None: 1 GiB on a CPU, ¼ of a GPU)
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES  # documents kept across requests (0: the system prompt only)
    calibration: CalibrationMethod | None = None  # the default method (None: feedback, fitted or contextual)
    calibration_file: CalibrationFile | None = None  # None: the file shipped for a named model, where it matches
    order_reads: int | None = None  # option orders read per choice/score question (None: the file's, else 1)
    choice_answers: ChoiceAnswers | None = None  # None: what the calibration file was fitted with, else letters
    prompt_version: str | None = None  # the prompt's wording (None: the calibration file's, else PROMPT_VERSION)
    feedback_db: Path | FeedbackDB | None = None  # gold answers kept and learned from (None: none)
    feedback_poll_s: float = POLL_S  # how often the database is read for labels other processes stored
    answer_window_bytes: int = ANSWER_WINDOW_MB << 20  # recent answers held for labels by id (0: none)
    answer_window_s: float = ANSWER_WINDOW_S  # ... for at most this long
    answer_origin: str | None = None  # in every answer id: the replica that gave it (None: one server)

    @classmethod
    def of(
        cls,
        *,
        engine: EngineOptions | None = None,
        calibration: CalibrationMethod | str | None = None,
        calibration_file: CalibrationFile | str | Path | None = None,
        choice_answers: ChoiceAnswers | str | None = None,
        feedback_db: Path | FeedbackDB | str | None = None,
        **options: Any,
    ) -> DeciderConfig:
        """A config from a caller's options (`Decider`'s keywords): strings become enums, a calibration file's path
        its contents, "default" and "none" the feedback database's choices; the rest as given. A calibration file is
        read here, before any model loads, so that a bad one fails fast.

        Raises:
            InvalidRequest: an option out of its range or not one of its choices, named.
            ModelError: a calibration file that cannot be read.
        """
        if isinstance(calibration_file, (str, Path)):
            calibration_file = CalibrationFile.load(calibration_file)
        if feedback_db == FeedbackDB.MODEL_DEFAULT.value:
            feedback_db = FeedbackDB.MODEL_DEFAULT
        elif feedback_db in (None, "none"):
            feedback_db = None
        elif isinstance(feedback_db, str):
            feedback_db = Path(feedback_db)
        config = cls(
            engine=engine or EngineOptions(),
            calibration=_member(CalibrationMethod, calibration, "--calibration", ("--calibration",)),
            calibration_file=calibration_file,
            choice_answers=_member(ChoiceAnswers, choice_answers, "choice answers"),
            feedback_db=feedback_db,
            **options,
        )
        config.check()
        return config

    def check(self) -> None:
        """Refuse values out of their ranges (`InvalidRequest`)."""
        if self.max_forward_bytes is not None and self.max_forward_bytes <= 0:
            raise InvalidRequest("the memory a request's forward may take must be positive")
        if self.answer_window_bytes < 0 or self.answer_window_s <= 0:
            raise InvalidRequest("the window of recent answers takes 0 bytes or more, for more than 0 seconds")
        if self.order_reads is not None and not 1 <= self.order_reads <= MAX_ORDER_READS:
            raise InvalidRequest(f"order reads must be from 1 to {MAX_ORDER_READS}")
        if self.prompt_version is not None:
            wording(self.prompt_version)  # an unknown version fails here, before any forward

    def resolved(self, model: str, fingerprint: str) -> DeciderConfig:
        """This config with what depends on the model filled in (see the module); a given calibration file is
        checked against the model (`ModelError` where it was fitted for another model or prompt)."""
        file = self.calibration_file
        shipped = shipped_calibration(model) if file is None else None
        if shipped is not None and shipped.fingerprint != fingerprint:
            shipped = None  # shipped for other weights of the same name: its numbers mean nothing here
        prompt_version = self.prompt_version
        if prompt_version is None:
            known = file or shipped
            prompt_version = known.prompt_version if known is not None else PROMPT_VERSION
        wording(prompt_version)
        if file is not None:
            file.check(fingerprint, prompt_version)
        elif shipped is not None and shipped.prompt_version == prompt_version:
            file = shipped
        data = file.data if file is not None else {}
        order_reads = self.order_reads or int(data.get("order_reads", 1))
        choice_answers = self.choice_answers or _member(
            ChoiceAnswers, data.get("choice_answers", ChoiceAnswers.LETTERS), "choice answers"
        )
        feedback_db = self.feedback_db
        if feedback_db is FeedbackDB.MODEL_DEFAULT:
            feedback_db = FeedbackStore.default_path(fingerprint)  # one file per model, in the cache folder
        resolved = replace(
            self,
            calibration_file=file,
            prompt_version=prompt_version,
            order_reads=order_reads,
            choice_answers=choice_answers,
            feedback_db=feedback_db,
        )
        resolved.check()
        return resolved


def _member(kind: type[Enum], value: Any, option: str, loc: tuple[str, ...] = ()) -> Any:
    """`value` as a member of `kind` (None stays None), or an InvalidRequest naming `option` and the choices."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise InvalidRequest(f"{option} must be one of {choices}", loc) from None


def served_config(settings: ServerSettings) -> DeciderConfig:
    """The config of a served model, from its settings (`typedlm serve`, the model process, a replica)."""
    engine = EngineOptions(
        cuda_graphs=None if settings.cuda_graphs else False, fused_kernels=None if settings.fused_kernels else False
    )
    return DeciderConfig.of(
        engine=engine,
        max_input_tokens=settings.max_input_tokens,
        max_forward_bytes=settings.max_forward_mb << 20 if settings.max_forward_mb else None,
        prefix_cache_bytes=settings.prefix_cache_mb << 20,
        calibration=settings.calibration,
        calibration_file=settings.calibration_file,
        order_reads=settings.order_reads,
        feedback_db=settings.feedback_db,
        answer_window_bytes=settings.answer_window_mb << 20,
        answer_window_s=settings.answer_window_s,
        answer_origin=settings.answer_origin,
    )
