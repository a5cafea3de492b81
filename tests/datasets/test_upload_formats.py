"""File formats a curator uploads: CSV dialects and Parquet types, read as they are meant
or refused with a message that names the problem (never a value) and stores nothing."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from app.storage.tables import open_table
from tests.conftest import Caller
from tests.datasets.helpers import SENTINELS, parquet_bytes, upload, with_columns
from tests.datasets.test_upload import assert_no_raw_values, assert_nothing_stored

COLUMNS: list[dict[str, Any]] = [
    {"name": "x", "kind": "continuous", "lower": 0, "upper": 100},
    {"name": "c", "kind": "categorical", "categories": ["A", "B"]},
    {"name": "b", "kind": "binary"},
]


def stored_rows(
    client: TestClient, dataset_id: str, columns: list[dict[str, Any]] = COLUMNS
) -> dict[str, list[Any]]:
    """The stored table, decrypted by open_table (under EncryptedTableSource), its
    continuous columns mapped back to original units and categories to their labels."""
    services = client.app.state.services  # type: ignore[attr-defined]
    path = services.settings.datasets_dir / f"{dataset_id}.parquet"
    data = open_table(path, services.data_key).read().to_pydict()
    out: dict[str, list[Any]] = {}
    for column in columns:
        values = data[column["name"]]
        if column["kind"] == "continuous":
            lower, upper = column["lower"], column["upper"]
            values = [round(lower + (v + 1) * (upper - lower) / 2, 9) for v in values]
        elif column["kind"] == "categorical":
            values = [column["categories"][i] for i in values]
        out[column["name"]] = values
    return out


def problems_of(response: Any) -> list[dict[str, Any]]:
    """The problems of a refused upload (422 invalid_upload)."""
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_upload"
    return response.json()["error"]["problems"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
@pytest.mark.parametrize("shift", range(4))
def test_quoted_line_ends_are_read_wherever_the_reader_cuts_its_blocks(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch, shift: int, line_end: str
) -> None:
    """A quoted cell may hold a line end (RFC 4180). The reader cuts the file into blocks
    (4 MiB) at line ends; unless told that values may hold them, it cut inside such a cell,
    and a valid file over a block long was refused as "ragged" or "could not be read",
    depending on where the cut fell (found by the file-formats audit, with small blocks).
    (A CRLF inside a quoted cell is left out: cut between its CR and LF, pyarrow drops the
    LF, apache/arrow#51368.)"""
    from app.datasets import validation

    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES", 256)
    columns = [COLUMNS[0], {**COLUMNS[1], "categories": ["A", "B\nA"]}, COLUMNS[2]]
    rows = ["1,A,1"] * shift + ['2,"B\nA",0', "3,A,1"] * 100
    content = (line_end.join(["x,c,b", *rows]) + line_end).encode()
    response = upload(client, curator, content, with_columns(*columns))
    assert response.status_code == 201, response.text
    assert response.json()["n_rows"] == shift + 200
    stored = stored_rows(client, response.json()["id"], columns)
    assert stored["c"] == ["A"] * shift + ["B\nA", "A"] * 100
    assert stored["x"] == [1.0] * shift + [2.0, 3.0] * 100


NOT_UTF8 = (
    "the file is not valid UTF-8 text (Latin-1 or Windows-1252?): save it as UTF-8 (in "
    "Excel: 'CSV UTF-8'), or upload Parquet"
)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("x,c,bé\n1,A,1\n".encode("latin-1"), id="latin-1-header"),
        pytest.param("x,c,b\n1,A,1\n2,B\u2019,0\n".encode("cp1252"), id="cp1252-cell"),
        pytest.param(b"x,c,b\n" + b"1,A,1\n" * 2000 + "1,é,1\n".encode("latin-1"), id="late"),
    ],
)
def test_text_that_is_not_utf8_is_refused_with_what_to_do(
    client: TestClient, curator: Caller, content: bytes
) -> None:
    """A CSV saved as Latin-1 or Windows-1252 (Excel's plain "CSV" on Windows): a byte
    that is not UTF-8 in the header row was a 500 (pyarrow decodes the column names
    lazily, and its UnicodeDecodeError was no read error the service knew); anywhere else
    it was "not valid UTF-8 text", which did not say what to do."""
    response = upload(client, curator, content, with_columns(*COLUMNS))
    assert problems_of(response) == [{"column": None, "problem": NOT_UTF8, "rows": None}]
    assert_nothing_stored(client)


