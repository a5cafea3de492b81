"""Encrypted tables at rest: a pass over the rows holds one row group at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from cryptography.fernet import Fernet
from numpy.testing import assert_array_equal

from app.storage import tables
from app.storage.source import EncryptedTableSource

GROUP_ROWS = 2048
GROUPS = 48
COLUMNS = 4


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, bytes, np.ndarray]:
    """An encrypted table of ``GROUPS`` row groups of random (incompressible) values."""
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", GROUP_ROWS)
    key = Fernet.generate_key()
    values = np.random.default_rng(0).uniform(-1, 1, size=(GROUPS * GROUP_ROWS, COLUMNS))
    schema = pa.schema([pa.field(f"x{j}", pa.float64(), nullable=False) for j in range(COLUMNS)])
    path = tmp_path / "table.parquet"
    writer = tables.EncryptedTableWriter(path, schema, key)
    for start in range(0, values.shape[0], GROUP_ROWS):
        block = values[start : start + GROUP_ROWS]
        writer.write(
            pa.RecordBatch.from_arrays(
                [pa.array(block[:, j]) for j in range(COLUMNS)], schema=schema
            )
        )
    writer.close()
    assert tables.open_table(path, key).metadata.num_row_groups == GROUPS
    return path, key, values


def test_a_pass_holds_one_row_group_not_the_file(stored: tuple[Path, bytes, np.ndarray]) -> None:
    """pyarrow's ``pre_buffer`` (on by default) read every row group ahead into a cache
    kept until the reader closed: by the last batch a pass held the whole compressed file
    (420 MB at 10^7 rows, ``bench/results/large_table.md``). Arrow's allocations are
    counted exactly, so this is no RSS measurement: at every batch the live Arrow memory
    stays within a few row groups (about 4 here; the file is ``GROUPS`` = 48 of them, and
    with ``pre_buffer`` the last batch held 58)."""
    path, key, values = stored
    group_bytes = GROUP_ROWS * COLUMNS * 8
    before = pa.total_allocated_bytes()
    held = []
    names = [f"x{j}" for j in range(COLUMNS)]
    source = EncryptedTableSource(path, key, names, values.shape[0], batch_rows=GROUP_ROWS)
    parts = []
    for batch in source.batches():
        held.append(pa.total_allocated_bytes() - before)
        parts.append(batch)
    np.testing.assert_array_equal(np.concatenate(parts), values)  # every row, in order
    assert len(held) == GROUPS
    assert max(held) < 8 * group_bytes, (max(held), path.stat().st_size)


def _matrix(table: pa.Table) -> np.ndarray:
    return np.column_stack([table.column(j).to_numpy() for j in range(table.num_columns)])


def _read(path: Path, key: bytes) -> tuple[pa.Table, int]:
    parquet = tables.open_table(path, key)
    try:
        return parquet.read(), parquet.metadata.num_row_groups
    finally:
        parquet.close()


def test_a_key_ring_wraps_with_its_first_key_and_opens_with_any(
    stored: tuple[Path, bytes, np.ndarray], tmp_path: Path
) -> None:
    """A file written under ``old`` opens with a ring that holds it; one written with a
    ring is wrapped with its first key only."""
    path, old, values = stored
    new = Fernet.generate_key()
    ring = tables.key_ring(new, [old])
    assert tables.current_key(ring) == new
    assert tables.key_ring(new, [new, old]) == ring  # a repeat of the current key is dropped
    assert tables.opens_with(path, ring)
    assert not tables.opens_with(path, new)
    assert_array_equal(_matrix(_read(path, ring)[0]), values)
    written = tmp_path / "new.parquet"
    writer = tables.EncryptedTableWriter(written, pa.schema([("x", pa.float64())]), ring)
    writer.write(pa.record_batch([pa.array([0.5])], names=["x"]))
    writer.close()
    assert tables.opens_with(written, new)
    assert not tables.opens_with(written, old)


def test_rotate_re_encrypts_under_the_new_key(
    stored: tuple[Path, bytes, np.ndarray],
) -> None:
    """The rotated file opens with the new key alone, not the old; its rows, schema and
    row groups are the old file's; nothing is left beside it."""
    path, old, values = stored
    before, groups = _read(path, old)
    new = Fernet.generate_key()
    tables.rotate(path, old, new)
    assert tables.opens_with(path, new)
    assert not tables.opens_with(path, old)
    after, after_groups = _read(path, new)
    assert after.equals(before)
    assert after.schema.equals(before.schema, check_metadata=True)
    assert after_groups == groups
    assert_array_equal(_matrix(after), values)
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_rotate_runs_before_replace_between_the_copy_and_the_rename(
    stored: tuple[Path, bytes, np.ndarray],
) -> None:
    """``before_replace`` (where the caller records the new key) runs once the copy is
    written beside the file and before it replaces it; if it raises, the file stays as
    it was and the copy is removed."""
    path, old, _ = stored
    content = path.read_bytes()
    new = Fernet.generate_key()
    seen: list[tuple[bool, list[str]]] = []

    def record() -> None:
        names = sorted(p.name for p in path.parent.iterdir())
        seen.append((tables.opens_with(path, old), names))

    tables.rotate(path, old, new, before_replace=record)
    ((old_in_place, names),) = seen
    assert old_in_place
    assert len(names) == 2
    assert names[1].endswith(tables.ROTATING_SUFFIX)
    assert tables.opens_with(path, new)

    class Refused(Exception):
        pass

    def refuse() -> None:
        raise Refused

    content = path.read_bytes()
    with pytest.raises(Refused):
        tables.rotate(path, new, Fernet.generate_key(), before_replace=refuse)
    assert path.read_bytes() == content
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_rotate_leaves_a_file_no_key_opens_and_a_removed_one_removed(
    stored: tuple[Path, bytes, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, old, _ = stored
    content = path.read_bytes()
    strangers = tables.key_ring(Fernet.generate_key(), [Fernet.generate_key()])
    with pytest.raises(PermissionError, match="no key of CURATOR_DATA_KEY"):
        tables.rotate(path, strangers, Fernet.generate_key())
    assert path.read_bytes() == content
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    # the dataset's file removed while it was re-encrypted: it is not put back
    written = tables.EncryptedTableWriter.write

    def write_then_remove(self: tables.EncryptedTableWriter, batch: pa.RecordBatch) -> None:
        written(self, batch)
        path.unlink(missing_ok=True)

    monkeypatch.setattr(tables.EncryptedTableWriter, "write", write_then_remove)
    with pytest.raises(FileNotFoundError):
        tables.rotate(path, old, Fernet.generate_key())
    assert list(path.parent.iterdir()) == []


def test_two_rotations_at_once_leave_one_whole_file(
    stored: tuple[Path, bytes, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of the rotation on one file, interleaved row group by row group: each
    writes its own staging file, so the file left is whole (a shared staging name let
    them write into one file)."""
    import threading

    path, old, values = stored
    new = Fernet.generate_key()
    barrier = threading.Barrier(2, timeout=30)
    written = tables.EncryptedTableWriter.write

    def in_step(self: tables.EncryptedTableWriter, batch: pa.RecordBatch) -> None:
        barrier.wait()
        written(self, batch)

    monkeypatch.setattr(tables.EncryptedTableWriter, "write", in_step)
    results: list[BaseException | None] = []

    def run() -> None:
        try:
            results.append(tables.rotate(path, old, new))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [None, None]
    assert_array_equal(_matrix(_read(path, new)[0]), values)
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_rotate_keeps_the_file_when_the_copy_is_short(
    stored: tuple[Path, bytes, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy is checked before it replaces the table: one that lost a row group (a
    writer that failed quietly) is refused, and the table stays as it was, under the old
    key, with nothing left beside it."""
    path, old, _ = stored
    content = path.read_bytes()
    written = tables.EncryptedTableWriter.write
    seen: list[int] = []

    def drop_the_first(self: tables.EncryptedTableWriter, batch: pa.RecordBatch) -> None:
        seen.append(batch.num_rows)
        if len(seen) > 1:
            written(self, batch)

    monkeypatch.setattr(tables.EncryptedTableWriter, "write", drop_the_first)
    with pytest.raises(OSError, match="rows, not"):
        tables.rotate(path, old, Fernet.generate_key())
    assert path.read_bytes() == content
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_rotate_syncs_the_copy_before_it_replaces_the_table(
    stored: tuple[Path, bytes, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy reaches the disk before the rename: a crash right after it must not leave
    the table's name on a file whose contents were never written."""
    import os

    path, old, _ = stored
    calls: list[tuple[str, int]] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        calls.append(("fsync", os.fstat(fd).st_ino))
        fsync(fd)

    def spy_replace(source: object, target: object) -> None:
        assert str(source).endswith(tables.ROTATING_SUFFIX)
        calls.append(("replace", os.stat(source).st_ino))  # type: ignore[arg-type]
        replace(source, target)  # type: ignore[arg-type]

    monkeypatch.setattr(tables.os, "fsync", spy_fsync)
    monkeypatch.setattr(tables.os, "replace", spy_replace)
    tables.rotate(path, old, Fernet.generate_key())
    assert [kind for kind, _ in calls] == ["fsync", "replace"]
    assert calls[0][1] == calls[1][1]  # the staging file, synced, is the one renamed


def test_file_keys_are_sealed_with_the_current_key_and_open_with_any_of_the_ring() -> None:
    """A dataset's file keys are sealed with the service ring's current key alone, open
    with any ring holding that key, and with no other; a file stored before datasets had
    keys of their own opens with the service ring itself."""
    old, new, stranger = (Fernet.generate_key() for _ in range(3))
    file_keys = [tables.new_file_key(), tables.new_file_key()]
    sealed = tables.seal_file_keys(tables.key_ring(new, [old]), file_keys)
    assert tables.sealed_with(new, sealed)
    assert not tables.sealed_with(old, sealed)
    assert tables.unseal_file_keys(tables.key_ring(stranger, [new]), sealed) == file_keys
    with pytest.raises(PermissionError, match="opens this dataset's file key"):
        tables.unseal_file_keys(tables.key_ring(stranger, [old]), sealed)
    ring = tables.key_ring(new, [old])
    assert tables.file_ring(ring, sealed).split(b",") == [*file_keys, new, old]
    assert tables.file_ring(ring, None) == ring


def test_a_source_reads_the_key_again_as_long_as_it_changes(
    stored: tuple[Path, bytes, np.ndarray],
) -> None:
    """A measure's source whose key does not open the file reads the key again
    (``reopen_key``): rotations one after the other may each have replaced the file since
    the last read, so it goes on while the key read changes, and gives up (the key's
    PermissionError) once it reads the same key twice."""
    path, old, values = stored
    stale = [Fernet.generate_key(), Fernet.generate_key()]
    reads = iter([*stale, old])
    source = EncryptedTableSource(
        path, Fernet.generate_key(), ["x0"], len(values), reopen_key=lambda: next(reads)
    )
    assert_array_equal(np.concatenate(list(source.batches()))[:, 0], values[:, 0])
    same = stale[0]
    stuck = EncryptedTableSource(path, same, ["x0"], len(values), reopen_key=lambda: same)
    with pytest.raises(PermissionError):
        list(stuck.batches())
