"""A batch job: a file of /v1/systemone request bodies in, one record per row out, in input order, resumable.

    summary = run_batch(decider, "requests.jsonl", "answers.jsonl")

Input: JSON Lines (one request body per line) or Parquet (one per row; needs pyarrow), or rows holding a `state`
with the questions given once (`questions=`). Output: JSON Lines, row by row in input order, each
`{"id": ..., "response": {...}}` with the server's response body, or `{"id": ..., "error": {"status": ...,
"detail": ...}}` with the status and body the server would answer (`hosting.status.error_status`); `id` is the row's
own "id" field, else its line number in the input (1-based, blank lines counted: what an editor shows; Parquet: its
1-based row number). A bad row becomes an error record, never a failed job.

Resumable: the output is appended to; a run first counts the complete records already there (a last line cut off
by a crash is dropped) and skips as many rows, so a re-run after a crash writes every row exactly once.

Feedback: with a feedback database (`Decider(feedback_db=...)`, `typedlm batch --feedback-db PATH`) the rows are
answered with what its labels taught; a row with a `gold` object (as `POST /v1/systemone/feedback` takes) is answered
as that route answers, and its labels are stored and learned once its group of rows is answered, so the groups after
it use them. Without a database such a row is an error record (422 naming `gold`).

Rows are prepared one by one (`Decider.prepare_request`: their errors are their own) and answered in groups of up
to `Decider.max_batch` by one forward each (`launch_prepared`), as the server batches.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typedlm.core.errors import InvalidRequest
from typedlm.core.questions import FeedbackRequest, parse_feedback, parse_request
from typedlm.hosting.batching import groups
from typedlm.hosting.status import APIError, error_status, model_not_found


@dataclass(frozen=True)
class BatchSummary:
    rows: int  # rows in the input
    skipped: int  # rows already answered in the output (a resumed run)
    answered: int  # rows answered by this run
    errors: int  # of them, error records


def count_rows(path: str | Path) -> int:
    """Rows of an input file (JSON Lines: non-blank lines; Parquet: its row count)."""
    path = Path(path)
    if path.suffix == ".parquet":
        return _parquet(path).metadata.num_rows
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def read_rows(path: str | Path, skip: int = 0) -> Iterator[tuple[int, Any]]:
    """(line number, row) from a JSON Lines file, or (row number, row) from Parquet, both 1-based, after the first
    `skip` rows. Blank lines are not rows, but they are counted in line numbers, so that a row's number is the line
    an editor shows it on. A JSON Lines row that is not JSON is yielded as an `InvalidRequest`, to become its row's
    error record."""
    path = Path(path)
    if path.suffix == ".parquet":
        rows = 0
        for chunk in _parquet(path).iter_batches():
            for row in chunk.to_pylist():
                rows += 1
                if rows > skip:
                    yield rows, row
        return
    with path.open(encoding="utf-8") as f:
        rows = 0
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            rows += 1
            if rows > skip:
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    yield number, InvalidRequest(f"the row is not valid JSON: {exc}", (), "json_invalid")


def _parquet(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InvalidRequest("reading Parquet needs pyarrow: pip install pyarrow (or give JSON Lines)") from exc
    return pq.ParquetFile(path)


def resume(path: str | Path) -> int:
    """The complete records in an output file (0 if it does not exist); a last line without its newline, cut off
    by a crash, is removed so that its row is written again."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    return data.count(b"\n", 0, end)


def row_id(number: int, row: Any) -> Any:
    """A record's id: the row's own "id" field, else `number`, its line (or Parquet row) number from `read_rows`."""
    return row["id"] if isinstance(row, Mapping) and "id" in row else number


def request_body(row: Any, questions: Mapping[str, Any] | None, defaults: Mapping[str, Any] | None = None) -> Any:
    """The request body of a row: the row itself, or with `questions`, the row's state (and calibration fields)
    asked those questions; `defaults`: fields it gets where the row has none of its own (`--coverage`'s
    x_coverage, `--min-accuracy`'s x_min_accuracy)."""
    if defaults and isinstance(row, Mapping):
        row = {**defaults, **row}
    if questions is None:
        return row
    if not isinstance(row, Mapping) or "state" not in row:
        raise InvalidRequest("with --questions every row needs a state", ("state",))
    return {**{k: v for k, v in row.items() if k.startswith("x_") or k in ("model", "gold")}, "state": row["state"],
            "questions": questions}  # fmt: skip


