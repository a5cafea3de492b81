"""Database engine and transactions.

One rule: the caller owns the transaction. A request gets a session from
:func:`get_session` (committed after the endpoint returns, before the response is sent;
rolled back on any error), and a service given that session never commits it; a worker
stage uses :meth:`Database.transaction`. A use case whose slow part (decoding a
release and answering, checking a release request, re-encrypting files) must not hold
one of the process's few sessions opens its own short transactions with
:meth:`Database.transaction` instead of taking the request's
(``answers.service.answer``, ``releases.service.preview`` and the release request's
checks, ``datasets.service.rotate_data_key``, a CLI command). Work that must happen
only once the transaction has committed (enqueueing a job) or undone when it rolls back
(deleting a file written for it) is registered with :func:`on_commit` /
:func:`on_rollback`.

SQLite: a transaction that may write starts with ``BEGIN IMMEDIATE``, so write
transactions are serialised by the database itself (the budget check and the ledger
append cannot interleave; a deferred transaction could not safely upgrade to a write
under WAL), with a 30 s busy timeout. Read-only transactions (``read_only=True``: the
API key lookup, GET requests) start ``BEGIN DEFERRED`` and never block writers.
PostgreSQL: the ledger locks the dataset row with ``SELECT ... FOR NO KEY UPDATE`` and then
sums the ledger; that sum must see every transaction committed before the lock was
granted, which only ``READ COMMITTED`` guarantees (each statement takes a fresh snapshot).
Under ``REPEATABLE READ`` the snapshot is taken at a transaction's first statement, before
the lock, so a waiter would sum a stale ledger and overspend. The engine therefore sets
``READ COMMITTED`` itself instead of inheriting the server's, database's or role's
``default_transaction_isolation``.

Clocks: a release stage's lease (``Release.lease_expires_at``) is set by one process (an
API process, a worker, a sweeper) and compared by others, on other hosts. Its times are
read off the database's clock (:func:`db_now`), never a host's: with hosts drifting more
than a lease apart, a host ahead handed a live stage to another worker and a host behind
set leases that had already run out (``tests/releases/test_db_clock.py``). A step of
that clock costs time or work, never a privacy rule: a step forward hands running stages
over (their writes are refused by the owner check), a step back is undone by the sweeper
within a lease for leases that end further ahead than any is given
(:func:`app.releases.stages.sweep`; ``bench/results/clock_audit.md``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, func, make_url, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.core.errors import frames_only

log = logging.getLogger("curator.db")

_ON_COMMIT = "curator_on_commit"
_BEGIN_OPTION = "curator_sqlite_begin"
_ON_ROLLBACK = "curator_on_rollback"
#: Connections a pool keeps open while idle; a process that may need more opens the rest
#: on demand (the pool's overflow) and closes them when they come back.
KEPT_CONNECTIONS = 10
#: The most connections a process that does not say what it needs may hold at once (a
#: one-shot command, a test): ``curator serve`` and ``curator worker`` size their pools
#: from their own limits (:func:`app.core.deps.request_connections`,
#: :func:`app.releases.stages.worker_connections`).
DEFAULT_CONNECTIONS = 30
#: How long a try of :meth:`Database.checkpoint` waits for the log's readers (new writers
#: wait for it meanwhile), in milliseconds, and how many tries it makes.
CHECKPOINT_BUSY_MS = 100
CHECKPOINT_TRIES = 60


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine configured for this service (see the module docstring). Its
    errors never carry the statement's parameters (``hide_parameters``): they can be data
    values, and an error's message can end up in a log."""
    kwargs.setdefault("hide_parameters", True)
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
            # Take transaction control away from the sqlite3 module so that BEGIN is ours.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            # what a row held (a dataset's sealed file keys, forgotten when its data are
            # deleted) is overwritten in the database file, not left in its free pages
            # (some builds default to it; this one need not)
            cursor.execute("PRAGMA secure_delete=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection: Any) -> None:
            mode = connection.get_execution_options().get(_BEGIN_OPTION, "IMMEDIATE")
            connection.exec_driver_sql(f"BEGIN {mode}")

        return engine
    kwargs.setdefault("isolation_level", "READ COMMITTED")  # the ledger needs it (module doc)
    return create_engine(url, pool_pre_ping=True, **kwargs)


def on_commit(session: Session, callback: Callable[[], object]) -> None:
    """Run ``callback`` once the session's transaction has committed."""
    session.info.setdefault(_ON_COMMIT, []).append(callback)


def on_rollback(session: Session, callback: Callable[[], None]) -> None:
    """Run ``callback`` if the session's transaction rolls back (e.g. remove a written file)."""
    session.info.setdefault(_ON_ROLLBACK, []).append(callback)


def _run_hooks(session: Session, key: str) -> None:
    hooks: list[Callable[[], object]] = session.info.pop(key, [])
    session.info.pop(_ON_ROLLBACK if key == _ON_COMMIT else _ON_COMMIT, None)
    for hook in hooks:
        try:
            hook()
        except Exception as exc:
            # type and frames only: the message or a chained cause can quote a data value
            # (privacy rule 5), and log.exception would print both
            failed = type(exc).__name__
            when = key.removeprefix("curator_")
            log.error("an %s hook failed with %s\n%s", when, failed, frames_only(exc))


def pool_limits(connections: int) -> dict[str, int]:
    """The pool of a process that holds at most ``connections`` at once: up to
    :data:`KEPT_CONNECTIONS` kept, the rest opened on demand. A pool smaller than what its
    process can hold made the last requests wait ``pool_timeout`` (30 s) for a connection
    and fail."""
    if connections < 1:
        raise ValueError(f"connections ({connections}) must be at least 1")
    kept = min(KEPT_CONNECTIONS, connections)
    return {"pool_size": kept, "max_overflow": connections - kept}


def pool_capacity(engine: Engine) -> int:
    """The most connections ``engine``'s pool hands out at once (kept plus overflow)."""
    pool: Any = engine.pool  # a QueuePool (its limits have no public accessor)
    return int(pool.size()) + int(pool._max_overflow)


class Database:
    """An engine and its session factory; its pool holds ``connections`` at most
    (:func:`pool_limits`), what its process can hold at once."""

    def __init__(
        self, url: str, *, connections: int = DEFAULT_CONNECTIONS, **engine_kwargs: Any
    ) -> None:
        self.url = url
        if not url.startswith("sqlite") or make_url(url).database not in (None, "", ":memory:"):
            # on a SQLite file too: SQLAlchemy's default there (5 + 10) is a pool as well
            for name, value in pool_limits(connections).items():
                engine_kwargs.setdefault(name, value)
        self.engine = make_engine(url, **engine_kwargs)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False, autoflush=True)
        self._read_engine = self.engine.execution_options(**{_BEGIN_OPTION: "DEFERRED"})
        self._checkpoint_lock = threading.Lock()
        self._checkpointing = False
        self._checkpoint_again = False

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def transaction(
        self, *, read_only: bool = False, lock_timeout: float | None = None
    ) -> Iterator[Session]:
        """A session whose transaction commits at the end of the block, or rolls back.

        ``read_only`` transactions must not write; on SQLite they do not take the write lock.
        ``lock_timeout`` (seconds; None or 0: no limit), on PostgreSQL: a statement of the
        transaction that waits longer than that for a lock fails (SQLSTATE 55P03
        ``lock_not_available``, a 503 under a request: :func:`app.core.errors.unavailable`)
        and the transaction rolls back. Set with ``SET LOCAL`` semantics, so it ends with
        the transaction and the pooled connection goes back without it. A request's write
        transactions take it (``CURATOR_LOCK_TIMEOUT``, :mod:`app.core.deps`); a worker's
        stages do not. SQLite: ignored (its busy timeout, 30 s, bounds the wait for the
        write lock, and ``BEGIN IMMEDIATE`` takes it at the start).
        """
        session = self.sessions(bind=self._read_engine) if read_only else self.sessions()
        try:
            if lock_timeout and not self.is_sqlite:
                limit = f"{max(1, math.ceil(lock_timeout * 1000))}ms"
                session.execute(
                    text("SELECT set_config('lock_timeout', :limit, true)"), {"limit": limit}
                )
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            _run_hooks(session, _ON_ROLLBACK)
            raise
        else:
            _run_hooks(session, _ON_COMMIT)
        finally:
            session.close()

    def request_checkpoint(self) -> None:
        """Run :meth:`checkpoint` in the background: in one thread at a time, a request
        while it runs making it run once more (so deletions one after the other start no
        thread each, and the last one's row is checkpointed too)."""
        with self._checkpoint_lock:
            self._checkpoint_again = True
            if self._checkpointing:
                return
            self._checkpointing = True
        threading.Thread(target=self._checkpoints, name="curator-checkpoint", daemon=True).start()

    def _checkpoints(self) -> None:
        while True:
            with self._checkpoint_lock:
                if not self._checkpoint_again:
                    self._checkpointing = False
                    return
                self._checkpoint_again = False
            self.checkpoint()

    def checkpoint(self, tries: int = CHECKPOINT_TRIES, pause: float = 1.0) -> bool:
        """On SQLite, copy the write-ahead log into the database file and truncate it
        (``PRAGMA wal_checkpoint(TRUNCATE)``, outside any transaction), so that what a
        transaction overwrote (a dataset's sealed file keys, forgotten when its data are
        deleted) no longer sits in the log's frames. The checkpoint waits for the log's
        readers, and new writers wait for it meanwhile: so each try waits at most
        :data:`CHECKPOINT_BUSY_MS` (with the connection's 30 s busy timeout, a reader held
        for 8 s held every writer, the ledger's included, for 7.6 s: review), and a try
        that finds readers still there (SQLite answers busy, it raises nothing) is made
        again ``pause`` seconds later, ``tries`` times at most, then left to SQLite's own
        checkpoints with a warning. Returns whether it finished.

        On PostgreSQL, ``VACUUM`` the datasets table (:meth:`_vacuum_datasets`): an UPDATE
        leaves the row's old version, sealed key and fingerprint, in its page and the
        fingerprint's index until a VACUUM prunes them, and autovacuum waits for a fifth
        of the table to change (a canary audit found both minutes after a deletion,
        ``bench/canary_audit.py``). The server's WAL and its archives keep them: README."""
        if not self.is_sqlite:
            return self._vacuum_datasets()
        for _ in range(tries):
            try:
                raw = self.engine.raw_connection()
                try:
                    cursor = raw.cursor()
                    cursor.execute(f"PRAGMA busy_timeout={CHECKPOINT_BUSY_MS}")
                    try:
                        busy = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                    finally:  # the pooled connection's own, for the transactions it serves
                        cursor.execute("PRAGMA busy_timeout=30000")
                        cursor.close()
                finally:
                    raw.close()
            except Exception as exc:
                failed = type(exc).__name__
                log.info("a checkpoint of the database's log did not finish (%s)", failed)
                return False
            if not busy:
                return True
            time.sleep(pause)
        log.warning("the database's log was not checkpointed: readers held it %d times", tries)
        return False

    def _vacuum_datasets(self) -> bool:
        """``VACUUM datasets``, outside any transaction (it cannot run in one); a failure
        (the table is not the connection's user's to vacuum, a lost connection) is logged
        by its type and left to autovacuum. A VACUUM takes no lock that blocks reads or
        writes of the rows (``SHARE UPDATE EXCLUSIVE``); it waits for one held by another
        VACUUM or a schema change."""
        try:
            with self.engine.connect() as connection:
                connection = connection.execution_options(isolation_level="AUTOCOMMIT")
                # closed when done rather than returned to the pool: one returned after
                # the engine was disposed meanwhile (the process or a test stopping) was
                # left open in the old pool (a ResourceWarning in a later test)
                connection.detach()
                connection.exec_driver_sql("VACUUM datasets")
        except Exception as exc:
            log.warning("the datasets table was not vacuumed (%s)", type(exc).__name__)
            return False
        return True

    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()


