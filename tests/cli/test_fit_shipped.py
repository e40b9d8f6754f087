"""`typedlm fit-shipped`: its --help states what it reads and writes, and it fits on recorded readouts with the
embedded model loaded (the model's name and fingerprint in the report and the calibration file)."""

from __future__ import annotations

import json

import pytest

from typedlm.calibrate.calibration import CalibrationFile
from typedlm.cli import main
from typedlm.offline.readouts import save
from typedlm.runtime.models import EMBEDDED_MODEL

from ..offline.test_shipped import SETS, synthetic_readouts


def test_help_states_what_it_reads_and_writes(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit-shipped", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for words in (
        "--readouts",
        "--name-readouts",
        "--coherence-readouts",
        "SET.train.jsonl",
        "SET.held_out.jsonl",
        "docs/results/readouts/MODEL/",
        "--out PATH",
        "docs/results/loso-MODEL.json",
        "--calibration-file PATH",
        "src/typedlm/calibrate/shipped/NAME.json",
    ):
        assert words in out, words


def test_it_fits_on_recorded_readouts_with_the_embedded_model(tmp_path, capsys, embedded_dir):
    for seed, name in enumerate(SETS):
        save(tmp_path / "letters" / f"{name}.train.jsonl", synthetic_readouts(name, 40, seed))
        save(tmp_path / "letters" / f"{name}.held_out.jsonl", synthetic_readouts(name, 40, seed + 10))
    argv = ["fit-shipped", "--sets", *SETS, "--readouts", str(tmp_path / "letters"), "--order-reads", "1"]
    argv += ["--out", str(tmp_path / "report.json"), "--calibration-file", str(tmp_path / "calibration.json")]
    assert main(argv) == 0
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert report["model"] == EMBEDDED_MODEL and len(report["fingerprint"]) == 16
    assert set(report["held_out"]) == set(SETS) and report["reads"] == 1
    file = CalibrationFile.load(tmp_path / "calibration.json")
    assert (file.model, file.fingerprint) == (EMBEDDED_MODEL, report["fingerprint"])
    assert set(file.calibrator) == {"noul", "choice"}
    assert "chosen: " in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "letters").iterdir()) == sorted(
        f"{name}.{split}.jsonl" for name in SETS for split in ("train", "held_out")
    ), "nothing recorded: every file was there"
