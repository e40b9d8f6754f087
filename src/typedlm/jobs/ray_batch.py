"""The batch job on Ray Data: the records of `batch.run_batch`, computed by a pool of Ray actors, each holding one
decider (the model loaded once per actor; one actor per GPU where the job runs on GPUs), and written by this process
in input order as they come, so the output is resumable exactly as in process.

    summary = run_batch_on_ray("requests.jsonl", "answers.jsonl", {"model": None}, workers=2)

`address`: an existing Ray cluster ("auto", "ray://host:10001"); None starts or joins a local one. This process
reads the rows (so a bad JSON line becomes its row's error record) and sends them as JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from typedlm.core.errors import InvalidRequest
from typedlm.jobs.batch import BatchSummary, answer_rows, count_rows, read_rows, resume

ROWS_PER_TASK = 16  # rows an actor answers per call (its decider batches them where it can)


class _Answerer:
    """A Ray Data actor: one decider, loaded once, answering batches of rows into records."""

    def __init__(
        self,
        options: Mapping[str, Any],
        questions: Mapping[str, Any] | None,
        aliases: tuple[str, ...],
        defaults: Mapping[str, Any] | None = None,
    ):
        import torch

        from typedlm.decide.decider import Decider

        threads = int(options.get("threads") or 0)
        if threads:
            torch.set_num_threads(threads)
        load = {key: value for key, value in options.items() if key != "threads"}
        self.decider = Decider.load(**load)
        self.questions = questions
        self.defaults = defaults
        self.served = (self.decider.name, *aliases)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        rows = []
        for number, text, bad in zip(batch["number"], batch["row"], batch["bad"], strict=True):
            row = InvalidRequest(*json.loads(bad)) if bad else json.loads(text)
            rows.append((int(number), row))
        records = answer_rows(self.decider, rows, self.questions, self.served, self.defaults)
        return {
            "number": [n for n, _ in rows],
            "record": [json.dumps(r, ensure_ascii=False) for r in records],
            "failed": ["error" in r for r in records],
        }


def _item(number: int, row: Any) -> dict[str, Any]:
    if isinstance(row, InvalidRequest):
        return {"number": number, "row": "", "bad": json.dumps([row.message, list(row.loc), row.kind])}
    return {"number": number, "row": json.dumps(row, ensure_ascii=False), "bad": ""}


def run_batch_on_ray(
    source: str | Path,
    out: str | Path,
    options: Mapping[str, Any],
    *,
    questions: Mapping[str, Any] | None = None,
    aliases: Iterable[str] = (),
    workers: int = 2,
    address: str | None = None,
    progress: Callable[[Iterable, int, int], Iterable] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> BatchSummary:
    """Answer every row of `source` not yet in `out` on Ray (see the module docstring). `options`: the keyword
    arguments of `Decider.load` in each actor (model, device, dtype, calibration, ...; "threads": torch's threads
    per actor); `workers`: actors, each given a GPU when `options["device"]` is CUDA, else one CPU; `defaults`: fields
    every row's request gets where it has none of its own (`batch.request_body`)."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise InvalidRequest("--ray needs Ray: pip install 'typedlm[ray]'") from exc
    total, done = count_rows(source), resume(out)
    if done >= total:
        return BatchSummary(total, done, 0, 0)
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # records come back in input order
    context.enable_progress_bars = False
    items = [_item(number, row) for number, row in read_rows(source, skip=done)]
    on_gpu = str(options.get("device") or "cpu").startswith("cuda")
    answered = ray.data.from_items(items).map_batches(
        _Answerer,
        fn_constructor_kwargs={
            "options": dict(options),
            "questions": questions,
            "aliases": tuple(aliases),
            "defaults": dict(defaults or {}),
        },
        batch_size=ROWS_PER_TASK,
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_gpus=1 if on_gpu else 0,
        num_cpus=0 if on_gpu else 1,
    )
    results: Iterable = answered.iter_rows()
    if progress is not None:
        results = progress(results, total, done)
    count = errors = 0
    with Path(out).open("a", encoding="utf-8") as sink:
        for result in results:
            sink.write(result["record"] + "\n")
            sink.flush()
            count += 1
            errors += bool(result["failed"])
    return BatchSummary(total, done, count, errors)
