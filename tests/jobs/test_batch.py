"""Batch jobs: a file of requests in, one record per row out, in order, resumable; bad rows become error records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from typedlm.jobs.batch import read_rows, resume, run_batch

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "topic": {"type": "choice", "criteria": {"billing": None, "shipping": None}},
}


def _rows() -> list:
    return [
        {"state": "I was charged twice; refund the second charge.", "questions": QUESTIONS},
        {"id": "ticket-7", "state": "The parcel is late again.", "questions": QUESTIONS, "x_calibration": "raw"},
        {"state": "x", "questions": {"q": {"type": "choice", "criteria": {"only": None}}}},  # one option: 422
        {"model": "gpt-4", "state": "x", "questions": QUESTIONS},  # a model this server does not serve: 404
        {"state": "Thanks, all good now.", "questions": QUESTIONS, "model": "jev-latest"},
    ]


def _write(path: Path, rows: list, broken_line: int | None = None) -> None:
    lines = [json.dumps(row) for row in rows]
    if broken_line is not None:
        lines.insert(broken_line, '{"state": "unterminated')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _same_response(got: dict, want: dict, tolerance: float = 1e-5) -> None:
    """The same answers, up to float rounding: one of the two may have read its document from the prefix cache, and
    on a CPU a matrix product's row is rounded differently in a product of another number of rows (the library
    blocks rows by count), which moves a float32 answer by up to about 2e-6 over the embedded model's layers."""

    def numbers(value, path=()):
        if isinstance(value, dict):
            for key, item in value.items():
                yield from numbers(item, (*path, key))
        elif isinstance(value, float):
            yield path, value
        else:
            yield path, value

    assert got["usage"]["input_tokens"] == want["usage"]["input_tokens"]
    left, right = dict(numbers(got["answers"])), dict(numbers(want["answers"]))
    assert left.keys() == right.keys()
    for key, value in left.items():
        assert value == pytest.approx(right[key], abs=tolerance), key


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_every_row_gets_its_record_in_order_with_the_servers_answer_or_error(real_decider, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(source, _rows(), broken_line=3)
    summary = run_batch(real_decider, source, out, aliases=("jev-latest",))
    records = _records(out)
    assert [r["id"] for r in records] == [1, "ticket-7", 3, 4, 5, 6], "a row's own id, else its line number"
    assert (summary.rows, summary.answered, summary.errors) == (6, 6, 3)
    _same_response(records[0]["response"], real_decider.respond(_rows()[0]))
    assert records[1]["response"]["x_calibration"] == "raw"
    assert records[2]["error"]["status"] == 422 and records[2]["error"]["detail"][0]["loc"][:2] == ["body", "questions"]
    assert records[3]["error"]["status"] == 422 and records[3]["error"]["detail"][0]["type"] == "json_invalid"
    assert records[4]["error"] == {
        "status": 404,
        "detail": {"error_type": "model_not_found", "message": "unknown model 'gpt-4'; this server serves: "
                   "smollm2-135m-instruct, jev-latest"},
    }  # fmt: skip
    assert "response" in records[5]


def test_a_row_without_an_id_gets_its_line_number_blank_lines_counted(real_decider, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    row = {"state": "Where is my parcel?", "questions": QUESTIONS}
    lines = ["", json.dumps(row), "", "", json.dumps({**row, "id": "own"}), "  \t", json.dumps(row), "{broken", ""]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = run_batch(real_decider, source, out)
    assert (summary.rows, summary.answered, summary.errors) == (4, 4, 1)
    assert [r["id"] for r in _records(out)] == [2, "own", 7, 8], "the line an editor shows each row on"
    assert [number for number, _ in read_rows(source, skip=2)] == [7, 8], "a resumed run numbers rows the same"


def test_a_run_resumes_after_the_records_already_written(real_decider, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"id": i, "state": f"Message {i}: where is my parcel?", "questions": QUESTIONS} for i in range(5)]
    _write(source, rows)
    run_batch(real_decider, source, out)
    complete = out.read_text(encoding="utf-8")
    lines = complete.splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:17], encoding="utf-8")  # a crash in the middle of record 2
    assert resume(out) == 2 and out.read_text(encoding="utf-8") == "".join(lines[:2])
    summary = run_batch(real_decider, source, out)
    assert (summary.skipped, summary.answered) == (2, 3)
    first, again = [json.loads(line) for line in complete.splitlines()], _records(out)
    assert [r["id"] for r in again] == [r["id"] for r in first] == list(range(5)), "every row exactly once"
    assert again[:2] == first[:2]
    for got, want in zip(again[2:], first[2:], strict=True):  # answered again: the documents are cached now
        _same_response(got["response"], want["response"])
    assert run_batch(real_decider, source, out).answered == 0, "a finished job has nothing left"


