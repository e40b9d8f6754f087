"""`typedlm eval` and `typedlm calibrate`: in process and over HTTP, end to end on the real embedded model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from typedlm.calibrate.calibration import CalibrationFile
from typedlm.core.errors import InvalidRequest
from typedlm.core.questions import NO, YES, parse_questions
from typedlm.offline.evaldata import Example, write_jsonl
from typedlm.offline.evaluate import HttpBackend, LocalBackend, evaluate, load_examples
from typedlm.offline.fitting import fit_calibrations

QUESTIONS = {
    "positive": {"type": "noul", "instructions": "Is this review positive?"},
    "topic": {"type": "choice", "criteria": {"film": None, "food": None, "sport": None}},
    "stars": {"type": "score", "instructions": "How many stars?", "criteria": ["one", "two", "three"]},
}
GOLD = [(True, "film", 2), (False, "food", 0), (False, "sport", 1)]
STATES = [
    "A wonderful film, moving and funny.",
    "The soup was cold and the bread stale.",
    "A dull match, nobody scored.",
]
EXAMPLES = [
    Example(name, "test", state, QUESTIONS, dict(zip(QUESTIONS, gold, strict=True)))
    for name, state, gold in zip("abc", STATES, GOLD, strict=True)
]


@pytest.fixture()
def data_file(tmp_path):
    path = tmp_path / "examples.jsonl"
    write_jsonl(path, EXAMPLES)
    return path


def test_gold_answers_become_class_indices():
    questions = parse_questions(QUESTIONS)
    assert questions["positive"].gold_index(True) == YES == 0 and questions["positive"].gold_index(False) == NO == 1
    assert questions["topic"].gold_index("sport") == 2
    assert questions["stars"].gold_index(1) == 1


def test_examples_load_from_files_and_names_are_checked(data_file):
    assert [e.id for e in load_examples(str(data_file), "all")] == ["a", "b", "c"]
    with pytest.raises(InvalidRequest, match="neither a dataset"):
        load_examples("no-such-data")


def test_in_process_and_over_http_agree(real_decider, server_url):
    local = evaluate(LocalBackend(real_decider), EXAMPLES, ["raw", "contextual"], [1, 2])
    remote = evaluate(HttpBackend(server_url), EXAMPLES, ["raw", "contextual"], [1, 2])
    assert set(local) == {"raw", "contextual", "raw, 2 orders", "contextual, 2 orders"} == set(remote)
    for row in local:
        for kind in ("overall", "noul", "choice", "score"):
            assert local[row][kind]["n"] == (9 if kind == "overall" else 3)
            for metric in ("accuracy", "ece", "brier", "nll", "mean_raw_mass"):
                assert local[row][kind][metric] == pytest.approx(remote[row][kind][metric], abs=1e-5), (row, kind)


def test_fitted_files_match_the_model(real_decider):
    files = fit_calibrations(real_decider, EXAMPLES, ["raw", "contextual"], {"sets": ["test"]})
    for base, fitted in files.items():
        assert fitted.base == base and set(fitted.params) == {"noul", "choice", "score"}
        assert fitted.data["answers"] == {"noul": 3, "choice": 3, "score": 3} and not fitted.questions  # < 30 each
        fitted.check(real_decider.fingerprint, "1")


def typedlm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "typedlm.cli", *args], capture_output=True, text=True, timeout=600)


def test_eval_and_calibrate_commands(data_file, tmp_path):
    out = tmp_path / "report.json"
    done = typedlm("eval", str(data_file), "--split", "all", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "| test" not in done.stdout and "accuracy" in done.stdout  # the Markdown table
    report = json.loads(out.read_text())
    # the embedded model's shipped calibration file is its default: a row of its own beside raw and contextual
    assert report["examples"] == 3 and set(report["rows"]) == {"raw", "contextual", "fitted (shipped default)"}
    assert (tmp_path / "report-raw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cal = tmp_path / "cal.json"
    done = typedlm("calibrate", str(data_file), "--split", "all", "--out", str(cal))
    assert done.returncode == 0, done.stderr
    request = json.dumps({"state": EXAMPLES[0].state, "questions": QUESTIONS})
    asked = subprocess.run(
        [sys.executable, "-m", "typedlm.cli", "ask", "--calibration-file", str(cal)],
        input=request,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["x_calibration"] == "fitted"
    tampered = CalibrationFile.load(cal)
    CalibrationFile(tampered.model, "0" * 16, "1", "raw", tampered.params).save(cal)
    refused = typedlm("serve", "--calibration-file", str(cal), "--port", "1")
    assert refused.returncode == 3 and "another model" in refused.stderr
    assert typedlm("eval", "no-such-data").returncode == 2
