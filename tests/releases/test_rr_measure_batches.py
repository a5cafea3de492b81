"""randomized_response's measure encodes each batch of rows as it reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from cryptography.fernet import Fernet

from app.mechanisms import randomized_response as rr
from app.releases import registry
from app.releases.adapters import randomized_response as adapter
from app.releases.registry import ColumnInfo, DatasetInfo
from app.storage.source import EncryptedTableSource
from app.storage.tables import EncryptedTableWriter

N, BATCH, BITS = 1000, 128, 3


def test_measure_encodes_batch_by_batch_the_codes_of_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every column's cells were gathered for all n rows, concatenated, stacked and then
    encoded (at 10^7 rows of 3 columns, 380 MiB more than the n codes the release needs,
    ``bench/results/large_table.md``); each batch is now encoded as it is read. The
    codes handed to the mechanism are those of the whole table at once, in row order."""
    rng = np.random.default_rng(3)
    category = rng.integers(0, 4, N).astype(np.int32)
    flag = rng.integers(0, 2, N).astype(np.int8)
    value = rng.uniform(-1, 1, N)
    schema = pa.schema(
        [
            pa.field("category", pa.int32(), nullable=False),
            pa.field("flag", pa.int8(), nullable=False),
            pa.field("value", pa.float64(), nullable=False),
        ]
    )
    key = Fernet.generate_key()
    path = tmp_path / "table.parquet"
    writer = EncryptedTableWriter(path, schema, key)
    writer.write(pa.RecordBatch.from_arrays([category, flag, value], schema=schema))
    writer.close()
    info = DatasetInfo(
        n_rows=N,
        columns=(
            ColumnInfo("category", "categorical", categories=("a", "b", "c", "d")),
            ColumnInfo("flag", "binary"),
            ColumnInfo("value", "continuous", lower=0.0, upper=1.0),
        ),
    )
    mechanism = registry.get("randomized_response")
    params = mechanism.parse_params({"bits": BITS})
    encoded: list[int] = []
    released: list[np.ndarray] = []
    encode, release = rr.Domain.encode, rr.release

    def counting_encode(self: rr.Domain, values: Any) -> Any:
        encoded.append(np.asarray(values).shape[0])
        return encode(self, values)

    def keeping_release(codes: Any, *args: Any, **kwargs: Any) -> Any:
        released.append(np.array(codes))
        return release(codes, *args, **kwargs)

    monkeypatch.setattr(rr.Domain, "encode", counting_encode)
    monkeypatch.setattr(adapter.rr, "release", keeping_release)
    source = EncryptedTableSource(path, key, info.names, N, batch_rows=BATCH)
    mechanism.measure(source, info, 1.0, 0.0, params)
    assert max(encoded) <= BATCH
    assert sum(encoded) == N
    monkeypatch.undo()
    cells = np.column_stack([category, flag, rr.discretize(value, BITS)]).astype(np.int64)
    expected = rr.Domain((4, 2, 1 << BITS)).encode(cells)
    (codes,) = released
    np.testing.assert_array_equal(codes, expected)
