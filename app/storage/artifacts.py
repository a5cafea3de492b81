"""Release artifacts on disk: ``<DATA_DIR>/releases/<release id>/v<synthesis version>/``.

Artifacts are differentially private outputs (or, for ``compressed``, the declared
non-DP release) and are stored in clear. A version is written into a temporary directory
and renamed into place when complete, so a reader never sees half an artifact and a
crashed synthesis leaves only a ``.tmp-*`` directory, removed on the next attempt (or, once
its run is over, by the sweeper: :func:`app.releases.stages.remove_stale_work`).

The temporary directories, and what a removal renames out of the way (``.trash-*``), live
under ``<DATA_DIR>/releases/.work/<release id>/``, not beside the versions: the sweeper
lists only ``.work``, which holds the runs going on and what dead processes left, so its
pass costs what exists there, not one listing per release ever published (10^5 published
releases: 7 s a pass, every 30 s; ``bench/results/sweeper_history_*.md``). Directories
that releases stored before kept them beside their versions (``legacy``): the sweeper's
first pass after a start lists those too (:meth:`ArtifactStore.leftovers`).
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from app.core.types import PLAIN_NUMBER
from app.storage.tables import arrow_path, batch_rows


def sample_chunk_rows(width: int) -> int:
    """Rows of ``width`` columns per chunk of a released sample written with
    :func:`write_csv_and_parquet`: :func:`~app.storage.tables.batch_rows` (about 64 MiB
    of 8-byte values: float64, or a decoded category's reference before Arrow copies its
    text) without its cap of 65,536 rows: each chunk is a Parquet row group with its own
    dictionaries, and a sample's values repeat its support points (10^6 rows of 50
    columns from 10^4 points: 151 MB in 65,536-row groups, 112 MB in 64 MiB ones, 92 MB
    in one; the rise in memory 140, 234 and 812 MiB)."""
    return batch_rows(width, capped=False)


#: A text cell that starts with one of these is read as a formula by a spreadsheet (``=``,
#: ``+``, ``-``, ``@``) or hides the character that would be (tab, CR): OWASP's list of
#: CSV-injection triggers.
FORMULA_START = r"^[=+\-@\t\r]"
#: A whole cell that is a plain number (``-1``, ``+2.5``, ``-3e-4``): read as that number,
#: never as a formula (:data:`app.core.types.PLAIN_NUMBER`, anchored for Arrow's RE2).
WHOLE_NUMBER = f"^{PLAIN_NUMBER}$"


def spreadsheet_safe(table: pa.Table) -> pa.Table:
    """``table`` with every text cell that a spreadsheet would read as a formula
    (:data:`FORMULA_START`, unless it is a :data:`WHOLE_NUMBER`) prefixed with a single
    quote, OWASP's escape for CSV injection: a spreadsheet shows the cell as text and runs
    nothing. Numeric columns are never touched (a negative number stays a number), nor
    text that is a plain number. For the CSV only: the Parquet file keeps the values."""
    columns = []
    for column in table.columns:
        kind = column.type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
            if pa.types.is_string(kind) or pa.types.is_large_string(kind):
                column = column.cast(kind)
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            columns.append(column)
            continue
        formula = pc.and_not(
            pc.match_substring_regex(column, FORMULA_START),
            pc.match_substring_regex(column, WHOLE_NUMBER),
        )
        if not pc.any(formula).as_py():
            columns.append(column)
            continue
        quoted = pc.binary_join_element_wise(pa.scalar("'", kind), column, pa.scalar("", kind))
        columns.append(pc.if_else(formula, quoted, column))
    return pa.table(columns, names=table.column_names)


def write_csv_and_parquet(
    csv_path: Path, parquet_path: Path, tables: Iterable[pa.Table], **parquet_options: Any
) -> None:
    """``tables`` (at least one, all of the first one's schema) written in order to one
    CSV file (one header) and one Parquet file (a row group a table, or more: Parquet's
    own limit), so that only one table of rows is in memory at a time. The same values
    and text as the tables concatenated and written whole, but for the CSV's text cells
    that a spreadsheet would read as a formula, which it quotes (:func:`spreadsheet_safe`).
    The CSV's header is the schema's names as declared, unquoted (programs read columns
    by name): the declaration rule keeps names from being formulas that call a function
    (``app.datasets.schemas``), except those of datasets declared before it (README)."""
    csv_writer: pacsv.CSVWriter | None = None
    parquet_writer: pq.ParquetWriter | None = None
    try:
        for table in tables:
            if csv_writer is None or parquet_writer is None:
                csv_writer = pacsv.CSVWriter(arrow_path(csv_path), table.schema)
                parquet_writer = pq.ParquetWriter(
                    arrow_path(parquet_path), table.schema, **parquet_options
                )
            csv_writer.write_table(spreadsheet_safe(table))
            parquet_writer.write_table(table)
    finally:
        if csv_writer is not None:
            csv_writer.close()
        if parquet_writer is not None:
            parquet_writer.close()


#: The directory under the store's root that holds the runs' temporary directories and
#: what removals renamed out of the way, one subdirectory a release.
WORK_DIR = ".work"


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def release_dir(self, release_id: uuid.UUID) -> Path:
        return self.root / str(release_id)

    def version_dir(self, release_id: uuid.UUID, version: int) -> Path:
        return self.release_dir(release_id) / f"v{version}"

    def work_dir(self, release_id: uuid.UUID) -> Path:
        """Where a release's runs write (``.tmp-v<N>-*``) and its removals rename to
        (``.trash-*``): under :data:`WORK_DIR`, listed alone by the sweeper."""
        return self.root / WORK_DIR / str(release_id)

    def begin(self, release_id: uuid.UUID, version: int) -> Path:
        """A fresh temporary directory for writing ``version`` (stale ones are removed,
        also those of this version that a release stored beside its versions before
        :data:`WORK_DIR`)."""
        base = self.work_dir(release_id)
        base.mkdir(parents=True, exist_ok=True)
        pattern = f".tmp-v{version}-*"
        for stale in _listed(base, pattern) + _listed(self.release_dir(release_id), pattern):
            self._remove(release_id, stale)
        work = base / f".tmp-v{version}-{uuid.uuid4().hex[:8]}"
        work.mkdir(parents=True)  # the work directory again if a discard removed it
        return work

    def publish(self, release_id: uuid.UUID, version: int, work: Path) -> Path:
        """Move a completed temporary directory into place as ``version``."""
        final = self.version_dir(release_id, version)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._remove(release_id, final)  # a version of this run moved into place before
        work.rename(final)
        _remove_if_empty(work.parent)
        return final

    def discard(self, work: Path) -> None:
        """Remove a run's temporary directory (or an unpublished version, or what a
        removal cut short), and the directory that held it if that leaves it empty: a
        release cancelled during its first synthesis left an empty directory behind (one
        in thirty of a soak run's releases). ``rmdir`` removes only an empty directory,
        so a version or another run's work in it stays; a run beginning meanwhile makes
        the directory again."""
        release_id = _release_of(work)
        if release_id is None:  # not a release's: removed in place
            shutil.rmtree(work, ignore_errors=True)
        else:
            self._remove(release_id, work)
        _remove_if_empty(work.parent)

    def prune(self, release_id: uuid.UUID, *keep_versions: int) -> None:
        """Remove versions other than ``keep_versions`` (after a re-synthesis succeeded)."""
        base = self.release_dir(release_id)
        if not base.exists():
            return
        keep = {f"v{version}" for version in keep_versions}
        for child in _listed(base, "*"):
            if child.name not in keep and not child.name.startswith(".tmp-"):
                # a version, or what a removal cut short left (beside the versions
                # before WORK_DIR)
                self._remove(release_id, child)

    def remove_versions(self, release_id: uuid.UUID, through: int) -> int:
        """Remove the release's versions ``v0`` to ``v<through>`` (its files deleted by its
        curator), and its directory if that leaves it empty; returns how many were there.
        Versions only grow, so a later run (``through + 1`` on) that publishes meanwhile is
        never touched; nor is a run's work, which is not kept here."""
        removed = [version for version in self.versions(release_id) if version <= through]
        for version in removed:
            self._remove(release_id, self.version_dir(release_id, version))
        _remove_if_empty(self.release_dir(release_id))
        return len(removed)

    def leftovers(
        self, *, legacy: bool = False
    ) -> tuple[list[tuple[uuid.UUID, int, Path]], list[Path]]:
        """In one listing of :data:`WORK_DIR`: every run's temporary directory, as
        ``(release id, version, path)``, and every ``.trash-*`` directory (what a removal
        that a dead process cut short left; nothing reads one, and deleting one that a
        live removal is deleting too is harmless, as both ignore what the other took).
        With ``legacy``, every release's directory is listed too (where releases stored
        before :data:`WORK_DIR` kept them): one listing per release ever published."""
        work_dirs: list[tuple[uuid.UUID, int, Path]] = []
        trash: list[Path] = []
        if not self.root.exists():
            return work_dirs, trash
        bases = _listed(self.root / WORK_DIR, "*")
        if legacy:
            bases += [base for base in _listed(self.root, "*") if base.name != WORK_DIR]
        for base in bases:
            for entry in _listed(base, ".*"):
                if entry.name.startswith(".trash-"):
                    trash.append(entry)
                    continue
                if not entry.name.startswith(".tmp-v") or "-" not in entry.name[6:]:
                    continue
                try:
                    release_id = uuid.UUID(base.name)
                    version = int(entry.name.removeprefix(".tmp-v").split("-", 1)[0])
                except ValueError:
                    continue
                work_dirs.append((release_id, version, entry))
        return work_dirs, trash

    def versions(self, release_id: uuid.UUID) -> list[int]:
        """The versions the release has on disk (its ``v<N>`` directories), in order."""
        found = []
        for entry in _listed(self.release_dir(release_id), "v*"):
            number = entry.name[1:]
            if number.isdecimal() and entry.is_dir():
                found.append(int(number))
        return sorted(found)

    def disk_bytes(self, release_id: uuid.UUID, *versions: int) -> int:
        """The bytes the files of these versions take on disk (``du``'s count: allocated
        blocks, or the length where larger); a missing version counts 0."""
        total = 0
        for version in versions:
            for path in _listed(self.version_dir(release_id, version), "**/*"):
                with contextlib.suppress(OSError):
                    stat = path.stat()
                    if path.is_file():
                        total += max(stat.st_size, stat.st_blocks * 512)
        return total

    def path(self, release_id: uuid.UUID, version: int, name: str) -> Path:
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad artifact name {name!r}")
        return self.version_dir(release_id, version) / name

    def _remove(self, release_id: uuid.UUID, path: Path) -> None:
        """Remove a version or a run's directory: first renamed out of the way (atomic),
        into the release's :meth:`work_dir`, then deleted. ``rmtree`` unlinks the files
        before the directory, so a reader that loaded some files of a version being
        removed and then found the directory still there took the missing ones as never
        written (a moments release's bootstrap replicates: answers without a standard
        error). Renamed, the directory is gone at once; what is left of it (``.trash-*``,
        if the process dies meanwhile) goes with the sweeper's next pass
        (:func:`app.releases.stages.remove_stale_work`)."""
        if not path.exists():
            return
        into = self.work_dir(release_id)
        for _ in range(_RENAME_TRIES):
            try:
                into.mkdir(parents=True, exist_ok=True)
            except OSError:
                into = path.parent
            trash = into / f".trash-{uuid.uuid4().hex}"
            try:
                path.rename(trash)
                break
            except FileNotFoundError:
                if not path.exists():  # removed meanwhile
                    return
                # ``into`` was: another process removes it whenever it finds it empty
                # (a discard, a publish, the sweeper's pass), maybe between the mkdir and
                # the rename; read as the path gone, a pruned version stayed on disk
                continue
            except OSError:  # not renamed (permissions, a mount point): removed in place
                shutil.rmtree(path, ignore_errors=True)
                return
        else:
            shutil.rmtree(path, ignore_errors=True)
            return
        shutil.rmtree(trash, ignore_errors=True)
        _remove_if_empty(into)


#: Renames a removal tries into its release's work directory, made again each time, before
#: it removes the path in place (that directory removed each time in between by others).
_RENAME_TRIES = 3


def _release_of(path: Path) -> uuid.UUID | None:
    """The release whose directory (its versions', or its :data:`WORK_DIR` one) holds
    ``path``."""
    try:
        return uuid.UUID(path.parent.name)
    except ValueError:
        return None


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


def _listed(folder: Path, pattern: str) -> list[Path]:
    """``folder``'s entries matching ``pattern``; none if ``folder`` is gone (a discard
    removes a release's directory once it is empty, maybe while this lists it)."""
    try:
        return list(folder.glob(pattern))
    except FileNotFoundError:
        return []