def test_a_state_column_with_the_questions_given_once_and_parquet_input(real_decider, tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pyarrow.table({"id": ["a", "b"], "state": ["Refund me, please.", "Where is my parcel?"]})
    pq.write_table(table, tmp_path / "in.parquet")
    out = tmp_path / "out.jsonl"
    run_batch(real_decider, tmp_path / "in.parquet", out, questions=QUESTIONS)
    records = _records(out)
    assert [r["id"] for r in records] == ["a", "b"]
    _same_response(
        records[1]["response"], real_decider.respond({"state": "Where is my parcel?", "questions": QUESTIONS})
    )
    assert list(read_rows(tmp_path / "in.parquet", skip=1)) == [(2, {"id": "b", "state": "Where is my parcel?"})]


def test_the_cli_job_killed_midway_and_run_again_writes_every_row_once(tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps(QUESTIONS), encoding="utf-8")
    _write(source, [{"id": f"r{i}", "state": f"Ticket {i}: the order {100 + i} never came."} for i in range(14)])
    command = [sys.executable, "-m", "typedlm.cli", "batch", str(source), "--out", str(out), "--questions",
               str(questions), "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (out.exists() and out.read_text(encoding="utf-8").count("\n") >= 3):
        assert job.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
        time.sleep(0.05)
    job.kill()
    job.wait()
    written = out.read_text(encoding="utf-8").count("\n")
    assert 3 <= written < 14, "killed midway"
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr
    assert f"{written} already in" in finished.stderr
    assert [r["id"] for r in _records(out)] == [f"r{i}" for i in range(14)]


def test_the_cli_refuses_a_bad_questions_file_before_loading_the_model(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"state": "x"}\n', encoding="utf-8")
    (tmp_path / "q.json").write_text('{"q": {"type": "nope"}}', encoding="utf-8")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "typedlm.cli", "batch", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl"),
         "--questions", str(tmp_path / "q.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "invalid request" in done.stderr and "questions" in done.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "o.jsonl").exists()


def test_on_ray_two_actors_give_the_in_process_records(real_decider, tmp_path):
    """`--ray` with 2 workers on a local Ray: every row, in input order, each record the in-process one (answers
    within 1e-5: an actor runs on one thread, this process on two, and float32 sums in another order through 30
    layers; 1.1e-6 measured on one CPU type, below 1e-6 on another; bad rows the same error records)."""
    ray = pytest.importorskip("ray")
    from typedlm.jobs.ray_batch import run_batch_on_ray

    source = tmp_path / "in.jsonl"
    rows = [{"id": i, "state": f"Ticket {i}: order {200 + i} {'never came' if i % 2 else 'was charged twice'}.",
             "questions": QUESTIONS} for i in range(9)]  # fmt: skip
    _write(source, [*rows[:4], *_rows()[2:4], *rows[4:]], broken_line=5)
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    source.write_text("".join([*lines[:4], "\n", *lines[4:6], "  \n", *lines[6:]]), encoding="utf-8")  # lines 5, 8
    in_process, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    run_batch(real_decider, source, in_process, aliases=("jev-latest",))
    options = {"model": None, "device": "cpu", "dtype": "float32", "calibration": "raw", "choice_answers": "letters",
               "threads": 1}  # fmt: skip
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        summary = run_batch_on_ray(source, on_ray, options, aliases=("jev-latest",), workers=2)
    finally:
        ray.shutdown()
    want, got = _records(in_process), _records(on_ray)
    assert (summary.rows, summary.answered, summary.errors) == (12, 12, 3)
    assert [r["id"] for r in got] == [r["id"] for r in want] == [0, 1, 2, 3, 6, 7, 9, 4, 5, 6, 7, 8]
    for g, w in zip(got, want, strict=True):
        if "error" in w:
            assert g == w
        else:
            _same_response(g["response"], w["response"], tolerance=1e-5)


def test_a_group_whose_forward_fails_is_answered_row_by_row(real_decider, tmp_path):
    """Where the decider batches (a GPU), a group of rows too large for one forward (memory) is answered one row at
    a time: the same records as a decider that never batches."""

    class Batching:
        """The real decider, batching four rows per forward, whose forwards of more than two rows fail."""

        max_batch = 4

        def __init__(self, decider):
            self.decider, self.forwards = decider, []

        def __getattr__(self, name):
            return getattr(self.decider, name)

        def launch_prepared(self, items):
            self.forwards.append(len(items))
            if len(items) > 2:
                raise RuntimeError("CUDA out of memory")
            return self.decider.launch_prepared(items)

    source = tmp_path / "rows.jsonl"
    more = [{"state": f"Order {i} arrived broken.", "questions": QUESTIONS} for i in range(3)]
    _write(source, [*_rows()[:3], *more])  # five valid rows and a bad one
    batching = Batching(real_decider)
    run_batch(batching, source, tmp_path / "batched.jsonl")
    run_batch(real_decider, source, tmp_path / "alone.jsonl")
    # rows go in chunks of max_batch: the first holds three valid rows (one forward, too large, then each alone),
    # the second two (one forward that succeeds)
    assert batching.forwards == [3, 1, 1, 1, 2]
    for got, want in zip(_records(tmp_path / "batched.jsonl"), _records(tmp_path / "alone.jsonl"), strict=True):
        assert got.keys() == want.keys() and got["id"] == want["id"]
        if "response" in want:
            _same_response(got["response"], want["response"])
        else:
            assert got == want


def test_coverage_and_min_accuracy_apply_to_every_row_that_does_not_set_its_own(real_decider, tmp_path):
    """`--coverage`/`--min-accuracy` (here `defaults`, as the CLI passes them): every answer carries its set and
    abstention, a row's own x_coverage wins; with no labels every set is every answer and says so."""
    from typedlm.cli import main

    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"state": "I was charged twice.", "questions": QUESTIONS},
            {"state": "The parcel is late.", "questions": QUESTIONS, "x_coverage": 0.5}]  # fmt: skip
    _write(source, rows)
    run_batch(real_decider, source, out, defaults={"x_coverage": 0.9, "x_min_accuracy": 0.95})
    first, second = (record["response"]["answers"] for record in _records(out))
    for answer in first.values():
        assert answer["x_set"]["coverage"] == 0.9 and answer["x_set"]["guarantee"] == "none"
        assert answer["x_abstain"] is True and answer["x_threshold"] is None
    assert {answer["x_set"]["coverage"] for answer in second.values()} == {0.5}
    # a share outside (0, 1) stops the command before any model is loaded
    assert main(["batch", str(source), "--out", str(tmp_path / "o.jsonl"), "--coverage", "1.5"]) == 2
    assert not (tmp_path / "o.jsonl").exists()
