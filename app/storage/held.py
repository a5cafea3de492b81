"""Files held by the process writing them, so that the sweeper leaves them alone.

An upload's spool and its stored dataset file carry an exclusive ``flock`` from their
creation until the upload is done with them (the spool removed; the stored file's dataset
committed, or the file removed). :func:`app.datasets.service.remove_stray_files` removes
a leftover only if it can take that lock without waiting (:func:`unheld`), whatever the
file's modification time says: a clock step forward of days, or an upload validated for
longer than ``STRAY_FILE_AGE``, leaves a live upload's files in place. The kernel drops a
``flock`` when its process dies, so a killed upload's files become removable leftovers.

``flock`` locks an open file description: it holds between processes on one host and
between two opens in one process (the API's embedded sweeper and its uploads). A network
filesystem may not honour it between hosts (NFS mounted ``nolock`` or ``local_lock=flock``,
some CIFS and FUSE mounts): there the age rule alone guards a live upload's files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: What ``flock`` says where the filesystem takes no lock (NFS without its lock daemon:
#: ENOLCK)
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP)


def hold(handle: BinaryIO, path: Path) -> None:
    """Lock ``handle``, the file just created at ``path`` (``open(path, "xb")``), for as long
    as it is open. Raises :class:`FileNotFoundError` if the sweeper removed the file in the
    instant between its creation and the lock (it takes the lock to remove it)."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            raise
        # no lock on this filesystem: the file's age alone guards it (module doc)
    opened = os.fstat(handle.fileno())
    now = os.stat(path)  # FileNotFoundError if it was removed
    if (opened.st_dev, opened.st_ino) != (now.st_dev, now.st_ino):
        raise FileNotFoundError(f"{path.name} was replaced before it was locked")


def create_held(path: Path) -> BinaryIO:
    """Create the file at ``path`` (it must not exist) and hold it (:func:`hold`) until
    the returned handle is closed; its writer opens the path for itself."""
    handle = open(path, "xb")  # noqa: SIM115 - the lock lives as long as it is open
    try:
        hold(handle, path)
    except BaseException:
        handle.close()
        raise
    return handle


@contextlib.contextmanager
def unheld(path: Path) -> Iterator[bool]:
    """Whether no process holds ``path`` (:func:`hold`): True while this takes its lock,
    without waiting, until the block ends (a file removed meanwhile is held by none);
    False if the file is held, by a live upload."""
    try:
        # for writing, never written: where flock is a byte-range lock (NFS, SMB) an
        # exclusive one needs it (flock(2)); read-only if this may not write it
        fd = _open_for_lock(path)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                raise
            # no lock on this filesystem: its age alone guards the file (module doc)
        yield True
    finally:
        os.close(fd)


def _open_for_lock(path: Path) -> int:
    try:
        return os.open(path, os.O_WRONLY)
    except PermissionError:
        return os.open(path, os.O_RDONLY)
