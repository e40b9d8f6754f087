"""One set of settings: `typedlm serve`'s options are `ServerSettings`' fields, with its defaults, and each reaches the
settings the server, the model process and the decider are built from."""

import pytest

from typedlm.cli import build_parser
from typedlm.cli.options import option_fields, settings_from_args
from typedlm.core.errors import InvalidRequest
from typedlm.core.settings import API_KEYS_ENV, ServerSettings
from typedlm.decide.config import served_config


def test_serve_with_no_options_runs_with_the_servers_defaults(monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    monkeypatch.delenv("TYPEDLM_MODEL", raising=False)
    monkeypatch.delenv("TYPEDLM_FEEDBACK_DB", raising=False)
    assert settings_from_args(build_parser().parse_args(["serve"])) == ServerSettings()
    assert served_config(ServerSettings()).prefix_cache_bytes == ServerSettings().prefix_cache_mb << 20


def test_every_setting_but_the_internal_ones_is_an_option_of_serve():
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for name in option_fields():
        flag = (ServerSettings.model_fields[name].json_schema_extra or {}).get("flag", "--" + name.replace("_", "-"))
        assert flag in help_text, name
    assert "--aliases" not in help_text and "--release-date" not in help_text


def test_each_option_reaches_the_settings(monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    argv = ["serve", "--max-queue", "3", "--max-batch", "5", "--timeout", "7", "--max-body-bytes", "1000"]
    argv += ["--head-timeout", "2", "--body-timeout", "4", "--no-cuda-graphs", "--no-model-process", "--port", "9"]
    settings = settings_from_args(build_parser().parse_args([*argv, "--log-format", "json", "--api-key", "k"]))
    assert (settings.max_queue, settings.max_batch, settings.request_timeout_s) == (3, 5, 7.0)
    assert (settings.max_body_bytes, settings.log_format, settings.api_keys) == (1000, "json", ("k",))
    assert (settings.head_timeout_s, settings.body_timeout_s, settings.pending_body_bytes) == (2.0, 4.0, 8000)
    assert (settings.cuda_graphs, settings.model_process, settings.port) == (False, False, 9)
    assert served_config(settings).engine.cuda_graphs is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-queue", "0"], "--max-queue: Input should be greater than or equal to 1"),
        (["--timeout", "0"], "--timeout: Input should be greater than 0"),
        (["--max-body-bytes", "100", "--max-pending-body-bytes", "50"], "--max-pending-body-bytes: must be at least"),
    ],
)
def test_a_bad_value_is_refused_naming_its_option(argv, message):
    with pytest.raises(InvalidRequest, match=message):
        settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_the_window_of_recent_answers_reaches_the_decider(monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    argv = ["serve", "--answer-window-mb", "3", "--answer-window-s", "60"]
    config = served_config(settings_from_args(build_parser().parse_args(argv)))
    assert (config.answer_window_bytes, config.answer_window_s, config.answer_origin) == (3 << 20, 60.0, None)
    assert served_config(ServerSettings(answer_origin="r1")).answer_origin == "r1"
    with pytest.raises(InvalidRequest, match="--answer-window-s: Input should be greater than 0"):
        settings_from_args(build_parser().parse_args(["serve", "--answer-window-s", "0"]))
