"""The results store: one SQLite row per measured variant, keyed by its signature.

Written once per measurement, read by the search (skip what was measured), the
emitter (the winners) and the report. Nothing in it is ever re-derived: a row is what
the worker measured.

Durability (Ctrl-C, kill -9, power loss)
----------------------------------------
* Every `put()` is one transaction (BEGIN IMMEDIATE ... COMMIT) and returns only
  after COMMIT. A committed row is in the database's write-ahead log.
* journal_mode=WAL: a writer appends to `<db>-wal`; readers in other processes see
  the last committed state while a write is in progress, and a writer killed halfway
  leaves an uncommitted tail in the WAL that the next opener ignores (the WAL frames
  carry checksums and a commit marker). A reader never waits for a writer.
* synchronous=FULL: COMMIT also fsyncs the WAL. Against kill -9 alone, the default
  synchronous=NORMAL would already be enough (a committed transaction has been
  written to the WAL file with write(), and the OS keeps it when the process dies);
  FULL also keeps the last committed rows across an OS crash or power cut. The cost,
  one fsync per measurement, is nothing next to compiling and timing a variant.
* busy_timeout: two processes writing at once wait for each other instead of failing.
So a measurement reported as stored (put() returned) survives kill -9 of the writer,
and the database passes `PRAGMA integrity_check` afterwards
(tests/tuner/test_store.py kills a writer ~20 times to check both).

Exclusive writers
-----------------
`Store(path, exclusive=True)` takes an flock() on `<path>.lock` for the life of the
Store, so two tuner runs cannot interleave their measurements on one machine. flock
locks belong to the open file, so the kernel drops them when the holder dies, even by
kill -9: a stale lock file never blocks a later run. Readers (the report, replay) do
not take the lock. `wait=True` blocks until the lock is free; a number waits at most
that many seconds; otherwise `StoreLocked` is raised at once.
"""
from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from tuner.build.signature import canonical_json, variant_id

SCHEMA_VERSION = 1
# "leak" came later: stores made before it are widened when opened for writing
STATUSES = ("ok", "compile_error", "crash", "timeout", "wrong", "error", "leak")
BUSY_TIMEOUT_MS = 60_000


class StoreError(RuntimeError):
    """The store file cannot be used (wrong schema version, not a results store, bad row)."""


class StoreLocked(StoreError):
    """Another process holds the exclusive writer lock of this store."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder  # "results store X is being written by ... (pid N)"

    def holder_text(self) -> str:
        return self.holder or str(self)


@dataclass(frozen=True)
class Measurement:
    """One measured (or failed) variant of one kernel on one problem.

    key: the signature (tuner.build.signature.signature) of everything the result depends on.
    status: "ok" or why the variant is unusable: compile_error | crash | timeout | wrong |
    error | leak (timed, but its memory grows per call).
    reason: the compiler message / signal / mismatch ("" for ok).
    median_s, spread: median seconds per call and relative IQR ((q3 - q1) / median).
    gbps, bw_fraction: weight bytes streamed per second, and that over the host's
    measured read bandwidth.
    """
    key: str
    kernel: str
    problem: str
    knobs: dict
    status: str
    reason: str = ""
    median_s: float | None = None
    spread: float | None = None
    samples: int = 0
    gbps: float | None = None
    bw_fraction: float | None = None
    extra: dict = field(default_factory=dict)
    host_id: str = ""
    profile: str = ""
    created: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def variant(self) -> str:
        return variant_id(self.knobs)

    def check(self) -> None:
        """Raise StoreError if the row is not storable as it is."""
        where = f"measurement {self.key[:16]} ({self.kernel} {self.problem})"
        if not isinstance(self.key, str) or not self.key:
            raise StoreError(f"{where}: key must be a non-empty string")
        if self.status not in STATUSES:
            raise StoreError(f"{where}: status {self.status!r} is not one of {STATUSES}")
        if not isinstance(self.knobs, Mapping):
            raise StoreError(f"{where}: knobs must be a mapping")
        for name in ("median_s", "spread", "gbps", "bw_fraction"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise StoreError(f"{where}: {name}={v!r} must be a finite number or None")
        if self.status == "ok":
            if self.median_s is None or self.median_s <= 0:
                raise StoreError(f"{where}: an ok measurement needs median_s > 0, got {self.median_s!r}")
        elif not self.reason:
            raise StoreError(f"{where}: status {self.status} needs a reason")


_COLUMNS = ("key", "kernel", "problem", "knobs", "variant", "status", "reason", "median_s",
            "spread", "samples", "gbps", "bw_fraction", "extra", "host_id", "profile", "created")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS measurements (
    key         TEXT PRIMARY KEY,
    kernel      TEXT NOT NULL,
    problem     TEXT NOT NULL,
    knobs       TEXT NOT NULL,      -- canonical JSON
    variant     TEXT NOT NULL,      -- tuner.build.signature.variant_id(knobs)
    status      TEXT NOT NULL CHECK (status IN ({", ".join(repr(s) for s in STATUSES)})),
    reason      TEXT NOT NULL,
    median_s    REAL,
    spread      REAL,
    samples     INTEGER NOT NULL,
    gbps        REAL,
    bw_fraction REAL,
    extra       TEXT NOT NULL,      -- JSON
    host_id     TEXT NOT NULL,
    profile     TEXT NOT NULL,
    created     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS measurements_by_problem ON measurements (kernel, problem, status);
"""


