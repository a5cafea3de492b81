"""smooth_synthetic writes its sample and support a chunk of rows at a time: the same
files, value for value (the CSV byte for byte), as the whole table written at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from app.releases.adapters import smooth_synthetic as adapter
from app.releases.registry import ColumnInfo, DatasetInfo

#: smooth_synthetic releases continuous columns only (its column_kinds), and to_original
#: is the affine map of every column: no categorical or integer rounding to keep. Bounds
#: of several kinds: integral, negative, fractional, a tiny range and a huge one.
INFO = DatasetInfo(
    n_rows=1000,
    columns=(
        ColumnInfo("age", "continuous", 0.0, 120.0),
        ColumnInfo("delta", "continuous", -5.0, 5.0),
        ColumnInfo("rate", "continuous", 0.001, 0.0015),
        ColumnInfo("income", "continuous", -1e9, 3e12),
        ColumnInfo("weight_kg", "continuous", 2.5, 250.25),
    ),
)


def _whole(
    info: DatasetInfo, workdir: Path, stem: str, X: np.ndarray, w: np.ndarray | None
) -> None:
    """What _write_artifacts did before: the whole table at once."""
    original = info.to_original(X)
    columns = {name: original[:, j] for j, name in enumerate(info.names)}
    table = pa.table(columns if w is None else {**columns, "weight": w})
    pacsv.write_csv(table, workdir / f"{stem}.csv")
    pq.write_table(table, workdir / f"{stem}.parquet")


@pytest.mark.parametrize("n", [1000, 7, 1, 0])
@pytest.mark.parametrize("weighted", [False, True])
def test_chunked_files_equal_the_whole_table(tmp_path: Path, n: int, weighted: bool) -> None:
    rng = np.random.default_rng(n)
    points = rng.uniform(-1, 1, size=(37, INFO.d))
    points[0] = -1.0
    points[1] = 1.0
    X = points[rng.integers(0, 37, size=n)] if n else np.empty((0, INFO.d))
    w = rng.dirichlet(np.ones(n)) if weighted and n else (np.empty(0) if weighted else None)
    whole, chunked = tmp_path / "whole", tmp_path / "chunked"
    whole.mkdir()
    chunked.mkdir()
    _whole(INFO, whole, "t", X, w)
    # 1000 rows in chunks of 64: 15 whole ones and a partial last one of 40
    adapter._write_rows(INFO, chunked, "t", X, w, chunk_rows=64)
    assert (chunked / "t.csv").read_bytes() == (whole / "t.csv").read_bytes()
    before, after = pq.ParquetFile(whole / "t.parquet"), pq.ParquetFile(chunked / "t.parquet")
    assert after.schema_arrow == before.schema_arrow
    assert after.schema_arrow.metadata == before.schema_arrow.metadata
    assert after.read().equals(before.read())
    assert after.metadata.num_rows == n
    if n == 1000:
        assert [after.metadata.row_group(i).num_rows for i in range(after.num_row_groups)] == (
            [64] * 15 + [40]
        )


def _groups(path: Path) -> list[int]:
    metadata = pq.ParquetFile(path).metadata
    return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


def test_write_artifacts_chunks_by_sample_chunk_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default chunk is sample_chunk_rows of the columns and the weight (about 64 MiB
    of float64, no cap of 65,536 rows): here 3 rows."""
    asked: list[int] = []
    monkeypatch.setattr(adapter, "sample_chunk_rows", lambda d: asked.append(d) or 3)
    rng = np.random.default_rng(0)
    X, points = rng.uniform(-1, 1, (10, INFO.d)), rng.uniform(-1, 1, (4, INFO.d))
    adapter._write_artifacts(INFO, tmp_path, X, points, np.full(4, 0.25), {}, "")
    assert asked == [INFO.d + 1, INFO.d + 1]
    assert _groups(tmp_path / "sample.parquet") == [3, 3, 3, 1]
    assert _groups(tmp_path / "support.parquet") == [3, 1]


def test_sample_chunks_are_64_mib_uncapped() -> None:
    assert adapter.sample_chunk_rows(1) == 8 << 20  # 64 MiB of one float64 column
    assert adapter.sample_chunk_rows(51) == (64 << 20) // (8 * 51)  # 164,482 > 65,536
    assert adapter.sample_chunk_rows(10**6) == 1024


def test_a_released_column_named_weight_keeps_its_values(tmp_path: Path) -> None:
    """The support files' weights went into a column "weight", which replaced a released
    column of that name (its values lost); they go into "support_weight" then."""
    info = DatasetInfo(
        n_rows=10,
        columns=(
            ColumnInfo("weight", "continuous", 40.0, 120.0),
            ColumnInfo("support_weight", "continuous", 0.0, 1.0),
        ),
    )
    assert adapter.weight_column(["age"]) == "weight"
    assert adapter.weight_column(info.names) == "support_weight_2"
    assert adapter.weight_column(["weight"]) == "support_weight"
    points = np.array([[-1.0, 1.0], [1.0, -1.0]])
    synthesized = adapter._write_artifacts(
        info, tmp_path, points, points, np.array([0.25, 0.75]), {}, ""
    )
    support = pq.read_table(tmp_path / "support.parquet")
    assert support.column_names == ["weight", "support_weight", "support_weight_2"]
    assert support.column("weight").to_pylist() == [40.0, 120.0]  # the data's, in kg
    assert support.column("support_weight_2").to_pylist() == [0.25, 0.75]
    text = pacsv.read_csv(tmp_path / "support.csv")
    assert text.column_names == support.column_names
    assert [text.column(c).to_pylist() for c in text.column_names] == [
        support.column(c).to_pylist() for c in support.column_names
    ]
    assert "'support_weight_2'" in synthesized.artifacts["support.csv"].description
