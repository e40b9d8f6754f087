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
  typedlm wrote, is refused with a `StoreError` saying what to do.
- Export/import: JSONL, one label per line (the dataclass as JSON); import skips uids already stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from typedlm.core.errors import StoreError
from typedlm.core.questions import QUESTION_TYPES

SCHEMA_VERSION = 1  # PRAGMA user_version of the files this module writes
APPLICATION_ID = 0x74644C46  # PRAGMA application_id: "tdLF", a typedlm feedback file
TIMEOUT_S = 30.0  # how long a writer waits for another process's write lock
EXPORT_ROWS = 1000  # rows read at a time by `export`

_FAMILY_INDEX = "CREATE INDEX IF NOT EXISTS labels_family ON labels (family, id)"  # a family's latest labels
_SCHEMA = (
    """CREATE TABLE posts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        feedback_id TEXT UNIQUE,  -- the client's idempotency id; NULL (never equal to another) when none was sent
        created REAL NOT NULL
    )""",
    """CREATE TABLE labels (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        post INTEGER NOT NULL REFERENCES posts (id),
        uid TEXT NOT NULL UNIQUE, created REAL NOT NULL, feedback_id TEXT, question_id TEXT NOT NULL,
        model TEXT NOT NULL, fingerprint TEXT NOT NULL, prompt_version TEXT NOT NULL, reading TEXT NOT NULL,
        kind TEXT NOT NULL, exact TEXT NOT NULL, family TEXT NOT NULL,
        question TEXT NOT NULL, masses TEXT NOT NULL, priors TEXT, lengths TEXT,  -- JSON
        gold INTEGER NOT NULL
    )""",
    _FAMILY_INDEX,
)
_COLUMNS = (
    "uid, created, feedback_id, question_id, model, fingerprint, prompt_version, reading, kind, exact, family, "
    "question, masses, priors, lengths, gold"
)
_MARKS = ", ".join("?" * (_COLUMNS.count(",") + 1))  # one per column
_JSON_FIELDS = ("question", "masses", "priors", "lengths")


@dataclass(kw_only=True)
class Label:
    """One labeled answer: the question as posted, what the model read for it, and the gold answer's index."""

    uid: str = field(default_factory=lambda: uuid.uuid4().hex)  # import dedupes by it
    created: float = field(default_factory=time.time)  # unix time
    feedback_id: str | None = None  # the post's client-chosen idempotency id
    question_id: str  # the question's id in the request
    model: str
    fingerprint: str
    prompt_version: str
    reading: str  # how choices were read: "letters", "names", "names_per_token"
    kind: str  # "noul", "choice" or "score"
    exact: str  # hash key of the question exactly as asked
    family: str  # hash key of the questions it belongs with
    question: dict  # the question as posted (wire JSON)
    masses: list[list[float]]  # per read, per answer
    priors: list[list[float]] | None = None  # per read, per answer
    lengths: list[int] | None = None
    gold: int  # the gold answer's index
    id: int | None = None  # the row id once stored


_FIELDS = {f.name: f for f in dataclasses.fields(Label)}
_REQUIRED = {n for n, f in _FIELDS.items() if f.default is f.default_factory is dataclasses.MISSING}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_matrix(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(row, list) and all(map(_is_number, row)) for row in value)


def _problem(fields: dict[str, Any]) -> str | None:
    """What makes `fields` (a label's, by name) not a label, or None."""
    if missing := sorted(_REQUIRED - fields.keys()):
        return f"missing {', '.join(missing)}"
    if unknown := sorted(fields.keys() - _FIELDS.keys()):
        return f"unknown field {', '.join(unknown)}"
    strings = ("uid", "question_id", "model", "fingerprint", "prompt_version", "reading", "kind", "exact", "family")
    for name in strings:
        if not isinstance(fields.get(name, "x"), str) or not fields.get(name, "x"):
            return f"{name} must be a non-empty string"
    if not isinstance(fields.get("feedback_id"), (str, type(None))):
        return "feedback_id must be a string or null"
    if not _is_number(fields.get("created", 0)):
        return "created must be a number (unix time)"
    if fields["kind"] not in QUESTION_TYPES:
        return f"kind must be one of {', '.join(QUESTION_TYPES)}"
    if not isinstance(fields["question"], dict):
        return "question must be an object"
    masses = fields["masses"]
    if not _is_matrix(masses) or not masses or not masses[0]:
        return "masses must be a non-empty list of lists of numbers"
    if fields.get("priors") is not None and not _is_matrix(fields["priors"]):
        return "priors must be a list of lists of numbers or null"
    lengths = fields.get("lengths")
    if lengths is not None and not (isinstance(lengths, list) and all(type(n) is int for n in lengths)):
        return "lengths must be a list of integers or null"
    gold = fields["gold"]
    if type(gold) is not int or not 0 <= gold < len(masses[0]):
        return f"gold must be an answer's index, 0..{len(masses[0]) - 1}"
    if not isinstance(fields.get("id"), (int, type(None))):
        return "id must be an integer or null"
    return None


def _row(label: Label) -> tuple:
    """A label's column values, its JSON fields encoded (exactly: floats are written by repr)."""
    values = []
    for name in _COLUMNS.split(", "):
        value = getattr(label, name)
        is_json = name in _JSON_FIELDS and value is not None
        values.append(json.dumps(value, ensure_ascii=False, allow_nan=False) if is_json else value)
    return tuple(values)


