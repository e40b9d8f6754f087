"""The shipped calibration files' fit (`offline.shipped`): its options, and one fit on synthetic readouts."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import numpy as np
import pytest

from typedlm.calibrate.calibration import CalibrationFile
from typedlm.offline.readouts import Readout, save
from typedlm.offline.shipped import add_arguments, main
from typedlm.text.prompt import PROMPT_VERSION

SETS = ("a", "b", "c")


def synthetic_readouts(name: str, n: int, seed: int) -> list[Readout]:
    """Per example a yes/no and a 3-way choice answer, sharper than the truth; priors flat."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        for question, size in (("yes", 2), ("pick", 3)):
            true = rng.dirichlet(np.ones(size))
            masses = (true**2 / (true**2).sum() * 0.9).tolist()
            gold = int(rng.choice(size, p=true))
            kind = "noul" if size == 2 else "choice"
            out.append(Readout(name, f"{name}-{i}", question, kind, question, [masses], [[1 / size] * size], gold))
    return out


def _fake_decider_loader(loads: list):
    def load_decider(model, choice_answers, prompt_version):
        loads.append((model, choice_answers, prompt_version))
        return SimpleNamespace(name="fake-model", fingerprint="0123456789abcdef", prompt_version=prompt_version)

    return load_decider


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_options_and_their_defaults(tmp_path):
    args = _args(["--sets", "a", "b", "--readouts", str(tmp_path), "--out", str(tmp_path / "report.json")])
    assert args.sets == ["a", "b"] and args.model is None and args.limit == 150 and args.order_reads == 3
    assert args.prompt_version == PROMPT_VERSION and args.calibration_file is None and not args.select_only
    assert args.name_readouts is None and args.coherence_readouts is None
    with pytest.raises(SystemExit) as exit_:
        _args(["--readouts", str(tmp_path), "--out", str(tmp_path / "report.json")])
    assert exit_.value.code == 2, "--sets is required"


def test_a_fit_on_recorded_readouts_writes_the_report_and_a_calibration_file(tmp_path, capsys):
    for seed, name in enumerate(SETS):
        save(tmp_path / "letters" / f"{name}.train.jsonl", synthetic_readouts(name, 40, seed))
        save(tmp_path / "letters" / f"{name}.held_out.jsonl", synthetic_readouts(name, 40, seed + 10))
    loads: list = []
    argv = ["--sets", *SETS, "--readouts", str(tmp_path / "letters"), "--order-reads", "1"]
    argv += ["--out", str(tmp_path / "report.json"), "--calibration-file", str(tmp_path / "calibration.json")]
    assert main(_args(argv), _fake_decider_loader(loads)) == 0
    assert loads == [(None, "letters", "1")], "one decider, by letter, never asked to read: every file is there"
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert report["model"] == "fake-model" and report["reads"] == 1 and report["choice_answers"] == "letters"
    assert set(report["selection"]) == {"1 read", "1 read, sets weighed equally"}
    assert set(report["variants"]) == {"noul", "choice"} and set(report["held_out"]) == set(SETS)
    assert report["chosen"].startswith("1 read") and report["negation_weight"] is None
    file = CalibrationFile.load(tmp_path / "calibration.json")
    assert (file.model, file.fingerprint, file.prompt_version) == ("fake-model", "0123456789abcdef", "1")
    assert file.data["examples"] == {name: 40 for name in SETS} and file.data["answers"] == 240
    assert file.data["variants"] == report["variants"] and file.data["order_reads"] == 1
    assert set(file.calibrator) == {"noul", "choice"}
    out = capsys.readouterr().out
    assert "chosen: " in out and "| set | method | answers | accuracy | ECE | Brier |" in out