def _decide_group(decider, group: list) -> list:
    """One forward's answers for a group of prepared rows; if that forward fails, each row by a forward of its own
    (a group too large for the device's memory still gets answered; a row that fails alone stops the job)."""
    try:
        return decider.launch_prepared(group)()
    except Exception:
        if len(group) == 1:
            raise
        return [response for item in group for response in decider.launch_prepared([item])()]


def answer_rows(
    decider,
    rows: list[tuple[int, Any]],
    questions: Mapping[str, Any] | None = None,
    served: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The records of rows (line number, row) in order: every valid row prepared, then answered by as few forwards
    as the decider batches (`max_batch` rows each, within the server's token limit: `hosting.batching.groups`);
    `served`: the model names a row may give (default: the decider's own); `defaults`: as `request_body`'s."""
    served = tuple(served) or (decider.name,)
    items: list[Any] = []
    feedback: list[FeedbackRequest | None] = []  # per row: its gold answers, where it has some
    for _, row in rows:
        try:
            if isinstance(row, BaseException):
                raise row
            body = request_body(row, questions, defaults)
            posted = parse_feedback(body) if isinstance(body, Mapping) and "gold" in body else None
            if posted is not None and getattr(decider, "feedback", None) is None:
                raise InvalidRequest(
                    "a row with gold answers needs a feedback database (--feedback-db PATH)", ("gold",)
                )
            request = posted.request if posted is not None else parse_request(body)
            if request.model is not None and request.model not in served:
                raise model_not_found(request.model, served)
            items.append(decider.prepare_request(request.state, request.questions, request.calibration,
                                                 request.order_reads, keep_reading=posted is not None,
                                                 handover=request.handover))  # fmt: skip
            feedback.append(posted)
        except (InvalidRequest, APIError) as exc:
            items.append(exc)
            feedback.append(None)
    prepared = [item for item in items if not isinstance(item, BaseException)]
    responses: list[Any] = []
    for group in groups(prepared, lambda item: item.tokens, decider.max_batch):  # each one forward
        responses += _decide_group(decider, group)
    answers = iter(responses)
    records = []
    for (number, row), item, posted in zip(rows, items, feedback, strict=True):
        identifier = row_id(number, row)
        if isinstance(item, BaseException):
            status, body = error_status(item)
            records.append({"id": identifier, "error": {"status": status, "detail": body["detail"]}})
        elif posted is not None:  # its labels stored and learned: the rows after it are answered with them
            records.append({"id": identifier, "response": decider.record_feedback(posted, next(answers))})
        else:
            records.append({"id": identifier, "response": next(answers).to_wire()})
    return records


def run_batch(
    decider,
    source: str | Path,
    out: str | Path,
    *,
    questions: Mapping[str, Any] | None = None,
    aliases: Iterable[str] = (),
    progress: Callable[[Iterable, int, int], Iterable] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> BatchSummary:
    """Answer every row of `source` not yet in `out` (see the module docstring). `aliases`: model names a row may
    give besides the decider's; `progress(rows, total, done)` may wrap the rows (a progress bar); `defaults`:
    fields every row's request gets where it has none of its own (`request_body`)."""
    total, done = count_rows(source), resume(out)
    served = (decider.name, *aliases)
    rows: Iterable = read_rows(source, skip=done)
    if progress is not None:
        rows = progress(rows, total, done)
    answered = errors = 0
    with Path(out).open("a", encoding="utf-8") as sink:
        for chunk in _chunks(rows, decider.max_batch):
            for record in answer_rows(decider, chunk, questions, served, defaults):
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                answered += 1
                errors += "error" in record
            sink.flush()
    return BatchSummary(total, done, answered, errors)


def _chunks(rows: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
