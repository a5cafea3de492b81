"""``curator backup DIR``: a consistent copy of an embedded (SQLite) deployment while it runs.

The database first, with SQLite's online backup API (a snapshot; a plain copy of the
database file while the service runs misses what its write-ahead log holds: a copy made
so during a test held no dataset and no ledger entry), then the files that snapshot
names: each dataset's encrypted file (data not deleted) and each release's published
artifact version. Files written after the snapshot are left out (the snapshot knows
nothing of them). The copy is then checked against the snapshot: every dataset file is
there and opens with the keys its row holds (a key rotation running meanwhile
re-encrypts files under keys the snapshot lacks) and every published version is there
(a re-synthesis meanwhile replaces its predecessor, a deletion of a release's files
removes it); a copy that fails the check is reported and left incomplete (no
``manifest.json``), to be taken again.

Left out: the spend journal (``spends.jsonl``: restoring an older one would hide the
spends a restored database lost; app.ledger.journal), the queue (the sweeper re-enqueues
the stages a restored database holds), temporary files, and the data key unless asked
for (``with_key``): a backup holding the key beside the encrypted files opens them for
whoever holds the backup.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import make_url, select

from app import __version__
from app.config import KEY_FILE_NAME, Settings
from app.core.db import Database
from app.models import Dataset, Release
from app.models.base import utcnow
from app.storage import tables

#: Written last: a backup directory without it is incomplete.
MANIFEST_NAME = "manifest.json"


class BackupError(Exception):
    """The backup cannot be made as asked (its message says why)."""


@dataclass
class BackupReport:
    datasets: int = 0
    releases: int = 0
    key_included: bool = False
    #: what the check found wrong (file names, release ids): empty for a good backup
    problems: list[str] = field(default_factory=list)


def sqlite_path(settings: Settings) -> Path:
    url = make_url(settings.resolved_database_url)
    if url.get_backend_name() != "sqlite" or not url.database:
        raise BackupError(
            "the database is not a SQLite file: back it up with pg_dump first, then copy "
            "DATA_DIR's datasets/ and releases/ (README, Backups)"
        )
    return Path(url.database)


def _snapshot(source: Path, target: Path) -> None:
    """``source`` copied into ``target`` with SQLite's online backup API (one consistent
    snapshot, taken under a read transaction: writers go on meanwhile)."""
    if not source.is_file():
        raise BackupError(f"there is no database at {source}")
    live = sqlite3.connect(source, timeout=30)
    copy = sqlite3.connect(target)
    try:
        live.backup(copy)  # all pages in one step: one read transaction, one snapshot
    finally:
        copy.close()
        live.close()


def _opens(path: Path, ring: bytes, file_keys: str | None) -> bool:
    try:
        return tables.opens_with(path, tables.file_ring(ring, file_keys))
    except PermissionError:
        return False


def backup(settings: Settings, ring: bytes, target: Path, *, with_key: bool) -> BackupReport:
    """Back up the deployment of ``settings`` (SQLite only) into ``target``, a directory
    that must not exist or be empty. ``ring`` is the service's key ring, to check that
    each copied dataset file opens with the keys its backed-up row holds."""
    source = sqlite_path(settings)
    try:
        tables.arrow_path(target)
    except UnicodeDecodeError:
        # each copied dataset file is opened by pyarrow, which names files in UTF-8 only
        # (tables.arrow_path): refused before anything is written, not a traceback halfway
        raise BackupError(f"{target} is not a UTF-8 path: choose another directory") from None
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise BackupError(f"{target} exists and is not an empty directory")
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    report = BackupReport()
    database_copy = target / "curator.db"
    _snapshot(source, database_copy)
    # read, then left as one file (rollback journal, not WAL: nothing beside it needed)

    copied = Database(f"sqlite:///{database_copy.resolve()}", connections=1)
    try:
        with copied.transaction(read_only=True) as session:
            datasets = session.execute(
                select(Dataset.storage_name, Dataset.file_keys).where(
                    Dataset.data_deleted_at.is_(None)
                )
            ).all()
            published = session.execute(
                select(Release.id, Release.published_version).where(
                    Release.published_version.is_not(None)
                )
            ).all()
    finally:
        copied.dispose()
    with sqlite3.connect(database_copy) as single:  # the engine opened it in WAL mode
        single.execute("PRAGMA journal_mode=DELETE")
    single.close()

    key = settings.existing_key() if with_key else None
    if with_key and key is None:  # pragma: no cover - the command refuses before
        raise BackupError(f"no data key to include ({settings.data_dir / KEY_FILE_NAME})")

    datasets_dir = target / "datasets"
    datasets_dir.mkdir(mode=0o700)
    for storage_name, file_keys in datasets:
        live = settings.datasets_dir / storage_name
        copy = datasets_dir / storage_name
        try:
            shutil.copy2(live, copy)
        except FileNotFoundError:
            report.problems.append(f"dataset file {storage_name}: missing")
            continue
        if not _opens(copy, ring, file_keys):
            report.problems.append(
                f"dataset file {storage_name}: does not open with the keys the database "
                "copy holds (a key rotation ran during the backup?)"
            )
            continue
        if key is not None and not _opens(copy, key, file_keys):
            # the backup holds the data key alone, not CURATOR_PREVIOUS_DATA_KEYS
            report.problems.append(
                f"dataset file {storage_name}: opens only with a previous data key "
                "(CURATOR_PREVIOUS_DATA_KEYS), which --with-key does not include: run "
                "curator rotate-data-key to its end first"
            )
            continue
        report.datasets += 1

    releases_dir = target / "releases"
    releases_dir.mkdir(mode=0o700)
    for release_id, version in published:
        live = settings.releases_dir / str(release_id) / f"v{version}"
        copy = releases_dir / str(release_id) / f"v{version}"
        copy.parent.mkdir(mode=0o700, exist_ok=True)
        try:
            shutil.copytree(live, copy)
        except (FileNotFoundError, shutil.Error):
            # gone before the copy began, or files of it removed while it was copied
            # (copytree collects those into one shutil.Error, which ended the command
            # with a traceback and no word of what to do)
            report.problems.append(
                f"release {release_id}: its published version v{version} is missing "
                "(replaced by a re-synthesis, or its files deleted by its curator, during "
                "the backup?)"
            )
            continue
        report.releases += 1

    if key is not None:
        fd = os.open(target / KEY_FILE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key + b"\n")
        report.key_included = True

    if not report.problems:
        manifest = {
            "curator": __version__,
            "taken_at": utcnow().isoformat(),
            "database": "curator.db",
            "datasets": report.datasets,
            "releases": report.releases,
            "data_key": KEY_FILE_NAME if report.key_included else None,
        }
        (target / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return report
