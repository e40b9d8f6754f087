"""One set of defaults: `typedlm serve`'s options, `ServeOptions` and `ServerSettings` agree."""

from typedlm.cli import build_parser
from typedlm.cli.serve import _serve_options
from typedlm.serving.options import ServeOptions
from typedlm.serving.settings import API_KEYS_ENV, PREFIX_CACHE_MB, ServerSettings


def test_serve_with_no_options_runs_with_the_servers_defaults(monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    from_the_command_line = _serve_options(build_parser().parse_args(["serve"]))
    assert from_the_command_line.settings() == ServeOptions().settings() == ServerSettings()
    assert from_the_command_line.prefix_cache_mb == ServeOptions().prefix_cache_mb == PREFIX_CACHE_MB
    assert from_the_command_line.decider_options()["prefix_cache_bytes"] == PREFIX_CACHE_MB << 20


def test_each_option_reaches_the_settings(monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    argv = ["serve", "--max-queue", "3", "--max-batch", "5", "--timeout", "7", "--max-body-bytes", "1000"]
    settings = _serve_options(build_parser().parse_args([*argv, "--log-format", "json", "--api-key", "k"])).settings()
    assert (settings.max_queue, settings.max_batch, settings.request_timeout_s) == (3, 5, 7.0)
    assert (settings.max_body_bytes, settings.log_format, settings.api_keys) == (1000, "json", ("k",))