def _row(m: Measurement) -> tuple:
    return (m.key, m.kernel, m.problem, canonical_json(dict(m.knobs)), variant_id(m.knobs),
            m.status, m.reason, _num(m.median_s), _num(m.spread), int(m.samples), _num(m.gbps),
            _num(m.bw_fraction), canonical_json(dict(m.extra)), m.host_id, m.profile,
            float(m.created))


def _num(v):
    return None if v is None else float(v)


def _measurement(row: sqlite3.Row) -> Measurement:
    return Measurement(key=row["key"], kernel=row["kernel"], problem=row["problem"],
                       knobs=json.loads(row["knobs"]), status=row["status"], reason=row["reason"],
                       median_s=row["median_s"], spread=row["spread"], samples=row["samples"],
                       gbps=row["gbps"], bw_fraction=row["bw_fraction"],
                       extra=json.loads(row["extra"]), host_id=row["host_id"],
                       profile=row["profile"], created=row["created"])


class _WriterLock:
    """flock() on <db>.lock; released on close or when the process dies."""

    def __init__(self, db_path: Path, wait: bool | float):
        self.db_path = Path(db_path)
        self.path = Path(str(db_path) + ".lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._acquire(wait)
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(self.fd)
            raise

    def _acquire(self, wait: bool | float) -> None:
        if wait is True:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            return
        deadline = time.monotonic() + (float(wait) if wait else 0.0)
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if time.monotonic() >= deadline:
                who = (f"results store {self.db_path} is being written by another tuner "
                       f"process{self._holder()} (lock {self.path})")
                raise StoreLocked(f"{who}; wait for it to finish, or open with wait=True to "
                                  f"queue behind it", who)
            time.sleep(0.05)

    def _holder(self) -> str:
        try:
            pid = os.pread(self.fd, 32, 0).decode().strip()
        except OSError:
            return ""
        return f" (pid {pid})" if pid.isdigit() else ""

    def release(self) -> None:
        if self.fd >= 0:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = -1


class Store:
    """A results store file. Use as a context manager, or call close().

    Store(path)                  open or create, read and write
    Store(path, exclusive=True)  also hold the writer lock (StoreLocked if taken)
    Store(path, readonly=True)   read an existing store; never creates or changes it
    A Store may be shared between threads of one process (calls are serialised).
    """

    def __init__(self, path: str | os.PathLike, *, exclusive: bool = False,
                 wait: bool | float = False, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._writer_lock: _WriterLock | None = None
        self._db: sqlite3.Connection | None = None
        if readonly and exclusive:
            raise ValueError("a read-only store cannot take the exclusive writer lock")
        if readonly and not self.path.exists():
            raise StoreError(f"results store {self.path} does not exist")
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        if exclusive:
            self._writer_lock = _WriterLock(self.path, wait)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        mode = "ro" if self.readonly else "rwc"
        # URI form for both, so ATTACH (merge_from) may take a read-only URI too
        db = sqlite3.connect(self.path.resolve().as_uri() + f"?mode={mode}", uri=True,
                             isolation_level=None, check_same_thread=False,
                             timeout=BUSY_TIMEOUT_MS / 1000)
        self._db = db
        db.row_factory = sqlite3.Row
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if not self.readonly:
                mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise StoreError(f"results store {self.path}: cannot use WAL journal (got {mode})")
                db.execute("PRAGMA synchronous = FULL")
                with self._transaction():
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            db.execute(stmt)
                    if db.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 0:
                        db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                    self._widen_statuses(db)
            self._check_schema(db, str(self.path))
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a usable results store: {exc}") from None

    @staticmethod
    def _widen_statuses(db: sqlite3.Connection) -> None:
        """A store made before a status existed has a CHECK that refuses it: rebuild the
        table with today's CHECK (inside the caller's transaction, so a kill leaves
        either the old table or the new one). The columns are unchanged, so the schema
        version stays and older tuners still read the store."""
        sql = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = "
                         "'measurements'").fetchone()[0]
        if all(f"'{s}'" in sql for s in STATUSES):
            return
        cols = ", ".join(_COLUMNS)
        db.execute("ALTER TABLE measurements RENAME TO measurements_old")
        db.execute("DROP INDEX IF EXISTS measurements_by_problem")
        for stmt in _SCHEMA.split(";"):
            if "measurements" in stmt:
                db.execute(stmt)
        db.execute(f"INSERT INTO measurements ({cols}) SELECT {cols} FROM measurements_old "
                   f"ORDER BY rowid")
        db.execute("DROP TABLE measurements_old")

    @staticmethod
    def _check_schema(db: sqlite3.Connection, where: str, schema: str = "main") -> None:
        try:
            rows = db.execute(f"SELECT version FROM {schema}.schema_version").fetchall()
        except sqlite3.OperationalError:
            raise StoreError(f"{where} is not a results store (no schema_version table)") from None
        versions = {r[0] for r in rows}
        if versions != {SCHEMA_VERSION}:
            raise StoreError(f"{where}: results store schema version {sorted(versions)}, this "
                             f"tuner reads version {SCHEMA_VERSION}")

    class _Tx:
        def __init__(self, db):
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")

        def __exit__(self, exc_type, exc, tb):
            if exc_type is None:
                self.db.execute("COMMIT")
            else:
                self.db.execute("ROLLBACK")
            return False

    def _transaction(self):
        return Store._Tx(self._db)

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._writer_lock is not None:
                self._writer_lock.release()
                self._writer_lock = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"results store {self.path} is closed")
        return self._db

    # ------------------------------------------------------------ writing

    def put(self, m: Measurement) -> None:
        """Store `m` (replacing a row with the same key) and commit before returning."""
        if self.readonly:
            raise StoreError(f"results store {self.path} was opened read-only")
        m.check()
        row = _row(m)
        with self._lock:
            db = self._conn()
            with self._transaction():
                db.execute(f"INSERT OR REPLACE INTO measurements ({', '.join(_COLUMNS)}) "
                           f"VALUES ({', '.join('?' * len(_COLUMNS))})", row)

    def merge_from(self, other_path: str | os.PathLike) -> int:
        """Copy in every row of another store whose key is not here; return how many."""
        if self.readonly:
            raise StoreError(f"results store {self.path} was opened read-only")
        other = Path(other_path)
        if not other.exists():
            raise StoreError(f"results store {other} does not exist")
        if other.resolve() == self.path.resolve():
            return 0
        with self._lock:
            db = self._conn()
            uri = other.resolve().as_uri() + "?mode=ro"
            db.execute("ATTACH DATABASE ? AS other", (uri,))
            try:
                self._check_schema(db, str(other), "other")
                cols = ", ".join(_COLUMNS)
                with self._transaction():
                    before = db.total_changes
                    db.execute(f"INSERT OR IGNORE INTO main.measurements ({cols}) "
                               f"SELECT {cols} FROM other.measurements")
                    added = db.total_changes - before
            finally:
                db.execute("DETACH DATABASE other")
        return added

    def snapshot(self, dest: str | os.PathLike) -> Path:
        """A consistent single-file copy (rollback journal, no -wal beside it): for fixtures.
        Written under a temp name and linked into place, so `dest` is never half a file."""
        dest = Path(dest)
        if dest.exists():
            raise StoreError(f"{dest} exists; snapshot() does not overwrite")
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        os.close(fd)
        try:
            with self._lock:
                out = sqlite3.connect(tmp, isolation_level=None)
                try:
                    self._conn().backup(out)
                    out.execute("PRAGMA journal_mode = DELETE")
                    out.execute("VACUUM")
                finally:
                    out.close()
            os.chmod(tmp, 0o644)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            try:
                os.link(tmp, dest)  # unlike rename, refuses to replace a file made meanwhile
            except FileExistsError:
                raise StoreError(f"{dest} exists; snapshot() does not overwrite") from None
        finally:
            os.unlink(tmp)
        return dest

    # ------------------------------------------------------------ reading

    def get(self, key: str) -> Measurement | None:
        with self._lock:
            row = self._conn().execute("SELECT * FROM measurements WHERE key = ?", (key,)).fetchone()
        return _measurement(row) if row else None

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return self._conn().execute("SELECT 1 FROM measurements WHERE key = ?",
                                        (key,)).fetchone() is not None

    def __len__(self) -> int:
        with self._lock:
            return self._conn().execute("SELECT COUNT(*) FROM measurements").fetchone()[0]

    def keys(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._conn().execute("SELECT key FROM measurements")}

    def query(self, kernel: str | None = None, problem: str | None = None,
              status: str | Iterable[str] | None = None, host_id: str | None = None,
              profile: str | None = None) -> list[Measurement]:
        """Rows matching every filter given, oldest first."""
        where, args = [], []
        for col, val in (("kernel", kernel), ("problem", problem), ("host_id", host_id),
                         ("profile", profile)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            bad = [s for s in statuses if s not in STATUSES]
            if bad:
                raise ValueError(f"unknown status {bad}; statuses are {STATUSES}")
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            args += statuses
        sql = "SELECT * FROM measurements"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created, rowid"
        with self._lock:
            rows = self._conn().execute(sql, args).fetchall()
        return [_measurement(r) for r in rows]

    def __iter__(self) -> Iterator[Measurement]:
        return iter(self.query())

    def best(self, kernel: str, problem: str, host_id: str | None = None) -> Measurement | None:
        """The ok measurement with the lowest median_s (ties: the earliest)."""
        sql = ("SELECT * FROM measurements WHERE kernel = ? AND problem = ? AND status = 'ok'"
               + (" AND host_id = ?" if host_id is not None else "")
               + " ORDER BY median_s, created, rowid LIMIT 1")
        args = [kernel, problem] + ([host_id] if host_id is not None else [])
        with self._lock:
            row = self._conn().execute(sql, args).fetchone()
        return _measurement(row) if row else None

    def problems(self) -> list[tuple[str, str]]:
        """The distinct (kernel, problem) pairs recorded, sorted."""
        with self._lock:
            return [(r[0], r[1]) for r in self._conn().execute(
                "SELECT DISTINCT kernel, problem FROM measurements ORDER BY kernel, problem")]

    def integrity_check(self) -> str:
        """SQLite's PRAGMA integrity_check: "ok" or the problems found."""
        with self._lock:
            rows = self._conn().execute("PRAGMA integrity_check").fetchall()
        return "\n".join(r[0] for r in rows)
