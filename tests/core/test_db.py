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
    assert f"a on_{outcome} hook failed with ValueError" in caplog.text
    assert "_failing_hook" in caplog.text  # the frames
    assert all(record.exc_info is None for record in caplog.records)