def _label(row: sqlite3.Row) -> Label:
    fields = {name: row[name] for name in row.keys()}  # noqa: SIM118 (a Row is not a mapping)
    for name in _JSON_FIELDS:
        if fields[name] is not None:
            fields[name] = json.loads(fields[name])
    return Label(**fields)


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
        self._db = self._open()

    @staticmethod
    def default_path(fingerprint: str) -> Path:
        """`<cache>/feedback/<fingerprint>.sqlite`: one file per model (its weights' fingerprint)."""
        if not re.fullmatch(r"[A-Za-z0-9._-]+", fingerprint) or fingerprint.startswith("."):
            raise StoreError(f"a model fingerprint names a file; {fingerprint!r} cannot")
        # the cache folder as typedlm.runtime.catalog.cache_dir() has it, restated: this layer is below runtime
        cache = Path(os.environ.get("TYPEDLM_CACHE", Path.home() / ".cache" / "typedlm"))
        return cache / "feedback" / f"{fingerprint}.sqlite"

    # -- opening ---------------------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open the feedback database {self.path}: {exc}; give the path of a file in a writable folder"
            ) from exc
        db.row_factory = sqlite3.Row
        try:
            deadline = time.monotonic() + self.timeout
            while True:  # processes opening a new file at once: switching it to WAL may find it locked at once
                try:
                    self._prepare(db)
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        except sqlite3.DatabaseError as exc:
            db.close()
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise self._foreign(f"it is not an SQLite database ({exc})") from exc
            raise StoreError(f"cannot use the feedback database {self.path}: {exc}") from exc
        except StoreError:
            db.close()
            raise
        return db

    def _foreign(self, why: str) -> StoreError:
        return StoreError(
            f"{self.path} is not a typedlm feedback database: {why}; give a new file's path or one typedlm wrote"
        )

    def _prepare(self, db: sqlite3.Connection) -> None:
        """Check the file is ours (or empty: then make it ours), switch it to WAL and set this connection's syncing."""
        db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        if not self._check_format(db):
            db.execute("PRAGMA journal_mode = WAL")  # persistent; before the first write so the schema is in WAL
            with self._transaction(db):
                if not self._check_format(db):  # another process may have made it meanwhile
                    for statement in _SCHEMA:
                        db.execute(statement)
                    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'labels_family'").fetchone():
            with self._transaction(db):  # a file written before the index was
                db.execute(_FAMILY_INDEX)
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {'FULL' if self.fsync else 'NORMAL'}")  # per connection, not in the file

    def _check_format(self, db: sqlite3.Connection) -> bool:
        """True for a feedback database this module can read, False for an empty one; else a StoreError. Its reads
        are one read transaction (where the caller holds none): a file another process is making ours reads as it
        was before or after, never with the tables made and the header not yet read as ours."""
        began = not db.in_transaction
        if began:
            db.execute("BEGIN")
        try:
            application = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:
            if began:
                db.execute("COMMIT")
        if application == 0 and version == 0:
            if tables:
                raise self._foreign("it holds other tables")
            return False
        if application != APPLICATION_ID:
            raise self._foreign(f"its application id is {application:#x}")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} is a feedback database of format {version}, newer than this typedlm reads "
                f"({SCHEMA_VERSION}); upgrade typedlm, or give another file"
            )
        assert version == SCHEMA_VERSION, f"format {version} has no migration to {SCHEMA_VERSION}"
        return True

    @contextlib.contextmanager
    def _transaction(self, db: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction, its write lock taken at the start (so reads inside it see the latest rows)."""
        db = db or self._db
        try:
            db.execute("BEGIN IMMEDIATE")  # waits up to the busy timeout for another writer
        except sqlite3.OperationalError as exc:
            raise StoreError(
                f"the feedback database {self.path} stayed locked for {self.timeout:g} s ({exc}): another process "
                "holds its write lock; retry, or look for a process stuck writing to it"
            ) from exc
        try:
            yield db
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:  # SQLite may have rolled back already (a full disk)
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):  # the disk, not the caller: full, read-only, failing
                raise StoreError(f"cannot write the feedback database {self.path}: {exc}") from exc
            raise

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
        rows = [_row(label) for label in labels]  # encoded before taking the lock
        insert = f"INSERT INTO labels (post, {_COLUMNS}) VALUES (?, {_MARKS})"
        with self._lock, self._transaction() as db:
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
            if problem := _problem(vars(label)):
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
        sql = f"SELECT id, {_COLUMNS} FROM labels WHERE id > ?{conditions} ORDER BY id {'DESC' if latest else ''}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            rows = self._db.execute(sql, (after, *where.values())).fetchall()
        return [_label(row) for row in (reversed(rows) if latest else rows)]

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
        with self._lock, self._transaction() as db:
            for label in labels:
                if db.execute("SELECT 1 FROM labels WHERE uid = ?", (label.uid,)).fetchone():
                    continue
                post = db.execute(  # labels join their post by feedback id; one without is a post of its own
                    "INSERT INTO posts (feedback_id, created) VALUES (?, ?) ON CONFLICT (feedback_id) DO NOTHING",
                    (label.feedback_id, label.created),
                ).lastrowid
                if label.feedback_id is not None:
                    post = db.execute("SELECT id FROM posts WHERE feedback_id = ?", (label.feedback_id,)).fetchone()[0]
                db.execute(f"INSERT INTO labels (post, {_COLUMNS}) VALUES (?, {_MARKS})", (post, *_row(label)))
                added += 1
        return added, len(labels) - added

    def _parsed(self, line: str, number: int) -> Label | None:
        if not line.strip():
            return None
        try:
            fields = json.loads(line)
        except json.JSONDecodeError as exc:
            raise StoreError(f"line {number} is not JSON ({exc}); import takes the JSONL that export writes") from exc
        problem = _problem(fields) if isinstance(fields, dict) else "not an object"
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
