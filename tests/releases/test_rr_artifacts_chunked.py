"""randomized_response writes its sample a chunk of rows at a time: the same files, value
for value (the CSV byte for byte), as the whole table written at once."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from app.releases import registry
from app.releases.adapters import randomized_response as adapter
from app.releases.registry import ColumnInfo, DatasetInfo
from app.storage.tables import batch_rows

#: Every kind of column a release decodes: categories (text), 0/1, a continuous column's
#: cell midpoints (original units), and a public column released as stored.
COLUMNS = (
    ColumnInfo("blood", "categorical", categories=("A", "B", "AB", "O")),
    ColumnInfo("smoker", "binary"),
    ColumnInfo("age", "continuous", lower=0.0, upper=100.0),
    ColumnInfo("movie", "public"),
)


class _Stored:
    """The stored rows as the measure stage's source hands them over (``codes()``)."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(n)
        self.n_rows, self.n_cols = n, len(COLUMNS)
        self.table = pa.table(
            {
                "blood": rng.integers(0, 4, n).astype(np.int32),
                "smoker": rng.integers(0, 2, n).astype(np.int8),
                "age": rng.uniform(-1, 1, n),
                "movie": rng.choice(["m1", "m2", "a longer title, with a comma"], n),
            }
        )

    def codes(self) -> Iterator[pa.RecordBatch]:
        yield from self.table.to_batches(max_chunksize=100)


def _release(n: int) -> tuple[DatasetInfo, dict[str, object]]:
    info = DatasetInfo(n_rows=n, columns=COLUMNS)
    mechanism = registry.get("randomized_response")
    params = mechanism.parse_params({"bits": 3})
    measured = mechanism.measure(_Stored(n), info, 1.0, 0.0, params)  # type: ignore[arg-type]
    return info, measured.payload


@pytest.mark.parametrize("n", [1000, 64, 7, 1])
def test_chunked_sample_equals_the_whole_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """The sample was decoded and written as one table (every row's categories as Python
    strings, its Arrow table and Parquet's buffers at once, beside the n codes); it is now
    written sample_chunk_rows (read when the synthesis runs) rows at a time."""
    info, payload = _release(n)
    mechanism = registry.get("randomized_response")
    params = mechanism.parse_params({"bits": 3})
    asked: list[int] = []
    monkeypatch.setattr(adapter, "sample_chunk_rows", lambda width: asked.append(width) or 64)
    whole, chunked = tmp_path / "whole", tmp_path / "chunked"
    whole.mkdir()
    chunked.mkdir()
    seen: list[float] = []
    rng = np.random.default_rng(0)
    synthesized = mechanism.synthesize(payload, info, params, rng, chunked, seen.append)
    assert {"sample.csv", "sample.parquet"} <= set(synthesized.artifacts)
    assert asked == [4]  # 3 perturbed columns and the public one
    # what synthesize wrote before: the whole table at once
    table = adapter.RandomizedResponse()._decoded_table(mechanism.load(payload, info, whole), info)
    assert table.num_rows == n
    pacsv.write_csv(table, whole / "sample.csv")
    pq.write_table(table, whole / "sample.parquet")
    assert (chunked / "sample.csv").read_bytes() == (whole / "sample.csv").read_bytes()
    before = pq.ParquetFile(whole / "sample.parquet")
    after = pq.ParquetFile(chunked / "sample.parquet")
    assert after.schema_arrow == before.schema_arrow
    assert after.schema_arrow.metadata == before.schema_arrow.metadata
    assert after.read().equals(before.read())
    groups = [after.metadata.row_group(i).num_rows for i in range(after.num_row_groups)]
    chunks = -(-n // 64)
    assert groups == [64] * (n // 64) + ([n % 64] if n % 64 else [])
    assert len(seen) == chunks
    assert all(a < b for a, b in itertools.pairwise(seen))
    assert seen[-1] == 1.0


def test_sample_chunk_rows_is_the_storage_batch_without_its_cap() -> None:
    assert adapter.sample_chunk_rows(4) == batch_rows(4, capped=False) == (64 << 20) // 32
    assert adapter.sample_chunk_rows(1) > 65_536  # above the storage's row cap
