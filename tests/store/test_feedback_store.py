"""The feedback store on real SQLite files: every field back as stored, posts counted once, nothing lost to threads,
processes or a writer killed mid-stream, JSONL export/import, and `typedlm feedback`."""

from __future__ import annotations

import base64
import dataclasses
import inspect
import io
import json
import multiprocessing
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from typedlm.cli import main
from typedlm.core.errors import StoreError
from typedlm.store.feedback import FeedbackStore
from typedlm.store.labels import Label

WRITERS = 16  # threads, then processes, posting to one file at once
POSTS = 8  # each writer's posts; every other one under a feedback id all writers share


def make_label(n: int = 0, **changes) -> Label:
    fields = {
        "question_id": f"q{n}",
        "model": "smollm2-135m-instruct",
        "fingerprint": "0123456789abcdef",
        "prompt_version": "1",
        "reading": "letters",
        "kind": "choice",
        "exact": f"exact{n % 3}",
        "family": f"family{n % 2}",
        "question": {"type": "choice", "instructions": f"Topic {n % 2}? «é»", "criteria": ["a", "b", "c"]},
        "masses": [[0.1 + 0.2, 1e-300, 0.6999999999999998], [1 / 3, 2 / 3, 0.0]],
        "priors": [[0.25, 0.5, 0.25], [0.3, 0.3, 0.4]],
        "lengths": [1, 2, 3],
        "gold": n % 3,
    }
    return Label(**{**fields, **changes})


def without_ids(labels: list[Label]) -> list[Label]:
    return [dataclasses.replace(label, id=None) for label in labels]


def test_every_field_comes_back_as_stored(tmp_path):
    labels = [make_label(0), make_label(1, kind="noul", masses=[[0.9, 0.1]], priors=None, lengths=None, gold=1)]
    with FeedbackStore(tmp_path / "f.sqlite") as store:
        stored = store.add(labels, feedback_id="post-1")
    assert stored == [
        dataclasses.replace(label, feedback_id="post-1", id=stored[i].id) for i, label in enumerate(labels)
    ]
    with FeedbackStore(tmp_path / "f.sqlite") as store:  # reopened: floats, unicode and nulls exactly as they were
        assert store.labels() == stored


def test_ids_grow_and_a_reader_polls_after_the_last_it_saw(tmp_path):
    with FeedbackStore(tmp_path / "f.sqlite") as store:
        posts = [store.add([make_label(3 * p + i) for i in range(3)]) for p in range(3)]
        ids = [label.id for post in posts for label in post]
        assert ids == sorted(ids) and len(set(ids)) == 9
        assert [label.id for label in store.labels()] == ids
        assert [label.id for label in store.labels(after=ids[4])] == ids[5:]
        assert [label.id for label in store.labels(after=ids[4], limit=2)] == ids[5:7]
        assert store.labels(after=ids[-1]) == []
        store.add([make_label(9, reading="names", prompt_version="2")])
        assert [label.question_id for label in store.labels(reading="names")] == ["q9"]
        assert store.labels(prompt_version="2", fingerprint="other") == []
        assert store.count() == 10
        # a family's latest labels, oldest first (what the report reads)
        family0 = [label.id for label in store.labels(family="family0")]
        assert len(family0) == 5 and family0 == sorted(family0)
        assert [label.id for label in store.labels(family="family0", limit=2, latest=True)] == family0[-2:]


def test_a_file_written_before_the_family_index_gets_it_and_keeps_its_labels(tmp_path):
    path = tmp_path / "f.sqlite"
    with FeedbackStore(path) as store:
        stored = store.add([make_label(n) for n in range(4)])
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX labels_family")
    with FeedbackStore(path) as store:
        assert store.labels() == stored
    with sqlite3.connect(path) as db:
        plan = " ".join(row[-1] for row in db.execute("EXPLAIN QUERY PLAN SELECT * FROM labels WHERE family = 'x'"))
    assert "labels_family" in plan


