"""Command-line options made from `ServerSettings`' fields, and the settings read back from them.

    add_settings_options(parser, ("model", "device", "dtype"))   # --model, --device, --dtype, their help and defaults
    settings = settings_from_args(args)                          # a ServerSettings, or an InvalidRequest naming a flag

Each option is its field's: the flag (`--field-name`, or the field's own `flag`), type, choices, default and help
(its description, with the default said), so a setting is named, defaulted and described once
(`typedlm.core.settings`). A boolean is `--x/--no-x`, or only `--no-x` where its flag says so; a tuple is
repeatable.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from typedlm.core.errors import InvalidRequest
from typedlm.core.settings import ServerSettings, keys_from_env

KEYWORD_PATHS = ("default", "none")  # --feedback-db's keywords, not paths


def _scalar(annotation: Any) -> Any:
    """The annotation without its None (`int | None` → int)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return annotation


def flag_of(name: str, kind: type[ServerSettings] = ServerSettings) -> str:
    """The command-line flag of a settings field."""
    extra = kind.model_fields[name].json_schema_extra or {}
    return str(extra.get("flag", "--" + name.replace("_", "-")))


def option_fields(kind: type[ServerSettings] = ServerSettings) -> list[str]:
    """The fields that are command-line options (all but those marked `cli: False`)."""
    return [name for name, field in kind.model_fields.items() if (field.json_schema_extra or {}).get("cli", True)]


def add_settings_options(
    parser: argparse.ArgumentParser,
    names: Sequence[str],
    defaults: Mapping[str, Any] | None = None,
    more_help: Mapping[str, str] | None = None,
    kind: type[ServerSettings] = ServerSettings,
) -> None:
    """An option per field in `names` (see the module); `defaults` overrides a field's default on this command line
    (an environment variable's value, say); `more_help` adds to a field's help what only this layer knows (the
    named models, say)."""
    for name in names:
        field = kind.model_fields[name]
        extra = field.json_schema_extra or {}
        default = (defaults or {}).get(name, field.default)
        flag, help_text = flag_of(name, kind), field.description or ""
        if more_help and name in more_help:
            help_text = f"{help_text}; {more_help[name]}"
        options: dict[str, Any] = {"dest": name, "default": default}
        if "metavar" in extra:
            options["metavar"] = extra["metavar"]
        annotation = _scalar(field.annotation)
        if annotation is bool:
            if flag.startswith("--no-"):
                options["action"] = "store_false"
                options.pop("default")
            else:
                options["action"] = argparse.BooleanOptionalAction
            parser.add_argument(flag, help=help_text, **options)
            continue
        if typing.get_origin(annotation) is tuple:
            options.update(action="append", default=list(default))
        elif typing.get_origin(annotation) is typing.Literal:
            options["choices"] = typing.get_args(annotation)
        elif isinstance(annotation, type) and issubclass(annotation, Enum):
            options["choices"] = [member.value for member in annotation]
        else:
            options["type"] = annotation
        if default not in (None, ()):
            help_text += f" (default {_shown(default)})"
        parser.add_argument(flag, help=help_text, **options)


def _shown(default: Any) -> str:
    if isinstance(default, Enum):
        return str(default.value)
    return f"{default:g}" if isinstance(default, float) else str(default)


def settings_from_args(
    args: argparse.Namespace, kind: type[ServerSettings] = ServerSettings, **more: Any
) -> ServerSettings:
    """The settings the parsed options give (API keys from the environment too; paths made absolute, as the model
    process or a replica elsewhere reads them), as `kind` given `more` fields.

    Raises:
        InvalidRequest: a value out of its range, naming its flag.
    """
    from pydantic import ValidationError

    values = {name: getattr(args, name) for name in kind.model_fields if hasattr(args, name)}
    if "api_keys" in values:
        values["api_keys"] = (*values["api_keys"], *keys_from_env())
    if values.get("calibration_file"):
        values["calibration_file"] = str(Path(values["calibration_file"]).resolve())
    if "feedback_db" in values:
        values["feedback_db"] = feedback_path(values["feedback_db"])
    try:
        return kind(**{**values, **more})
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else ""
        option = flag_of(name, kind) if name in kind.model_fields else "--" + name.replace("_", "-")
        raise InvalidRequest(f"{option}: {error['msg'].removeprefix('Value error, ')}") from exc


def feedback_path(value: str) -> str:
    """--feedback-db as the model process (or a replica elsewhere) reads it: a path made absolute, or a keyword."""
    return value if value in KEYWORD_PATHS else str(Path(value).resolve())