def test_parquet_decimal_columns_are_category_codes_flags_and_identifiers(
    client: TestClient, curator: Caller
) -> None:
    """A decimal column (SQL NUMERIC exports) is read as its text, as a CSV cell is, for a
    categorical, binary or public column: it was refused as "has type decimal128(3, 0);
    expected text or numbers" (or "expected 0/1") although it held just that, while a
    continuous column took it (found by the file-formats audit)."""
    columns = [
        COLUMNS[0],
        {"name": "c", "kind": "categorical", "categories": [1, 2]},
        COLUMNS[2],
        {"name": "p", "kind": "public"},
    ]
    table = pa.table(
        {
            "x": pa.array([Decimal("1.5"), Decimal("2")], type=pa.decimal128(4, 1)),
            "c": pa.array([Decimal("2"), Decimal("1")], type=pa.decimal128(3, 0)),
            "b": pa.array([Decimal("1.0"), Decimal("0.0")], type=pa.decimal128(2, 1)),
            "p": pa.array([Decimal("1007"), Decimal("1008")], type=pa.decimal256(40, 0)),
        }
    )
    response = upload(client, curator, parquet_bytes(table), with_columns(*columns))
    assert response.status_code == 201, response.text
    assert stored_rows(client, response.json()["id"], columns) == {
        "x": [1.5, 2.0],
        "c": [2, 1],
        "b": [1, 0],
        "p": ["1007", "1008"],
    }


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(
            b"x;c;b\r\n1;A;1\r\n",
            "the file is separated by semicolons, not commas (its first line has no comma): "
            "upload comma-separated CSV, with '.' as the decimal mark",
            id="semicolons",
        ),
        pytest.param(
            # Excel's CSV in a locale with a decimal comma: the rows have commas, so the
            # header (one column) and the rows (two) were "a different number of fields"
            b"\xef\xbb\xbfx;c;b\r\n1,5;A;1\r\n",
            "the file is separated by semicolons, not commas (its first line has no comma): "
            "upload comma-separated CSV, with '.' as the decimal mark",
            id="semicolons-decimal-comma",
        ),
        pytest.param(
            b"x\tc\tb\n1.5\tA\t1\n",
            "the file is separated by tabs, not commas (its first line has no comma): "
            "upload comma-separated CSV",
            id="tabs",
        ),
    ],
)
def test_a_file_separated_by_semicolons_or_tabs_is_refused_as_such(
    client: TestClient, curator: Caller, content: bytes, problem: str
) -> None:
    """Its header read as one column, such a file got every declared column "missing" and
    "does the file start with a header row?", or, with decimal commas in its rows, "some
    rows have a different number of fields" (found by the file-formats audit)."""
    response = upload(client, curator, content, with_columns(*COLUMNS))
    assert problems_of(response) == [{"column": None, "problem": problem, "rows": None}]
    assert_nothing_stored(client)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(
            b"x, c, b\n1,A,1\n",
            {
                (
                    "c",
                    "missing from the file: column 2 of the file has its name but for "
                    "case or surrounding spaces (the names must match exactly)",
                ),
                (
                    "b",
                    "missing from the file: column 3 of the file has its name but for "
                    "case or surrounding spaces (the names must match exactly)",
                ),
            },
            id="spaces-after-commas",
        ),
        pytest.param(
            b'"X","C","B"\n1,A,1\n',
            {
                (
                    name,
                    f"missing from the file: column {i} of the file has its name but for "
                    "case or surrounding spaces (the names must match exactly)",
                )
                for i, name in ((1, "x"), (2, "c"), (3, "b"))
            },
            id="upper-case",
        ),
    ],
)
def test_header_names_that_differ_in_case_or_spaces_are_pointed_out(
    client: TestClient, curator: Caller, content: bytes, expected: set[tuple[str, str]]
) -> None:
    """Header names match the declaration exactly. A header written "x, c, b" or in
    another case got "missing from the file" for the columns it holds, beside "columns
    of the file are not declared", and, when no name matched, "does the file start with a
    header row?" (found by the file-formats audit)."""
    response = upload(client, curator, content, with_columns(*COLUMNS))
    problems = problems_of(response)
    assert {(p["column"], p["problem"]) for p in problems if p["column"]} == expected
    assert not any("header row" in p["problem"] for p in problems)
    assert_nothing_stored(client)


UNDECLARED = (
    "1 column(s) of the file are not declared in the schema (positions [4]): declare them, "
    "or remove them from the file"
)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(b"x,c,b,notes\n1,A,1,n\n", UNDECLARED, id="csv"),
        pytest.param(
            parquet_bytes(
                pa.table(
                    {
                        "x": [1.0],
                        "c": ["A"],
                        "b": [True],
                        "__index_level_0__": pa.array([7]),
                    },
                    metadata={"pandas": '{"index_columns": ["__index_level_0__"]}'},
                )
            ),
            UNDECLARED + " (__index_level_0__ is pandas' index: write the file with "
            "to_parquet(..., index=False))",
            id="pandas-index",
        ),
    ],
)
def test_undeclared_columns_are_refused_with_what_to_do(
    client: TestClient, curator: Caller, content: bytes, problem: str
) -> None:
    """A column the schema does not declare is refused, by position (a file without a
    header row would have its first row quoted back). The message did not say what to do,
    and pandas' index, written as a column __index_level_0__ by to_parquet once rows are
    filtered, went unexplained (found by the file-formats audit)."""
    response = upload(client, curator, content, with_columns(*COLUMNS))
    assert problems_of(response) == [{"column": None, "problem": problem, "rows": None}]
    assert_nothing_stored(client)