def test_a_file_of_the_first_format_is_migrated_its_labels_kept_as_fair_samples(tmp_path):
    """A database written before labels said how they were picked (format 1): opened, it gets the column, its
    labels read back as fair samples, and a chosen label can be stored beside them."""
    path = tmp_path / "f.sqlite"
    with FeedbackStore(path) as store:
        stored = store.add([make_label(n) for n in range(3)])
    with sqlite3.connect(path) as db:  # as format 1 wrote it: no sample column, no features
        for column in ("sample", "features", "features_version"):
            db.execute(f"ALTER TABLE labels DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 1")
    with FeedbackStore(path) as store:
        assert store.labels() == stored and {label.sample for label in stored} == {"random"}
        chosen = store.add([make_label(7, sample="chosen")])
        assert store.labels(after=stored[-1].id) == chosen and chosen[0].sample == "chosen"
        with_features = store.add([make_label(8, features="AAA8AA==", features_version="gauss-1")])
        assert store.labels(after=chosen[0].id) == with_features
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3


def test_a_label_s_features_are_checked_stored_and_carried_by_export_and_import(tmp_path):
    """Features (float16 values in base64, at most 256) with their version, or neither: a bad one is refused
    before anything is written (a line of an import too); export and import carry them bit for bit."""
    too_long = base64.b64encode(bytes(514)).decode()
    bad = (("AAA8", "gauss-1"), ("not base64!", "gauss-1"), ("AAA8AA==", None), (None, "v"), (too_long, "gauss-1"))
    with FeedbackStore(tmp_path / "f.sqlite") as store:
        for features, version in bad:
            with pytest.raises(ValueError, match="features"):
                store.add([make_label(0, features=features, features_version=version)])
            line = json.dumps({**dataclasses.asdict(make_label(0)), "features": features, "features_version": version})
            (tmp_path / "bad.jsonl").write_text(line + "\n", encoding="utf-8")
            with pytest.raises(StoreError, match="features"):
                store.import_(tmp_path / "bad.jsonl")
        assert store.count() == 0
        full = base64.b64encode(bytes(range(256)) * 2).decode()
        stored = store.add([make_label(1, features=full, features_version="gauss-1"), make_label(2)])
        assert store.export(tmp_path / "out.jsonl") == 2
    with FeedbackStore(tmp_path / "g.sqlite") as other:
        assert other.import_(tmp_path / "out.jsonl") == (2, 0)
        again = other.labels()
    assert [(label.features, label.features_version) for label in again] == [(full, "gauss-1"), (None, None)]
    assert [label.uid for label in again] == [label.uid for label in stored]


def test_a_retried_post_is_stored_once(tmp_path):
    with FeedbackStore(tmp_path / "f.sqlite") as store:
        assert store.add([make_label(0), make_label(1)], feedback_id="post-1") is not None
        assert store.add([make_label(0), make_label(1)], feedback_id="post-1") is None
        assert store.add([make_label(2)]) is not None  # no feedback id: every post stands alone
        assert store.add([make_label(2)]) is not None
        assert store.count() == 4 and store.stats()["posts"] == 3


def _post(store: FeedbackStore, writer: int, posts: int, barrier) -> list[tuple[str, list[str] | None]]:
    """One writer's posts, each of two labels: (feedback id, the uids stored or None). Threads call it; spawned
    processes run it from its source (importing this module would import tests/__init__.py, and torch with it)."""
    from typedlm.store.labels import Label

    def label(n: int) -> Label:
        fields = {"model": "m", "fingerprint": "f", "prompt_version": "1", "reading": "letters", "kind": "noul"}
        return Label(**fields, question_id=f"q{n}", exact="e", family="f", question={}, masses=[[0.5, 0.5]], gold=0)

    barrier.wait()
    outcomes = []
    for p in range(posts):
        feedback_id = f"shared-{p}" if p % 2 else f"writer{writer}-{p}"  # every other post: all writers race for it
        stored = store.add([label(p), label(p)], feedback_id=feedback_id)
        outcomes.append((feedback_id, None if stored is None else [s.uid for s in stored]))
    return outcomes


