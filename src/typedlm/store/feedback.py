"""The feedback store: labeled answers (a gold answer a user posted for a question the server answered), each kept
with what the model read, in one SQLite file.

    store = FeedbackStore(FeedbackStore.default_path(fingerprint))
    stored = store.add(labels, feedback_id="post-7")   # one post: all its labels in one transaction
    store.add(labels, feedback_id="post-7")            # → None: a retried post counts once
    new = store.labels(after=last_id_seen)            # what other replicas stored since, in id order

Contract:
- A post is written whole or not at all (one `BEGIN IMMEDIATE` transaction). A post's `feedback_id` is UNIQUE in
  the `posts` table, so of two posts with the same id, from any threads or processes, exactly one is stored.
- Durability: a WAL journal. By default `synchronous=NORMAL`: when `add` returns, its labels survive the
  process being killed (they are in the log, in the OS's cache); a power loss may drop the last posts, never
  corrupt the file. `FeedbackStore(path, fsync=True)` syncs the log at every commit (`synchronous=FULL`) and
  survives power loss too, at one fsync per post: about 4 ms on a virtual disk, where a post otherwise costs
  0.15-0.5 ms (one to ten labels), over the 2 ms a post may add to a request.
- Several processes may write one file: a writer waits up to `timeout` seconds for another's write lock
  (SQLite's busy timeout) before raising `StoreError`.
- Ids grow in commit order (ids are taken under the write lock, AUTOINCREMENT never reuses one), so a reader
  that polls `labels(after=last_id)` misses nothing.
- Thread safety: one connection per store, every use of it under one lock (SQLite lets one writer at a time
  anyway; a post holds it for well under a millisecond). Open a store in each process: a connection never
  crosses a fork.
- The file records its format (`PRAGMA application_id`, `PRAGMA user_version`); another database, or one a newer
  typedlm wrote, is refused with a `StoreError` saying what to do (`typedlm.store.database`).
- A label is checked before it is written or imported (`typedlm.store.labels`).
- Export/import: JSONL, one label per line (the dataclass as JSON); import skips uids already stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from typedlm.core.errors import StoreError
from typedlm.store.database import connect, transaction
from typedlm.store.labels import COLUMNS, Label, from_row, label_problem, to_row

TIMEOUT_S = 30.0  # how long a writer waits for another process's write lock
EXPORT_ROWS = 1000  # rows read at a time by `export`
_MARKS = ", ".join("?" * (COLUMNS.count(",") + 1))  # one per column of a label's row


class FeedbackStore:
    """Labeled answers in one SQLite file, safe to share between threads and between processes.

    Args:
        path: the database file; created with its parent folders if missing.
        timeout: seconds a write waits for another process's write lock before raising `StoreError`.
        fsync: sync the log at every commit, so a stored post survives power loss too (one fsync per post).
    """

    def __init__(self, path: str | os.PathLike, timeout: float = TIMEOUT_S, fsync: bool = False):
        self.path = Path(path)
        self.timeout = timeout
        self.fsync = fsync
        self._lock = threading.Lock()
        self._db = connect(self.path, timeout, fsync)

    @staticmethod
    def default_path(fingerprint: str) -> Path:
        """`<cache>/feedback/<fingerprint>.sqlite`: one file per model (its weights' fingerprint)."""
        if not re.fullmatch(r"[A-Za-z0-9._-]+", fingerprint) or fingerprint.startswith("."):
            raise StoreError(f"a model fingerprint names a file; {fingerprint!r} cannot")
        # the cache folder as typedlm.runtime.catalog.cache_dir() has it, restated: this layer is below runtime
        cache = Path(os.environ.get("TYPEDLM_CACHE", Path.home() / ".cache" / "typedlm"))
        return cache / "feedback" / f"{fingerprint}.sqlite"

    # -- writing ---------------------------------------------------------------------------------------------

    def add(self, labels: Iterable[Label], feedback_id: str | None = None) -> list[Label] | None:
        """Store one post's labels in one transaction.

        Args:
            labels: the post's labels (their `id` None; their `feedback_id` None or `feedback_id`).
            feedback_id: the client's idempotency id for the post, if it sent one.

        Returns:
            the labels as stored (with `id` and `feedback_id`), or None when a post with `feedback_id` was
            already stored (nothing is written: a retried post counts once).

        Raises:
            ValueError: a label that is not well formed, or already stored (its `id` set).
            StoreError: a label's uid is already stored; the file cannot be written, or stayed locked.
        """
        labels = [dataclasses.replace(label, feedback_id=feedback_id) for label in self._checked(labels, feedback_id)]
        if not labels and feedback_id is None:
            return []
        rows = [to_row(label) for label in labels]  # encoded before taking the lock
        insert = f"INSERT INTO labels (post, {COLUMNS}) VALUES (?, {_MARKS})"
        with self._lock, transaction(self._db, self.path, self.timeout) as db:
            post = db.execute(
                "INSERT INTO posts (feedback_id, created) VALUES (?, ?) ON CONFLICT (feedback_id) DO NOTHING",
                (feedback_id, time.time()),
            )
            if post.rowcount == 0:
                return None
            try:
                ids = [db.execute(insert, (post.lastrowid, *row)).lastrowid for row in rows]
            except sqlite3.IntegrityError as exc:
                raise StoreError(
                    f"a label of this post is already stored ({exc}); a new label needs a new uid"
                ) from exc
        return [dataclasses.replace(label, id=id_) for label, id_ in zip(labels, ids)]

    @staticmethod
    def _checked(labels: Iterable[Label], feedback_id: str | None) -> list[Label]:
        labels = list(labels)
        for label in labels:
            assert isinstance(label, Label), f"a Label, not {type(label).__name__}"
            if problem := label_problem(vars(label)):
                raise ValueError(f"label {label.uid}: {problem}")
            if label.id is not None:
                raise ValueError(f"label {label.uid} is already stored (id {label.id})")
            if label.feedback_id not in (None, feedback_id):
                raise ValueError(f"label {label.uid} belongs to post {label.feedback_id!r}, not {feedback_id!r}")
        return labels

    # -- reading ---------------------------------------------------------------------------------------------

    def labels(
        self,
        after: int = 0,
        limit: int | None = None,
        *,
        fingerprint: str | None = None,
        prompt_version: str | None = None,
        reading: str | None = None,
        family: str | None = None,
        latest: bool = False,
    ) -> list[Label]:
        """Labels with id > `after` (the last id a reader saw), in id order, at most `limit` (the first, or with
        `latest` the last); only those with the `fingerprint`, `prompt_version`, `reading` and `family` given."""
        where = {"fingerprint": fingerprint, "prompt_version": prompt_version, "reading": reading, "family": family}
        where = {name: value for name, value in where.items() if value is not None}
        conditions = "".join(f" AND {name} = ?" for name in where)
        sql = f"SELECT id, {COLUMNS} FROM labels WHERE id > ?{conditions} ORDER BY id {'DESC' if latest else ''}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            rows = self._db.execute(sql, (after, *where.values())).fetchall()
        return [from_row(row) for row in (reversed(rows) if latest else rows)]

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM labels").fetchone()[0]

    def stats(self) -> dict:
        """Labels per kind and per family (with its first question's instructions), posts, first and last time,
        and the bytes on disk (the database file and its write-ahead log)."""
        with self._lock:
            labels, first, last = self._db.execute("SELECT count(*), min(created), max(created) FROM labels").fetchone()
            posts = self._db.execute("SELECT count(*) FROM posts").fetchone()[0]
            kinds = self._db.execute("SELECT kind, count(*) FROM labels GROUP BY kind ORDER BY kind").fetchall()
            families = self._db.execute(
                "SELECT f.family, f.n, l.kind, l.question FROM "
                "(SELECT family, count(*) AS n, min(id) AS first FROM labels GROUP BY family) AS f "
                "JOIN labels AS l ON l.id = f.first ORDER BY f.n DESC, f.family"
            ).fetchall()
        on_disk = (self.path, self.path.with_name(self.path.name + "-wal"))
        return {
            "path": str(self.path),
            "labels": labels,
            "posts": posts,
            "first": first,
            "last": last,
            "bytes": sum(p.stat().st_size for p in on_disk if p.exists()),
            "kinds": {kind: n for kind, n in kinds},
            "families": [
                {"family": family, "kind": kind, "labels": n, "instructions": json.loads(question).get("instructions")}
                for family, n, kind, question in families
            ],
        }

    # -- export and import -----------------------------------------------------------------------------------

    def export(self, path_or_file: str | os.PathLike | IO[str]) -> int:
        """Write every label as JSONL (one per line, the dataclass as JSON), in id order; return how many."""
        with _opened(path_or_file, "w") as out:
            written = last = 0
            while batch := self.labels(after=last, limit=EXPORT_ROWS):
                for label in batch:
                    out.write(json.dumps(dataclasses.asdict(label), ensure_ascii=False) + "\n")
                written, last = written + len(batch), batch[-1].id
        return written

    def import_(self, path_or_file: str | os.PathLike | IO[str]) -> tuple[int, int]:
        """Add the labels of a JSONL file (as `export` writes it) in one transaction, skipping uids already stored.

        Every line is checked before anything is written: a line that is not a label raises `StoreError` naming
        it, and nothing is imported. Returns (added, skipped).
        """
        with _opened(path_or_file, "r") as lines:
            labels = [label for number, line in enumerate(lines, 1) if (label := self._parsed(line, number))]
        added = 0
        with self._lock, transaction(self._db, self.path, self.timeout) as db:
            for label in labels:
                if db.execute("SELECT 1 FROM labels WHERE uid = ?", (label.uid,)).fetchone():
                    continue
                post = db.execute(  # labels join their post by feedback id; one without is a post of its own
                    "INSERT INTO posts (feedback_id, created) VALUES (?, ?) ON CONFLICT (feedback_id) DO NOTHING",
                    (label.feedback_id, label.created),
                ).lastrowid
                if label.feedback_id is not None:
                    post = db.execute("SELECT id FROM posts WHERE feedback_id = ?", (label.feedback_id,)).fetchone()[0]
                db.execute(f"INSERT INTO labels (post, {COLUMNS}) VALUES (?, {_MARKS})", (post, *to_row(label)))
                added += 1
        return added, len(labels) - added

    def _parsed(self, line: str, number: int) -> Label | None:
        if not line.strip():
            return None
        try:
            fields = json.loads(line)
        except json.JSONDecodeError as exc:
            raise StoreError(f"line {number} is not JSON ({exc}); import takes the JSONL that export writes") from exc
        problem = label_problem(fields) if isinstance(fields, dict) else "not an object"
        if problem:
            raise StoreError(f"line {number} is not a label: {problem}")
        fields["id"] = None
        return Label(**fields)

    # -- closing ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> FeedbackStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def _opened(path_or_file: str | os.PathLike | IO[str], mode: str) -> Iterator[IO[str]]:
    if not isinstance(path_or_file, (str, os.PathLike)):
        yield path_or_file
        return
    try:
        file = open(path_or_file, mode, encoding="utf-8")  # noqa: SIM115 (closed below, after the with's body)
    except OSError as exc:
        raise StoreError(f"cannot {'read' if mode == 'r' else 'write'} {path_or_file}: {exc.strerror}") from exc
    with file:
        yield file
