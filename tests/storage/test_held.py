"""The lock that keeps the sweeper off a live upload's files (app/storage/held.py)."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest

from app.storage.held import create_held, unheld


def _nfs_flock(real: object) -> object:
    """``flock`` as Linux's NFS client (and SMB since 5.5) does it, emulated with a
    byte-range lock on the whole file: an exclusive lock needs a file open for writing,
    else EBADF (flock(2), NOTES)."""

    def flock(fd: int, operation: int) -> None:
        writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
        if operation & fcntl.LOCK_EX and not writable:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        real(fd, operation)  # type: ignore[operator]

    return flock


def test_the_sweepers_lock_holds_where_flock_is_a_byte_range_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS an exclusive flock on a file opened read-only fails (EBADF): the sweeper
    opens the file for writing, so it finds a held file held, and a free one free,
    rather than failing every pass (README "Clocks")."""
    monkeypatch.setattr(fcntl, "flock", _nfs_flock(fcntl.flock))
    path = tmp_path / "upload-x.spool"
    with create_held(path), unheld(path) as free:
        assert not free
    with unheld(path) as free:
        assert free
    assert path.read_bytes() == b""  # opened for its lock, not written


def test_a_filesystem_without_locks_leaves_the_age_alone_to_guard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the lock cannot be taken at all (NFS without its lock daemon: ENOLCK), a
    file is created (an upload goes on rather than failing) and taken for unheld (the
    age alone guards it, README "Clocks"): the sweep goes on rather than failing every
    pass."""
    path = tmp_path / "upload-x.spool"

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with create_held(path), unheld(path) as free:
        assert free
