"""The format bounds of :mod:`app.storage.sizes` against the bytes the writers produce.

Brute force: tables whose values are the hardest to encode (the longest float texts,
random doubles that no dictionary or compression shrinks, long text with quotes and
formula starts), written as the release stages write them, never larger than the bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from app.storage import sizes
from app.storage.artifacts import write_csv_and_parquet

#: Float64 values with the longest texts pyarrow's CSV writer gives (25 characters: it
#: writes exponents down to -6 as fixed point, ``-0.0000012345678901234567``).
LONG_FLOATS = [
    -1.2345678901234567e-6,
    -1.2345678901234567e-300,
    -2.2250738585072014e-308,
    -1.7976931348623157e308,
    -1.2345678901234568e16,
    -0.00012345678901234567,
    -5e-324,
    float("nan"),
    -float("inf"),
]


def _write(tmp_path: Path, tables: list[pa.Table]) -> tuple[int, int]:
    csv, parquet = tmp_path / "t.csv", tmp_path / "t.parquet"
    write_csv_and_parquet(csv, parquet, iter(tables))
    return csv.stat().st_size, parquet.stat().st_size


@pytest.mark.parametrize(
    ("rows", "columns", "chunk"),
    [(0, 1, 1), (1, 1, 1), (3, 2000, 3), (5000, 3, 700), (40_000, 4, 40_000), (200, 50, 7)],
)
def test_float_tables_stay_within_their_bound(
    tmp_path: Path, rows: int, columns: int, chunk: int
) -> None:
    rng = np.random.default_rng(rows + columns)
    values = rng.standard_normal((rows, columns)) * 10.0 ** rng.integers(-300, 300, (rows, columns))
    values.flat[: min(values.size, len(LONG_FLOATS))] = LONG_FLOATS[: min(values.size, 8)]
    names = [f"column_{j}" for j in range(columns)]
    tables = [
        pa.table({name: values[start : start + chunk, j] for j, name in enumerate(names)})
        for start in range(0, max(rows, 1), chunk)
    ]
    csv, parquet = _write(tmp_path, tables)
    assert csv <= sizes.csv_bytes(rows, [sizes.CSV_FLOAT_CELL] * columns, names)
    assert parquet <= sizes.parquet_bytes(rows, [sizes.PARQUET_FLOAT_CELL] * columns, names, chunk)


def test_the_longest_float_texts_fill_a_csv_cell() -> None:
    """:data:`CSV_FLOAT_CELL` is the longest text and its separator, not less."""
    import io

    import pyarrow.csv as pacsv

    sink = io.BytesIO()
    pacsv.write_csv(pa.table({"x": LONG_FLOATS}), sink)
    longest = max(len(line) for line in sink.getvalue().splitlines()[1:])
    assert longest + 1 == sizes.CSV_FLOAT_CELL


def test_fixed_point_floats_below_one_stay_within_their_bound(tmp_path: Path) -> None:
    """Negative floats of 17 significant digits between 1e-7 and 1e-5 (a continuous
    column declared on a small interval) are written as 25 characters of fixed point,
    the longest text: a whole table of them stays within the CSV bound."""
    rows, columns = 5000, 3
    rng = np.random.default_rng(11)
    values = -(1 + rng.random((rows, columns))) * 1e-6
    names = [f"c{j}" for j in range(columns)]
    csv, _ = _write(tmp_path, [pa.table({n: values[:, j] for j, n in enumerate(names)})])
    assert csv <= sizes.csv_bytes(rows, [sizes.CSV_FLOAT_CELL] * columns, names)


def test_text_and_int_columns_stay_within_their_bound(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    longest = 40
    # distinct long text with quotes and formula starts (quoted, doubled, prefixed)
    words = np.array([f'="{i}"' + '"' * (longest - 4 - len(str(i))) for i in range(20_000)])
    rows = 20_000
    table = pa.table(
        {
            "text": pa.array(rng.permutation(words)),
            "flag": pa.array(rng.integers(0, 2, rows).astype(np.int8)),
            "u": pa.array(rng.integers(0, 2**31 - 1, rows).astype(np.int32)),
        }
    )
    assert max(len(w.encode()) for w in words) <= longest
    csv, parquet = _write(tmp_path, [table])
    names = ["text", "flag", "u"]
    assert csv <= sizes.csv_bytes(
        rows, [sizes.csv_text_cell(longest), 2, sizes.CSV_FLOAT_CELL], names
    )
    assert parquet <= sizes.parquet_bytes(
        rows,
        [sizes.parquet_text_cell(longest), sizes.PARQUET_INT32_CELL, sizes.PARQUET_INT32_CELL],
        names,
    )


def test_npy_and_npz_stay_within_their_bound(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((300, 7)), rng.integers(0, 9, (20, 3, 3))
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "z.npz", a=a, b=b)
    assert (tmp_path / "a.npy").stat().st_size <= sizes.npy_bytes(a.size)
    assert (tmp_path / "z.npz").stat().st_size <= sizes.npz_bytes([a.size, b.size])


@pytest.mark.parametrize("char", ['"', "\\", "a", "é", "\u00ad", "€", "\U0001f600", "\U000e0067"])
def test_json_text_bounds_the_escaped_name(char: str) -> None:
    """``json.dumps`` writes a character of 1-4 UTF-8 bytes as at most 3 bytes each."""
    import json

    for text in (char, char * 200, f"x{char}y"):
        assert len(json.dumps(text).encode()) <= sizes.json_text(text)
