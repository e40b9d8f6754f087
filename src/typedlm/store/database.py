"""The feedback database file: its tables, the marks that make it ours, opening it, and write transactions.

    db = connect(path, timeout, fsync)              # a feedback database's connection (an empty file made one)
    with transaction(db, path, timeout) as db: ...  # one write transaction, its write lock taken at the start

Contract:
- `connect` makes the file's missing parent folders, and makes an empty file a feedback database of this format
  (`SCHEMA_VERSION`, `APPLICATION_ID`) in WAL mode; processes opening one new file at once wait for each other. A
  file that is not an SQLite database, holds other tables, or was written in a newer format is refused with a
  `StoreError` saying what to do. The connection autocommits (transactions are explicit), returns `sqlite3.Row`s,
  waits up to `timeout` seconds for another's write lock, and syncs the log at every commit where `fsync` is set.
- `transaction` raises `StoreError` where the write lock stays taken past the timeout, or the disk refuses the
  write (full, read-only, failing); an exception of the caller's rolls back and passes through.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from typedlm.core.errors import StoreError

SCHEMA_VERSION = 3  # PRAGMA user_version of the files this module writes (2: labels.sample; 3: labels.features)
APPLICATION_ID = 0x74644C46  # PRAGMA application_id: "tdLF", a typedlm feedback file

_FAMILY_INDEX = "CREATE INDEX IF NOT EXISTS labels_family ON labels (family, id)"  # a family's latest labels
_MIGRATIONS = {  # format n - 1 -> n, run in one write transaction when a file of the older format is opened
    2: ("ALTER TABLE labels ADD COLUMN sample TEXT NOT NULL DEFAULT 'random'",),  # the labels before were fair
    3: ("ALTER TABLE labels ADD COLUMN features TEXT", "ALTER TABLE labels ADD COLUMN features_version TEXT"),
}
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
        gold INTEGER NOT NULL,
        sample TEXT NOT NULL DEFAULT 'random',  -- 'random': a fair sample of the traffic; 'chosen': picked
        features TEXT, features_version TEXT  -- the read's projected hidden state (float16, base64) and its making
    )""",
    _FAMILY_INDEX,
)


def connect(path: Path, timeout: float, fsync: bool) -> sqlite3.Connection:
    """A connection to the feedback database at `path` (see the module's contract)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(
            f"cannot open the feedback database {path}: {exc}; give the path of a file in a writable folder"
        ) from exc
    db.row_factory = sqlite3.Row
    try:
        deadline = time.monotonic() + timeout
        while True:  # processes opening a new file at once: switching it to WAL may find it locked at once
            try:
                _prepare(db, path, timeout, fsync)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
    except sqlite3.DatabaseError as exc:
        db.close()
        if "not a database" in str(exc) or "malformed" in str(exc):
            raise _foreign(path, f"it is not an SQLite database ({exc})") from exc
        raise StoreError(f"cannot use the feedback database {path}: {exc}") from exc
    except StoreError:
        db.close()
        raise
    return db


def _foreign(path: Path, why: str) -> StoreError:
    return StoreError(f"{path} is not a typedlm feedback database: {why}; give a new file's path or one typedlm wrote")


def _prepare(db: sqlite3.Connection, path: Path, timeout: float, fsync: bool) -> None:
    """Check the file is ours (or empty: then make it ours), switch it to WAL and set this connection's syncing."""
    db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    if not _check_format(db, path):
        db.execute("PRAGMA journal_mode = WAL")  # persistent; before the first write so the schema is in WAL
        with transaction(db, path, timeout):
            if not _check_format(db, path):  # another process may have made it meanwhile
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    else:
        _migrate(db, path, timeout)
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'labels_family'").fetchone():
            with transaction(db, path, timeout):  # a file written before the index was
                db.execute(_FAMILY_INDEX)
    if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {'FULL' if fsync else 'NORMAL'}")  # per connection, not in the file


def _check_format(db: sqlite3.Connection, path: Path) -> bool:
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
            raise _foreign(path, "it holds other tables")
        return False
    if application != APPLICATION_ID:
        raise _foreign(path, f"its application id is {application:#x}")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} is a feedback database of format {version}, newer than this typedlm reads "
            f"({SCHEMA_VERSION}); upgrade typedlm, or give another file"
        )
    assert all(v in _MIGRATIONS for v in range(version + 1, SCHEMA_VERSION + 1)), f"no migration from {version}"
    return True


def _migrate(db: sqlite3.Connection, path: Path, timeout: float) -> None:
    """Bring a file of an older format to this one, each step in the same write transaction as its version mark
    (another process migrating the same file at once finds it done once it has the lock)."""
    if db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    with transaction(db, path, timeout):
        version = db.execute("PRAGMA user_version").fetchone()[0]
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[target]:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {target}")


@contextlib.contextmanager
def transaction(db: sqlite3.Connection, path: Path, timeout: float) -> Iterator[sqlite3.Connection]:
    """One write transaction, its write lock taken at the start (so reads inside it see the latest rows)."""
    try:
        db.execute("BEGIN IMMEDIATE")  # waits up to the busy timeout for another writer
    except sqlite3.OperationalError as exc:
        raise StoreError(
            f"the feedback database {path} stayed locked for {timeout:g} s ({exc}): another process "
            "holds its write lock; retry, or look for a process stuck writing to it"
        ) from exc
    try:
        yield db
        db.execute("COMMIT")
    except BaseException as exc:
        if db.in_transaction:  # SQLite may have rolled back already (a full disk)
            db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.OperationalError):  # the disk, not the caller: full, read-only, failing
            raise StoreError(f"cannot write the feedback database {path}: {exc}") from exc
        raise