def _check_nothing_lost(path: Path, outcomes: list[tuple[str, list[str] | None]]) -> None:
    assert len(outcomes) == WRITERS * POSTS
    winners: dict[str, list[list[str]]] = {}
    for feedback_id, uids in outcomes:
        winners.setdefault(feedback_id, []).extend([uids] if uids is not None else [])
    assert all(len(won) == 1 for won in winners.values()), "each feedback id stored by exactly one writer"
    with FeedbackStore(path) as store:
        stored = store.labels()
        assert store.stats()["posts"] == len(winners) == WRITERS * POSTS // 2 + POSTS // 2
    assert sorted(label.uid for label in stored) == sorted(uid for [uids] in winners.values() for uid in uids)
    by_post = {feedback_id: sorted(uids) for feedback_id, [uids] in winners.items()}
    assert all(label.uid in by_post[label.feedback_id] for label in stored), "each label under its own post"


def test_threads_posting_at_once_lose_nothing(tmp_path):
    barrier, results = threading.Barrier(WRITERS), []
    with FeedbackStore(tmp_path / "f.sqlite") as store:  # one store, shared by every thread

        def writer(w: int) -> None:
            results.extend(_post(store, w, POSTS, barrier))

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    _check_nothing_lost(tmp_path / "f.sqlite", results)


_PROCESS_WRITER = """
from typedlm.store.feedback import FeedbackStore
with FeedbackStore(path) as store:  # a new file: the processes also race to create it
    results.put(_post(store, writer, posts, barrier))
"""


