"""Transactions' commit and rollback hooks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.core.db import Database, on_commit, on_rollback

SECRET = "carol,37,s3cr3t-diagnosis"
CAUSE = "row 12: s3cr3t-cause"


def _failing_hook() -> None:
    try:
        raise KeyError(CAUSE)
    except KeyError as cause:
        raise ValueError(f"could not enqueue {SECRET}") from cause


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_failing_hook_is_logged_by_type_and_frames_only(
    outcome: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A hook's failure is logged (type and frames) and does not undo the transaction's
    outcome; its message and chained causes, which can quote data values, are not logged."""
    db = Database(f"sqlite:///{tmp_path / 'hooks.db'}")
    ran: list[str] = []
    try:
        with caplog.at_level(logging.DEBUG):
            if outcome == "commit":
                with db.transaction() as session:
                    on_commit(session, _failing_hook)
                    on_commit(session, lambda: ran.append("next hook"))
            else:
                with pytest.raises(RuntimeError), db.transaction() as session:
                    on_rollback(session, _failing_hook)
                    on_rollback(session, lambda: ran.append("next hook"))
                    raise RuntimeError("abort")
    finally:
        db.dispose()
    assert ran == ["next hook"]
    assert SECRET not in caplog.text
    assert CAUSE not in caplog.text
    assert f"an on_{outcome} hook failed with ValueError" in caplog.text
    assert "_failing_hook" in caplog.text  # the frames
    assert all(record.exc_info is None for record in caplog.records)


def test_a_checkpoint_held_off_by_a_reader_does_not_hold_off_writers(tmp_path: Path) -> None:
    """A WAL checkpoint (after a deletion: the forgotten key's old row sits in the log)
    waits for the log's readers, and new writers wait for it: with the connection's 30 s
    busy timeout, a reader held for 8 s held a write for 7.6 s (review). Each try now waits
    at most CHECKPOINT_BUSY_MS and is made again later; requests while one runs run it
    once more instead of starting threads; it finishes once the reader is gone."""
    import threading
    import time

    from sqlalchemy import text

    from app.core import db as db_module

    path = tmp_path / "wal.db"
    db = Database(f"sqlite:///{path}")
    try:
        with db.transaction() as session:
            session.execute(text("CREATE TABLE t (x TEXT)"))
            session.execute(text("INSERT INTO t VALUES ('sealed key')"))
        reader_started, reader_done = threading.Event(), threading.Event()

        def reader() -> None:
            with db.transaction(read_only=True) as session:
                session.execute(text("SELECT x FROM t")).all()  # a snapshot of the log
                reader_started.set()
                reader_done.wait(30)

        holding = threading.Thread(target=reader)
        holding.start()
        assert reader_started.wait(10)
        with db.transaction() as session:  # the row's old value goes to the log
            session.execute(text("UPDATE t SET x = 'forgotten'"))
        started = [t.name for t in threading.enumerate()]
        for _ in range(5):
            db.request_checkpoint()
        threads = [t for t in threading.enumerate() if t.name == "curator-checkpoint"]
        assert len(threads) == 1
        assert started.count("curator-checkpoint") == 0
        time.sleep(0.5)  # the checkpoint's first tries find the reader
        begun = time.monotonic()
        with db.transaction() as session:
            session.execute(text("INSERT INTO t VALUES ('a ledger entry')"))
        assert time.monotonic() - begun < 1.0 + db_module.CHECKPOINT_BUSY_MS / 1000
        reader_done.set()
        holding.join(10)
        threads[0].join(30)
        assert not threads[0].is_alive()
        wal = path.with_name(path.name + "-wal")
        assert not wal.exists() or b"sealed key" not in wal.read_bytes()
    finally:
        reader_done.set()
        db.dispose()
