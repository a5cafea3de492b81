"""Helpers of the storage tests."""

from __future__ import annotations

from pathlib import Path

from app.storage import tables


def stored_row_groups(path: Path, key: bytes) -> list[int]:
    """The rows of each row group of the encrypted table at ``path``."""
    parquet = tables.open_table(path, key)
    try:
        return [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
    finally:
        parquet.close()