_T = TypeVar("_T")

#: Values per ``IN (...)`` list of a statement (:func:`in_chunks`): SQLite allows 32,766
#: variables in a statement.
IN_CHUNK = 500


def in_chunks(values: list[_T]) -> Iterator[list[_T]]:
    """``values`` in lists of at most :data:`IN_CHUNK`, one ``IN (...)`` list each: one
    list of every value failed past SQLite's bound on a statement's variables."""
    for start in range(0, len(values), IN_CHUNK):
        yield values[start : start + IN_CHUNK]


def uses_row_locks(session: Session) -> bool:
    """True on PostgreSQL (lock rows with ``FOR UPDATE``); False on SQLite, where the
    ``BEGIN IMMEDIATE`` transaction already holds the database write lock."""
    return session.get_bind().dialect.name != "sqlite"


def advisory_lock_key(label: bytes, uid: uuid.UUID) -> int:
    """A PostgreSQL advisory lock's key: 64 bits of SHA-256 of ``label`` and ``uid``
    (the label keeps kinds of lock apart; two sharing one, 2^-64, only wait for each
    other)."""
    digest = hashlib.sha256(label + uid.bytes).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def take_advisory_lock(session: Session, key: int, *, exclusive: bool = True) -> None:
    """Take the advisory lock ``key`` (:func:`advisory_lock_key`), exclusive or shared,
    until the transaction ends (PostgreSQL only: the caller checks
    :func:`uses_row_locks`)."""
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    session.execute(text(f"SELECT {function}(:lock)"), {"lock": key})


def db_now(session: Session) -> datetime:
    """The time by the database's clock, timezone-aware UTC, for times that processes on
    other hosts compare (a release stage's lease; module docstring).

    PostgreSQL: ``clock_timestamp()``, the server's clock when the statement runs. Not
    ``now()`` (``transaction_timestamp()``): that is the transaction's start, before the
    row lock a claim or a heartbeat waits for (up to another stage's whole store), so a
    lease set from it was shorter by that wait. ``statement_timestamp()`` would do as well
    here (the statement reads nothing else), but only ``clock_timestamp()`` says so
    whatever the statement. SQLite: the host's clock, the one host that opens the database
    file (SQLite's own ``'now'`` reads the same clock, to the millisecond only)."""
    if not uses_row_locks(session):
        return datetime.now(UTC)
    now = session.scalar(select(func.clock_timestamp()))
    if not isinstance(now, datetime) or now.tzinfo is None:
        raise RuntimeError("the database's clock_timestamp() is not a timestamp with a time zone")
    return now.astimezone(UTC)
