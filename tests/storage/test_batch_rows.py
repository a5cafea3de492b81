"""Batches and row groups of about 64 MiB of float64, whatever the table's width."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from cryptography.fernet import Fernet

from app.storage import tables
from app.storage.source import EncryptedTableSource
from tests.storage.helpers import stored_row_groups

KEY = Fernet.generate_key()


def test_batch_rows_is_64_mib_of_float64_within_1024_and_65536_rows() -> None:
    assert tables.batch_rows(1) == 65_536
    assert tables.batch_rows(128) == 65_536  # exactly 64 MiB
    assert tables.batch_rows(129) == (64 << 20) // (8 * 129)
    assert tables.batch_rows(2000) == 4194  # was 65,536 rows: 1 GiB of float64
    assert tables.batch_rows(8192) == 1024
    assert tables.batch_rows(100_000) == 1024
    for d in (1, 50, 191, 2000, 10_000):
        assert tables.batch_rows(d) * 8 * d <= max(64 << 20, 1024 * 8 * d)


def _write(path: Path, values: np.ndarray, batch: int) -> None:
    names = [f"x{j}" for j in range(values.shape[1])]
    schema = pa.schema([pa.field(name, pa.float64(), nullable=False) for name in names])
    writer = tables.EncryptedTableWriter(path, schema, KEY)
    for start in range(0, values.shape[0], batch):
        block = values[start : start + batch]
        writer.write(
            pa.RecordBatch.from_arrays(
                [pa.array(block[:, j]) for j in range(len(names))], schema=schema
            )
        )
    writer.close()


def _row_groups(path: Path) -> list[int]:
    return stored_row_groups(path, KEY)


def test_wide_tables_are_written_and_read_in_smaller_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scaled down (64 KiB batches, at least 16 rows): 8 columns make 1024-row row groups
    and batches, 2 columns the most (2048 here), however the rows were handed over."""
    monkeypatch.setattr(tables, "BATCH_BYTES", 64 << 10)
    monkeypatch.setattr(tables, "MIN_BATCH_ROWS", 16)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 2048)
    values = np.random.default_rng(0).uniform(-1, 1, size=(5000, 8))
    path = tmp_path / "wide.parquet"
    _write(path, values, 5000)  # one batch of every row
    assert _row_groups(path) == [1024] * 4 + [904]
    names = [f"x{j}" for j in range(8)]
    source = EncryptedTableSource(path, KEY, names, 5000)
    assert source.batch_rows == 1024
    parts = list(source.batches())
    assert [p.shape[0] for p in parts] == [1024] * 4 + [904]
    np.testing.assert_array_equal(np.concatenate(parts), values)
    # two of the columns: wider batches than the row groups stored
    narrow = EncryptedTableSource(path, KEY, names[:2], 5000)
    assert narrow.batch_rows == 2048
    np.testing.assert_array_equal(np.concatenate(list(narrow.batches())), values[:, :2])


def test_files_stored_with_other_row_groups_are_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table written before (65,536-row groups, here 3000) is read in batches of the
    current size, across row group boundaries, every row once and in order; rotation
    keeps its rows."""
    values = np.random.default_rng(1).uniform(-1, 1, size=(7000, 8))
    path = tmp_path / "old.parquet"
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 3000)
    _write(path, values, 7000)
    assert _row_groups(path) == [3000, 3000, 1000]
    monkeypatch.setattr(tables, "BATCH_BYTES", 64 << 10)
    monkeypatch.setattr(tables, "MIN_BATCH_ROWS", 16)
    names = [f"x{j}" for j in range(8)]
    parts = list(EncryptedTableSource(path, KEY, names, 7000).batches())
    assert [p.shape[0] for p in parts] == [1024] * 6 + [856]
    np.testing.assert_array_equal(np.concatenate(parts), values)
    new_key = Fernet.generate_key()
    tables.rotate(path, KEY, new_key)
    rotated = tables.open_table(path, new_key)
    try:
        np.testing.assert_array_equal(
            np.column_stack([c.to_numpy() for c in rotated.read().columns]), values
        )
    finally:
        rotated.close()