def test_many_opening_one_new_file_at_once_all_open_it(tmp_path):
    """16 connections opening one new file at once, 20 times over: each finds it empty, ours, or being made ours,
    never half made (its tables there and its header not yet ours, when the checks were three separate reads)."""

    def open_it(path: Path, barrier: threading.Barrier, failures: list[str]) -> None:
        barrier.wait()
        try:
            FeedbackStore(path).close()
        except StoreError as exc:
            failures.append(str(exc))

    for trial in range(20):
        path = tmp_path / f"{trial}.sqlite"
        barrier, failures = threading.Barrier(WRITERS), []
        threads = [threading.Thread(target=open_it, args=(path, barrier, failures)) for _ in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures[0]
        assert FeedbackStore(path).stats()["labels"] == 0


def test_processes_posting_at_once_lose_nothing(tmp_path):
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(WRITERS), spawn.Queue()
    source = "from __future__ import annotations\n" + inspect.getsource(_post) + _PROCESS_WRITER
    path = str(tmp_path / "f.sqlite")
    writers = [
        spawn.Process(
            target=exec,
            args=(source, {"path": path, "writer": w, "posts": POSTS, "barrier": barrier, "results": results}),
        )
        for w in range(WRITERS)
    ]
    for process in writers:
        process.start()
    outcomes = []
    while len(outcomes) < WRITERS * POSTS:
        try:
            outcomes += results.get(timeout=1)
        except queue.Empty:
            died = [p.exitcode for p in writers if p.exitcode not in (None, 0)]
            assert not died, f"a writer died with {died} (its traceback is above); the others would wait forever"
            assert results.qsize() or any(p.is_alive() for p in writers), "every writer ended before posting all"
    for process in writers:
        process.join(timeout=10)
        assert process.exitcode == 0
    _check_nothing_lost(tmp_path / "f.sqlite", outcomes)


def _write_until_killed(path: str) -> None:
    """Post forever, printing each stored id once `add` has returned."""
    from typedlm.store.feedback import FeedbackStore
    from typedlm.store.labels import Label

    fields = {"model": "m", "fingerprint": "f", "prompt_version": "1", "reading": "letters", "kind": "score"}
    with FeedbackStore(path) as store:
        n = 0
        while True:
            n += 1
            question = {"type": "score", "criteria": ["low", "mid", "high"], "note": "x" * (n % 2000)}
            label = Label(
                **fields,
                question_id=f"q{n}",
                exact="e",
                family="f",
                question=question,
                masses=[[0.2, 0.3, 0.5]],
                gold=2,
            )
            [stored] = store.add([label], feedback_id=f"post-{n}")
            print(stored.id, flush=True)


def test_every_id_a_killed_writer_printed_is_stored(tmp_path):
    path = str(tmp_path / "f.sqlite")
    code = inspect.getsource(_write_until_killed) + f"\n_write_until_killed({path!r})\n"
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    printed = []
    try:
        while len(printed) < 300:  # well into the stream (and past a checkpoint of the log)
            line = writer.stdout.readline()
            assert line, "the writer stopped on its own"
            printed.append(int(line))
    finally:
        os.kill(writer.pid, signal.SIGKILL)  # in the middle of a post
        rest, _ = writer.communicate(timeout=10)
    printed += [int(line) for line in rest.split()]
    with FeedbackStore(path) as store:
        ids = {label.id for label in store.labels()}
    assert set(printed) <= ids
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_export_then_import_gives_the_same_labels(tmp_path):
    with FeedbackStore(tmp_path / "a.sqlite") as source:
        source.add([make_label(0), make_label(1)], feedback_id="post-1")
        source.add([make_label(2, sample="chosen")])
        assert source.export(tmp_path / "labels.jsonl") == 3
        exported = source.labels()
    lines = (tmp_path / "labels.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [dataclasses.asdict(label) for label in exported]
    with FeedbackStore(tmp_path / "b.sqlite") as target:
        assert target.import_(tmp_path / "labels.jsonl") == (3, 0)
        assert without_ids(target.labels()) == without_ids(exported)
        assert [label.sample for label in target.labels()] == ["random", "random", "chosen"]
        assert target.import_(io.StringIO("\n".join(lines) + "\n")) == (0, 3)  # by uid: all already there
        assert target.count() == 3 and target.stats()["posts"] == 2


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "line 3 is not JSON"),
        ("[1, 2]", "line 3 is not a label: not an object"),
        ('{"uid": "u"}', "line 3 is not a label: missing"),
        ("GOLD", "line 3 is not a label: gold must be an answer's index, 0..2"),
        ("EXTRA", "line 3 is not a label: unknown field colour"),
        ("SAMPLE", "line 3 is not a label: sample must be one of random, chosen"),
    ],
)
def test_an_import_refuses_a_line_that_is_not_a_label_and_imports_nothing(tmp_path, line, problem):
    good = json.dumps(dataclasses.asdict(make_label(0)))
    line = line.replace("GOLD", good.replace('"gold": 0', '"gold": 3'))
    line = line.replace("EXTRA", good[:-1] + ', "colour": "red"}')
    line = line.replace("SAMPLE", good.replace('"sample": "random"', '"sample": "picked"'))
    (tmp_path / "in.jsonl").write_text(f"{good}\n\n{line}\n", encoding="utf-8")
    with FeedbackStore(tmp_path / "f.sqlite") as store:
        with pytest.raises(StoreError, match=problem):
            store.import_(tmp_path / "in.jsonl")
        assert store.count() == 0


def test_stats_count_kinds_families_and_posts(tmp_path):
    with FeedbackStore(tmp_path / "f.sqlite") as store:
        assert store.stats()["labels"] == 0 and store.stats()["first"] is None
        store.add([make_label(n) for n in range(3)], feedback_id="post-1")
        store.add([make_label(3, kind="score")])
        stats = store.stats()
    assert (stats["labels"], stats["posts"], stats["kinds"]) == (4, 2, {"choice": 3, "score": 1})
    assert stats["families"] == [
        {"family": "family0", "kind": "choice", "labels": 2, "instructions": "Topic 0? «é»"},
        {"family": "family1", "kind": "choice", "labels": 2, "instructions": "Topic 1? «é»"},
    ]
    assert stats["first"] <= stats["last"] and stats["bytes"] > 0


