"""A Parquet upload is validated one row group at a time, not read ahead whole."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.fernet import Fernet

from app.core.errors import InvalidUpload
from app.datasets import validation
from app.datasets.schemas import ContinuousColumn
from app.storage import spool as spool_module
from app.storage import tables
from app.storage.spool import EncryptedSpool
from tests.storage.helpers import stored_row_groups

GROUP_ROWS = 2048
GROUPS = 48
COLUMNS = 4
KEY = Fernet.generate_key()


def test_a_parquet_upload_is_read_one_row_group_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow's ``pre_buffer`` (on by default) read every row group of the uploaded file
    ahead and kept it until the reader closed, so the check held the whole file (an upload
    of 10^7 rows as a 200 MB Parquet file rose by 345 MiB, 170 without it). The spool's
    reads are Python allocations, which ``tracemalloc`` counts exactly (no RSS
    measurement): at every batch written what is held stays within a few row groups
    (about 3 here; 59, more than the file, with ``pre_buffer``)."""
    values = np.random.default_rng(0).uniform(0, 1, size=(GROUPS * GROUP_ROWS, COLUMNS))
    names = [f"x{j}" for j in range(COLUMNS)]
    raw = io.BytesIO()
    pq.write_table(
        pa.table({name: values[:, j] for j, name in enumerate(names)}),
        raw,
        row_group_size=GROUP_ROWS,
        compression="none",
    )
    # small spool chunks: the reader's one decrypted chunk is no part of what is measured
    monkeypatch.setattr(spool_module, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(spool_module, "_RECORD", 12 + 4096 + 16)
    spool = EncryptedSpool(tmp_path / "spool")
    spool.write(raw.getvalue())
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", GROUP_ROWS)
    held: list[int] = []
    writer_class = validation.EncryptedTableWriter

    class Recording(writer_class):  # type: ignore[misc, valid-type]
        def write(self, batch: Any) -> None:
            held.append(tracemalloc.get_traced_memory()[0] - start)
            super().write(batch)

    monkeypatch.setattr(validation, "EncryptedTableWriter", Recording)
    columns = [ContinuousColumn(name=name, kind="continuous", lower=0, upper=1) for name in names]
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        with spool.open() as reader:
            stored = validation.validate_and_store(
                reader, spool.size, list(columns), "reject", tmp_path / "t.parquet", KEY
            )
    finally:
        tracemalloc.stop()
        spool.remove()
    assert stored.n_rows == GROUPS * GROUP_ROWS
    assert len(held) == GROUPS
    group_bytes = GROUP_ROWS * COLUMNS * 8
    assert max(held) < 8 * group_bytes, (held[:3], len(raw.getvalue()))


def test_csv_block_grows_with_the_declared_columns() -> None:
    assert validation.csv_block_bytes(3) == 4 << 20
    assert validation.csv_block_bytes(128) == 4 << 20
    assert validation.csv_block_bytes(2000) == 2000 * (32 << 10)  # 62.5 MiB: ~2000 rows


def _row_groups(path: Path) -> list[int]:
    return stored_row_groups(path, KEY)


@pytest.mark.parametrize("rows", [1000, 300, 7])
def test_small_csv_blocks_are_gathered_into_whole_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """Each block the CSV reader parsed was written as a row group of its own (285 rows at
    d = 2000); validated rows are now gathered to tables.batch_rows(d) a row group, the
    last one shorter. Scaled down: blocks of 1 KiB (about 40 rows), row groups of 256."""
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES", 1 << 10)
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES_PER_COLUMN", 0)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 256)
    values = np.round(np.random.default_rng(rows).uniform(0, 1, size=(rows, COLUMNS)), 3)
    names = [f"x{j}" for j in range(COLUMNS)]
    text = ",".join(names) + "\n" + "".join(",".join(map(str, row)) + "\n" for row in values)
    columns = [ContinuousColumn(name=name, kind="continuous", lower=0, upper=1) for name in names]
    destination = tmp_path / "t.parquet"
    stored = validation.validate_and_store(
        io.BytesIO(text.encode()), len(text), list(columns), "reject", destination, KEY
    )
    assert stored.n_rows == rows
    assert _row_groups(destination) == [256] * (rows // 256) + ([rows % 256] if rows % 256 else [])
    parquet = tables.open_table(destination, KEY)
    try:
        table = parquet.read()
    finally:
        parquet.close()
    stored_values = np.column_stack([table.column(name).to_numpy() for name in names])
    np.testing.assert_array_equal(stored_values, 2.0 * values - 1.0)


def test_a_csv_with_problems_after_whole_row_groups_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES", 1 << 10)
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES_PER_COLUMN", 0)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 64)
    names = [f"x{j}" for j in range(COLUMNS)]
    lines = [",".join(names)] + [",".join(["0.5"] * COLUMNS)] * 500 + [",".join(["2"] * COLUMNS)]
    text = "\n".join(lines) + "\n"
    columns = [ContinuousColumn(name=name, kind="continuous", lower=0, upper=1) for name in names]
    destination = tmp_path / "t.parquet"
    with pytest.raises(InvalidUpload):
        validation.validate_and_store(
            io.BytesIO(text.encode()), len(text), list(columns), "reject", destination, KEY
        )
    assert not destination.exists()


def _with_stated_rows(content: bytes, actual: int, stated: int) -> bytes:
    """``content`` (a Parquet file of one row group of ``actual`` rows) with the file's
    total in its footer rewritten to ``stated`` (field 3 of FileMetaData, a zigzag varint
    of the same length); the row group keeps its own count, which readers decode."""
    raw = bytearray(content)
    length = int.from_bytes(raw[-8:-4], "little")
    start = len(raw) - 8 - length

    def varint(value: int) -> bytes:
        value = value << 1  # zigzag of a positive number
        out = bytearray()
        while True:
            byte, value = value & 0x7F, value >> 7
            out.append(byte | 0x80 if value else byte)
            if not value:
                return bytes(out)

    old, new = varint(actual), varint(stated)
    assert len(old) == len(new)
    footer = raw[start : start + length]
    at = footer.find(b"\x16" + old)  # field 3 after field 2, type i64
    assert at >= 0
    footer[at + 1 : at + 1 + len(old)] = new
    raw[start : start + length] = footer
    return bytes(raw)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_the_cell_cap_counts_the_rows_decoded(tmp_path: Path, fmt: str) -> None:
    """The cap reads the row groups' counts, not the file's stated total (the review's
    file stated 8192 rows and held 10^6), and the rows decoded are counted too (a CSV, which
    has no footer)."""
    rows = 20_000
    names = [f"x{j}" for j in range(COLUMNS)]
    columns = [ContinuousColumn(name=name, kind="continuous", lower=0, upper=1) for name in names]
    if fmt == "parquet":
        sink = io.BytesIO()
        pq.write_table(pa.table({n: np.zeros(rows) for n in names}), sink, row_group_size=rows)
        content = _with_stated_rows(sink.getvalue(), rows, 8192)
        assert pq.ParquetFile(io.BytesIO(content)).metadata.num_rows == 8192
    else:
        content = (",".join(names) + "\n" + "0,0,0,0\n" * rows).encode()
    destination = tmp_path / "t.parquet"

    def store(cells: int) -> validation.StoredTable:
        return validation.validate_and_store(
            io.BytesIO(content),
            len(content),
            list(columns),
            "reject",
            destination,
            KEY,
            filename=f"t.{fmt}",
            max_cells=cells,
        )

    with pytest.raises(InvalidUpload, match=f"more than {COLUMNS * 10_000} cells"):
        store(COLUMNS * 10_000)
    assert not destination.exists()
    assert store(COLUMNS * rows).n_rows == rows