RAGGED = (
    "rows with a different number of fields than the header row, the first at rows {rows} "
    "(the header is row 1; a comma in a cell that is not quoted, or a quote left open?)"
)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param(
            [f"{SENTINELS[0]},{SENTINELS[1]}", "2,B,0", f"3,A,1,{SENTINELS[2]}"],
            {"column": None, "problem": RAGGED.format(rows="[2, 4]"), "rows": 2},
            id="fewer-and-more",
        ),
        pytest.param(
            # an unquoted comma in a number, the usual culprit
            ["1,A,1"] * 7 + [f'"{SENTINELS[0]}",A,1', f"1,{SENTINELS[1]},B,0"],
            {"column": None, "problem": RAGGED.format(rows="[10]"), "rows": 1},
            id="comma-in-a-cell",
        ),
        pytest.param(
            # a quote left open swallows the rest of the file into one row
            ["1,A,1", f'2,"B,{SENTINELS[0]}', *["3,A,1"] * 50],
            {"column": None, "problem": RAGGED.format(rows="[3]"), "rows": 1},
            id="quote-left-open",
        ),
        pytest.param(
            # the read stops at the sixth (each costs a Python call), so no count
            ["1,A,1"] * 3 + [f"1,A,1,{SENTINELS[0]}"] * 5000,
            {
                "column": None,
                "problem": RAGGED.format(rows="[5, 6, 7, 8, 9, ...]"),
                "rows": None,
            },
            id="many",
        ),
    ],
)
def test_rows_with_a_different_number_of_fields_are_counted_and_located(
    client: TestClient, curator: Caller, rows: list[str], expected: dict[str, Any]
) -> None:
    """A row with more or fewer fields than the header got "some rows have a different
    number of fields than the header row", for the whole file, which left a curator with
    a million rows nothing to look for (found by the file-formats audit). Row numbers
    are not cell values: they come back, the first five, with the count if there are no
    more."""
    content = ("x,c,b\n" + "\n".join(rows) + "\n").encode()
    response = upload(client, curator, content, with_columns(*COLUMNS))
    assert problems_of(response) == [expected]
    assert_no_raw_values(response.text)
    assert_nothing_stored(client)


def _parquet() -> bytes:
    return parquet_bytes(pa.table({"x": [1.0, 2.0], "c": ["A", "B"], "b": [True, False]}))


@pytest.mark.parametrize(
    ("content", "filename"),
    [
        pytest.param(_parquet()[:4], "d.parquet", id="magic-only"),
        pytest.param(_parquet()[:6], "d.csv", id="six-bytes"),
        pytest.param(_parquet()[: len(_parquet()) // 2], "d.parquet", id="half"),
        pytest.param(_parquet()[:-1], "d.csv", id="last-byte-lost"),
    ],
)
def test_a_truncated_parquet_file_is_refused_as_such(
    client: TestClient, curator: Caller, content: bytes, filename: str
) -> None:
    """A Parquet file cut short (an interrupted copy). Under 8 bytes it was not taken for
    Parquet at all: named .parquet it got "not a Parquet file (it does not start with
    Parquet's magic bytes PAR1)", which it does, and otherwise a CSV reader's complaint
    (found by the file-formats audit)."""
    response = upload(client, curator, content, with_columns(*COLUMNS), filename=filename)
    assert problems_of(response) == [
        {
            "column": None,
            "problem": "the file could not be read as Parquet (is it truncated or corrupt?)",
            "rows": None,
        }
    ]
    assert_nothing_stored(client)


def test_a_parquet_string_column_that_is_not_utf8_is_named(
    client: TestClient, curator: Caller
) -> None:
    """pyarrow reads a Parquet string column without checking its bytes; the check's first
    text function then failed, and the file got a CSV's refusal, "not valid UTF-8 text:
    save it as UTF-8 (in Excel ...)", naming no column (found by the file-formats audit).
    The column is named, and the other columns are still checked."""
    not_utf8 = pa.array([b"A", b"\xff" + SENTINELS[0].encode()]).view(pa.string())
    table = pa.table({"x": [1.0, 200.0], "c": not_utf8, "b": [True, False]})
    response = upload(
        client, curator, parquet_bytes(table), with_columns(*COLUMNS, out_of_bounds="reject")
    )
    assert problems_of(response) == [
        {"column": "x", "problem": "values outside the declared bounds [0.0, 100.0]", "rows": 1},
        {"column": "c", "problem": "text that is not valid UTF-8", "rows": None},
    ]
    assert_no_raw_values(response.text)
    assert_nothing_stored(client)


def test_a_column_without_a_name_is_pointed_out(client: TestClient, curator: Caller) -> None:
    """Some exports end every line with a comma: the header then has a last column with
    no name, which was "not declared in the schema (positions [4])", a column the curator
    could neither see nor declare (found by the file-formats audit)."""
    response = upload(client, curator, b"x,c,b,\n1,A,1,\n", with_columns(*COLUMNS))
    assert problems_of(response) == [
        {
            "column": None,
            "problem": UNDECLARED + " (column 4 has no name: does every line end with a comma?)",
            "rows": None,
        }
    ]
    assert_nothing_stored(client)