def test_a_file_that_is_not_a_feedback_database_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello " * 200, encoding="utf-8")
    with pytest.raises(StoreError, match="is not a typedlm feedback database: it is not an SQLite database"):
        FeedbackStore(tmp_path / "notes.txt")
    with sqlite3.connect(tmp_path / "other.sqlite") as db:
        db.execute("CREATE TABLE things (x)")
    with pytest.raises(StoreError, match="is not a typedlm feedback database: it holds other tables"):
        FeedbackStore(tmp_path / "other.sqlite")
    with pytest.raises(StoreError, match="cannot open the feedback database"):
        FeedbackStore(tmp_path)  # a folder
    FeedbackStore(tmp_path / "newer.sqlite").close()
    with sqlite3.connect(tmp_path / "newer.sqlite") as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="format 99, newer than this typedlm reads"):
        FeedbackStore(tmp_path / "newer.sqlite")


def test_the_default_path_is_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TYPEDLM_CACHE", str(tmp_path / "cache"))
    path = FeedbackStore.default_path("0123456789abcdef")
    assert path == tmp_path / "cache" / "feedback" / "0123456789abcdef.sqlite"
    FeedbackStore(path).close()  # the folders are made
    assert path.is_file()
    with pytest.raises(StoreError, match="names a file"):
        FeedbackStore.default_path("../escape")


def test_the_command_line_imports_exports_and_shows_stats(tmp_path, capsys):
    with FeedbackStore(tmp_path / "a.sqlite") as source:
        source.add([make_label(0), make_label(1)], feedback_id="post-1")
        source.export(tmp_path / "labels.jsonl")
    db = str(tmp_path / "b.sqlite")
    assert main(["feedback", "import", str(tmp_path / "labels.jsonl"), "--feedback-db", db]) == 0
    assert "2 labels added, 0 already in" in capsys.readouterr().err
    assert main(["feedback", "stats", "--feedback-db", db]) == 0
    table = capsys.readouterr().out
    assert "labels    2 in 1 posts" in table and "family0" in table and "Topic 1? «é»" in table
    assert main(["feedback", "stats", "--json", "--feedback-db", db]) == 0
    assert json.loads(capsys.readouterr().out)["kinds"] == {"choice": 2}
    assert main(["feedback", "export", str(tmp_path / "again.jsonl"), "--feedback-db", db]) == 0
    assert "wrote 2 labels" in capsys.readouterr().err
    assert len((tmp_path / "again.jsonl").read_text(encoding="utf-8").splitlines()) == 2


def test_the_command_line_says_what_is_wrong_and_exits_2(tmp_path, capsys):
    assert main(["feedback", "stats", "--feedback-db", str(tmp_path / "none.sqlite")]) == 2
    none = tmp_path / "none.sqlite"
    assert (
        capsys.readouterr().err
        == f"typedlm: feedback: no feedback database at {none}; give the path of one (--feedback-db)\n"
    )
    assert not none.exists()
    (tmp_path / "bad.jsonl").write_text("{}\n", encoding="utf-8")
    assert main(["feedback", "import", str(tmp_path / "bad.jsonl"), "--feedback-db", str(tmp_path / "f.sqlite")]) == 2
    assert capsys.readouterr().err.startswith("typedlm: feedback: line 1 is not a label: missing ")
    assert (
        main(["feedback", "import", str(tmp_path / "absent.jsonl"), "--feedback-db", str(tmp_path / "f.sqlite")]) == 2
    )
    assert "cannot read" in capsys.readouterr().err
