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

from app.datasets import validation
from app.datasets.schemas import ContinuousColumn
from app.storage import spool as spool_module
from app.storage import tables
from app.storage.spool import EncryptedSpool

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
