"""Encrypted tables at rest: a pass over the rows holds one row group at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from cryptography.fernet import Fernet

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
