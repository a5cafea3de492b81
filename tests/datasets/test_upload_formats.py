"""File formats a curator uploads: CSV dialects and Parquet types, read as they are meant
or refused with a message that names the problem (never a value) and stores nothing."""

from __future__ import annotations

import io
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from app.datasets import service as dataset_service
from app.datasets import validation
from tests.conftest import Caller
from tests.datasets.helpers import (
    SENTINELS,
    parquet_bytes,
    stored_table,
    upload,
    with_columns,
)
from tests.datasets.test_upload import assert_no_raw_values, assert_nothing_stored

COLUMNS: list[dict[str, Any]] = [
    {"name": "x", "kind": "continuous", "lower": 0, "upper": 100},
    {"name": "c", "kind": "categorical", "categories": ["A", "B"]},
    {"name": "b", "kind": "binary"},
]


def stored_rows(
    client: TestClient, dataset_id: str, columns: list[dict[str, Any]] = COLUMNS
) -> dict[str, list[Any]]:
    """The stored table, decrypted with its file key (as EncryptedTableSource does), its
    continuous columns mapped back to original units and categories to their labels."""
    data = stored_table(client, dataset_id).to_pydict()
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
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES", 256)
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES_PER_COLUMN", 0)
    # in a public column: a category may not hold a line end (test_declared_text.py)
    columns = [COLUMNS[0], {"name": "c", "kind": "public"}, COLUMNS[2]]
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
            # old Mac line ends (CR only): the first line ends at the CR, before the
            # decimal comma of the first row
            b"x;c;b\r1,5;A;1\r",
            "the file is separated by semicolons, not commas (its first line has no comma): "
            "upload comma-separated CSV, with '.' as the decimal mark",
            id="semicolons-cr-line-ends",
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
    ("columns", "content"),
    [
        pytest.param([{**COLUMNS[0], "name": "x;y"}], b"x;y\n1\n2\n", id="one-column"),
        pytest.param(
            [COLUMNS[0], {**COLUMNS[1], "name": "c;d"}, COLUMNS[2]],
            b"x,c;d,b\n1,A,1\n2,B,0\n",
            id="comma-separated",
        ),
    ],
)
def test_a_semicolon_in_a_header_name_is_no_separator(
    client: TestClient, curator: Caller, columns: list[dict[str, Any]], content: bytes
) -> None:
    """The semicolon check is on a first line without a comma, and only when two or more
    columns are declared: a one-column file's header has no comma, and a declared name
    may hold a semicolon."""
    response = upload(client, curator, content, with_columns(*columns))
    assert response.status_code == 201, response.text
    assert response.json()["n_rows"] == 2


def _near_miss(position: int) -> str:
    return (
        f"missing from the file: column {position} of the file has its name but for case, "
        "surrounding spaces or Unicode form (NFC/NFD) (the names must match exactly)"
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(
            b"x, c, b\n1,A,1\n",
            {
                (
                    "c",
                    _near_miss(2),
                ),
                (
                    "b",
                    _near_miss(3),
                ),
            },
            id="spaces-after-commas",
        ),
        pytest.param(
            b'"X","C","B"\n1,A,1\n',
            {
                (
                    name,
                    _near_miss(i),
                )
                for i, name in ((1, "x"), (2, "c"), (3, "b"))
            },
            id="upper-case",
        ),
        pytest.param(
            # near misses for the first declared columns, none for the last: still no
            # "does the file start with a header row?"
            b"X,C,q\n1,A,1\n",
            {
                *((name, _near_miss(i)) for i, name in ((1, "x"), (2, "c"))),
                ("b", "missing from the file"),
            },
            id="upper-case-and-one-missing",
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


def test_a_declared_name_is_not_pointed_out_as_another_ones_near_miss(
    client: TestClient, curator: Caller
) -> None:
    """Names are matched exactly, so "x" and "X" may both be declared: a file with only
    "X" misses "x", and "X" (a declared column) is not pointed out as "x" in another case."""
    columns = [*COLUMNS, {**COLUMNS[0], "name": "X"}]
    response = upload(client, curator, b"X,c,b\n1,A,1\n", with_columns(*columns))
    assert problems_of(response) == [
        {"column": "x", "problem": "missing from the file", "rows": None}
    ]
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
        pytest.param(
            # a name that holds pandas' index name but is not it
            b"x,c,b,my__index_level_0__\n1,A,1,n\n",
            UNDECLARED,
            id="not-pandas-index",
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
            # every row ragged: those are the problem, not "the file has no data rows"
            [f"1,{SENTINELS[0]}", f"2,B,0,{SENTINELS[1]}"],
            {"column": None, "problem": RAGGED.format(rows="[2, 3]"), "rows": 2},
            id="all-rows",
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


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"x,c,b,\n1,A,1,\n", id="empty"),
        pytest.param(b"x,c,b, \n1,A,1, \n", id="a-space"),  # a comma and a space
    ],
)
def test_a_column_without_a_name_is_pointed_out(
    client: TestClient, curator: Caller, content: bytes
) -> None:
    """Some exports end every line with a comma: the header then has a last column with
    no name, which was "not declared in the schema (positions [4])", a column the curator
    could neither see nor declare (found by the file-formats audit)."""
    response = upload(client, curator, content, with_columns(*COLUMNS))
    assert problems_of(response) == [
        {
            "column": None,
            "problem": UNDECLARED + " (column 4 has no name: does every line end with a comma?)",
            "rows": None,
        }
    ]
    assert_nothing_stored(client)


READ = {"x": [1.5, 20.0], "c": ["A", "B"], "b": [1, 0]}


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"x,c,b\r1.5,A,1\r20,B,0\r", id="cr-line-ends"),
        pytest.param(b"x,c,b\r\n1.5,A,1\n20,B,0", id="mixed-line-ends-no-last"),
        pytest.param(b'"x","c","b"\n"1.5","A","1"\n"20","B","0"\n', id="quoted"),
        pytest.param(b"b,x,c\n1,1.5,A\n0,20,B\n", id="other-column-order"),
        pytest.param(b"x,c,b\n1.5,A,1\n\n20,B,0\n\n\n", id="blank-lines"),
        pytest.param(b"x,c,b\n 1.5 , A ,\t1\n20,B,0\n", id="spaces-around-cells"),
        pytest.param(b"x,c,b\n15e-1,A,true\n2E1,B,FALSE\n", id="exponents-and-words"),
        pytest.param(b"x,c,b\n+1.50,A,True\n20.,B,False\n", id="plus-and-trailing-point"),
        pytest.param(b"x,c,b\n1.5,A,1.0\n.2e2,B,0.0\n", id="leading-point-and-1.0"),
    ],
)
def test_csv_dialects_and_spellings_are_read_as_written(
    client: TestClient, curator: Caller, content: bytes
) -> None:
    """What the README promises of a CSV: line ends, quoting, any column order, blank
    lines, trimmed cells, number and flag spellings (a BOM and CRLF: test_upload.py)."""
    response = upload(client, curator, content, with_columns(*COLUMNS))
    assert response.status_code == 201, response.text
    assert stored_rows(client, response.json()["id"]) == READ


@pytest.mark.parametrize(
    ("cell", "problem"),
    [
        pytest.param("NA", "non-numeric values", id="NA"),
        pytest.param("null", "non-numeric values", id="null"),
        pytest.param('"1,000"', "non-numeric values", id="thousands-separator"),
        pytest.param("0x10", "non-numeric values", id="hex"),
        pytest.param("-nan", "NaN cells", id="nan"),
        pytest.param("-Infinity", "infinite values", id="infinity"),
        pytest.param("1e400", "infinite values", id="overflow"),
        pytest.param('""', "empty cells", id="quoted-empty"),
    ],
)
def test_a_continuous_cell_must_hold_a_finite_number(
    client: TestClient, curator: Caller, cell: str, problem: str
) -> None:
    """Every row needs a value: a missing one is refused in any spelling (as are NaN and
    infinities), and so is a number with a thousands separator ("cell" is CSV text)."""
    content = f'x,c,b\n"{SENTINELS[0]}",A,1\n{cell},B,0\n'
    response = upload(client, curator, content.encode(), with_columns(*COLUMNS))
    assert problems_of(response) == [{"column": "x", "problem": problem, "rows": 1}]
    assert_no_raw_values(response.text)
    assert_nothing_stored(client)


@pytest.mark.parametrize(
    ("cells", "column", "problem"),
    [
        pytest.param(
            ["yes", "no", "t", "f", "01", "2"],
            "b",
            "values other than 0/1/true/false",
            id="binary",
        ),
        pytest.param(
            ["a", "b", "A.", "AB"],
            "c",
            "values that are not declared categories",
            id="categories-by-exact-text",
        ),
    ],
)
def test_flags_and_categories_take_their_spellings_only(
    client: TestClient, curator: Caller, cells: list[str], column: str, problem: str
) -> None:
    rows = [f"1,{cell},1" if column == "c" else f"1,A,{cell}" for cell in cells]
    content = ("x,c,b\n" + "\n".join(rows) + "\n").encode()
    response = upload(client, curator, content, with_columns(*COLUMNS))
    assert problems_of(response) == [{"column": column, "problem": problem, "rows": len(cells)}]
    assert_nothing_stored(client)


def test_categories_are_matched_by_their_text(client: TestClient, curator: Caller) -> None:
    """ "01" and "1" are two categories, and a category declared as the number 1 is the
    text "1": neither "01" nor "1.0" is it."""
    columns = [COLUMNS[0], {"name": "c", "kind": "categorical", "categories": ["01", 1]}]
    ok = upload(client, curator, b"x,c\n1,01\n2, 1\n3,1\n", with_columns(*columns))
    assert ok.status_code == 201, ok.text
    assert ok.json()["columns"][1]["categories"] == ["01", 1]  # the number stays a number
    assert stored_rows(client, ok.json()["id"], columns)["c"] == ["01", 1, 1]
    refused = upload(client, curator, b"x,c\n1,1.0\n2,001\n", with_columns(*columns))
    assert problems_of(refused) == [
        {"column": "c", "problem": "values that are not declared categories", "rows": 2}
    ]


def test_categories_match_in_unicode_normal_form_c(client: TestClient, curator: Caller) -> None:
    """ "é" is one code point (NFC, what most editors type) or "e" and a combining accent
    (NFD, what macOS file names and some exports hold). A declared category and a cell
    match in either form: both are compared in NFC. Two categories that are one text in
    two forms are refused at the declaration."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    columns = [COLUMNS[0], {"name": "c", "kind": "categorical", "categories": [nfd, "tea"]}]
    ok = upload(client, curator, f"x,c\n1,{nfc}\n2,{nfd}\n3,tea\n".encode(), with_columns(*columns))
    assert ok.status_code == 201, ok.text
    shown = ok.json()["columns"][1]["categories"]
    assert shown == [nfc, "tea"]
    assert stored_rows(client, ok.json()["id"], [COLUMNS[0], {**columns[1], "categories": shown}])[
        "c"
    ] == [nfc, nfc, "tea"]
    both = [COLUMNS[0], {"name": "c", "kind": "categorical", "categories": [nfc, nfd]}]
    refused = upload(client, curator, b"x,c\n1,tea\n", with_columns(*both))
    assert refused.status_code == 422
    assert "different Unicode forms" in refused.text


def test_categories_are_normalised_to_nfc_only(client: TestClient, curator: Caller) -> None:
    """Canonical forms only (NFC): a compatibility character ("\u00b2", the ligature
    "\ufb01") is a text of its own, kept as declared and matched as such; NFKC would
    have shown "m2" and "fi" and refused the cells that hold them."""
    categories = ["m\u00b2", "\ufb01le", "m2"]
    columns = [COLUMNS[0], {"name": "c", "kind": "categorical", "categories": categories}]
    content = "x,c\n1,m\u00b2\n2,\ufb01le\n3,m2\n".encode()
    ok = upload(client, curator, content, with_columns(*columns))
    assert ok.status_code == 201, ok.text
    assert ok.json()["columns"][1]["categories"] == categories
    assert stored_rows(client, ok.json()["id"], columns)["c"] == categories


def test_a_header_name_in_another_unicode_form_is_pointed_out(
    client: TestClient, curator: Caller
) -> None:
    columns = [{**COLUMNS[0], "name": "caf\u00e9"}]
    response = upload(client, curator, "cafe\u0301\n1\n".encode(), with_columns(*columns))
    assert [p["problem"] for p in problems_of(response) if p["column"]] == [_near_miss(1)]
    assert_nothing_stored(client)


def _typed(x: pa.Array, c: pa.Array, b: pa.Array) -> pa.Table:
    return pa.table({"x": x, "c": c, "b": b})


NUMBERS = [1.5, 20.0]
LABELS = ["A", "B"]


@pytest.mark.parametrize(
    ("table", "write"),
    [
        *[
            pytest.param(
                _typed(pa.array([1, 20], type=t), pa.array(LABELS), pa.array([1, 0], type=t)),
                {},
                id=str(t),
            )
            for t in (
                pa.int8(),
                pa.int16(),
                pa.int32(),
                pa.int64(),
                pa.uint8(),
                pa.uint16(),
                pa.uint32(),
                pa.uint64(),
            )
        ],
        *[
            pytest.param(
                _typed(
                    pa.array(np.array(NUMBERS, dtype=dtype)),
                    pa.array(LABELS, type=pa.large_string()),
                    pa.array(np.array([1, 0], dtype=dtype)),
                ),
                {},
                id=str(np.dtype(dtype)),
            )
            for dtype in (np.float16, np.float32, np.float64)
        ],
        pytest.param(
            # a pandas category column is dictionary-encoded, its dictionary strings or ints
            _typed(
                pa.array(NUMBERS).dictionary_encode(),
                pa.array(LABELS).dictionary_encode(),
                pa.array([1, 0]).dictionary_encode(),
            ),
            {},
            id="dictionary",
        ),
        pytest.param(
            _typed(pa.array(NUMBERS), pa.array(LABELS), pa.array([True, False])),
            {"row_group_size": 1, "compression": "none"},
            id="row-groups-uncompressed",
        ),
        *[
            pytest.param(
                _typed(pa.array(NUMBERS), pa.array(LABELS), pa.array([True, False])),
                {"compression": codec},
                id=codec,
            )
            for codec in ("snappy", "gzip", "brotli", "zstd", "lz4")
        ],
    ],
)
def test_parquet_types_and_codecs_are_read(
    client: TestClient, curator: Caller, table: pa.Table, write: dict[str, Any]
) -> None:
    """Integers of every width, floats of every width (half floats too), dictionaries
    (pandas categories), row groups and every codec pyarrow writes, whatever the name of
    the file (it is uploaded as data.csv: the format is read from its first bytes)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, **write)
    response = upload(client, curator, sink.getvalue(), with_columns(*COLUMNS))
    assert response.status_code == 201, response.text
    assert response.json()["validation"]["format"] == "parquet"
    expected = {**READ, "x": [1.0, 20.0]} if pa.types.is_integer(table["x"].type) else READ
    assert stored_rows(client, response.json()["id"]) == expected


@pytest.mark.parametrize(
    ("array", "problem"),
    [
        pytest.param(
            pa.array([datetime(2020, 1, 1)] * 2),
            "has type timestamp[us]; expected numbers",
            id="timestamp",
        ),
        pytest.param(
            pa.array([date(2020, 1, 1)] * 2),
            "has type date32[day]; expected numbers",
            id="date",
        ),
        pytest.param(
            pa.array([[1.0], [2.0]]),
            "has type list<element: double>; expected numbers",
            id="list",
        ),
        pytest.param(
            pa.array([{"v": 1.0}] * 2),
            "has type struct<v: double>; expected numbers",
            id="struct",
        ),
        pytest.param(pa.array([True, False]), "has type bool; expected numbers", id="bool"),
        pytest.param(pa.array([None, 1.0]), "empty cells", id="null"),
    ],
)
def test_parquet_columns_that_are_not_numbers_are_refused_by_type(
    client: TestClient, curator: Caller, array: pa.Array, problem: str
) -> None:
    table = _typed(array, pa.array(LABELS), pa.array([True, False]))
    response = upload(client, curator, parquet_bytes(table), with_columns(*COLUMNS))
    [found] = problems_of(response)
    assert (found["column"], found["problem"]) == ("x", problem)
    assert_nothing_stored(client)


@pytest.mark.parametrize("content", [b"\xef\xbb\xbf", b"\xef\xbb\xbf\r\n\r\n"])
def test_a_file_with_only_a_byte_order_mark_is_empty(
    client: TestClient, curator: Caller, content: bytes
) -> None:
    """What Excel's "CSV UTF-8" writes for an empty sheet: it got "the file has no data
    rows (it is a single line)" (found by the file-formats audit)."""
    response = upload(client, curator, content, with_columns(*COLUMNS))
    assert problems_of(response) == [{"column": None, "problem": "the file is empty", "rows": None}]
    assert_nothing_stored(client)


def _long_cell_files() -> list[Any]:
    long = "A" * 2000  # past MAX_CELL_BYTES, and no category
    rows = 100
    labels = [long] + ["A"] * (rows - 1)
    x, b = pa.array([1.0] * rows), pa.array([True] * rows)
    plain = io.BytesIO()
    pq.write_table(_typed(x, pa.array(labels), b), plain, use_dictionary=False)
    dictionary = pa.DictionaryArray.from_arrays(
        pa.array([0] + [1] * (rows - 1), pa.int32()), pa.array([long, "A"])
    )
    csv = "x,c,b\n" + "".join(f"1,{label},1\n" for label in labels)
    return [
        pytest.param(csv.encode(), "data.csv", id="csv"),
        pytest.param(plain.getvalue(), "data.parquet", id="parquet-plain"),
        pytest.param(parquet_bytes(_typed(x, dictionary, b)), "data.parquet", id="parquet-dict"),
    ]


@pytest.mark.parametrize(("content", "filename"), _long_cell_files())
def test_a_cell_longer_than_the_limit_is_refused_as_such(
    client: TestClient, curator: Caller, content: bytes, filename: str
) -> None:
    """A cell past MAX_CELL_BYTES is refused by its length, counted by rows: one long
    string in a Parquet dictionary decodes to its length times the rows (found by the
    resource-exhaustion audit: a 787-byte file of 200 rows of a 10 MB string took 4 GiB)."""
    response = upload(client, curator, content, with_columns(*COLUMNS), filename=filename)
    assert problems_of(response) == [
        {"column": "c", "problem": "cells longer than 1024 bytes", "rows": 1}
    ]
    assert_nothing_stored(client)


def test_a_batch_decodes_only_the_dictionary_values_it_uses() -> None:
    """Parquet's reader hands each batch of a row group the dictionary read so far, and
    Arrow sizes a decoded batch by its mean value length times the rows: after a batch
    with a bomb's long cells, a batch of short ones asked for 65 GB (resource-exhaustion
    audit). The check gets a dictionary of the values the batch uses."""
    seen: list[pa.Array] = []

    class Spy:
        name = "c"
        arrow_type = pa.int32()

        def process(self, array: pa.Array, problems: validation.Problems) -> pa.Array:
            seen.append(array)
            return pa.nulls(len(array), pa.int32())

    batch = pa.DictionaryArray.from_arrays(
        pa.array([1, None, 2, 1], pa.int32()), pa.array(["A" * 10**6, "A", "B"])
    )
    validation._process(Spy(), batch, validation.Problems())
    [array] = seen
    assert array.dictionary.to_pylist() == ["A", "B"]
    assert array.to_pylist() == ["A", None, "B", "A"]


def test_parquet_text_is_read_as_dictionaries() -> None:
    """Text columns come from the Parquet reader dictionary-encoded, each distinct value
    decoded once a batch, so that a long one is measured before it is repeated per row
    (resource-exhaustion audit: 200 rows of a 10 MB string decoded to 2 GB)."""
    table = _typed(pa.array([1.0, 2.0]), pa.array(["A", "B"]), pa.array(["1", "0"]))
    reader = io.BytesIO(parquet_bytes(table))
    _, batches = validation._open(reader, "parquet", ["x", "c", "b"], validation.RaggedRows())
    [batch] = list(batches)
    assert [pa.types.is_dictionary(t) for t in batch.schema.types] == [False, True, True]


@pytest.mark.parametrize(
    "names",
    [pytest.param(("x", "c", "b"), id="plain"), pytest.param(("x", "c.x", "b.y.z"), id="dotted")],
)
def test_a_row_group_with_too_much_text_is_refused_from_the_footer(
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
    names: tuple[str, str, str],
) -> None:
    """Distinct long strings compress to a few bytes a page and a batch decodes all it
    holds before a cell can be measured (a 100 KB file took 5 GiB): a row group with more
    text in the declared columns than MAX_ROW_GROUP_TEXT_BYTES is refused from its footer,
    before a page is read (resource-exhaustion audit). Numbers do not count.

    ``dotted``: a column name may hold a dot ("c.x"), and Parquet names a leaf by its path,
    dots and all. The footer check matched a leaf to a declared column by the path's first
    dot-separated part ("c"), so a declared "c.x" of any size escaped the bound. It counts,
    as a struct's leaves ("s.t" of a declared "s") still do."""
    monkeypatch.setattr(validation, "MAX_ROW_GROUP_TEXT_BYTES", 1 << 20)
    # 1.2 10^6 cells: over the tests' cell cap (their upload limit is 2 MiB), lifted here
    monkeypatch.setattr(dataset_service, "max_cells", lambda limit: 10**9)
    rows = 400_000  # 2 MB of text (a length and a letter a cell), 3.2 MB of numbers
    columns = [{**column, "name": name} for column, name in zip(COLUMNS, names, strict=True)]
    table = pa.table(
        dict(
            zip(
                names,
                [
                    pa.array([1.0] * rows),
                    pa.array(["A", "B"] * (rows // 2)),
                    pa.array([True] * rows),
                ],
                strict=True,
            )
        )
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, use_dictionary=False, row_group_size=rows)
    response = upload(client, curator, sink.getvalue(), with_columns(*columns), "d.parquet")
    [found] = problems_of(response)
    assert found["problem"].startswith(
        "1 row group(s) of the file hold more than 1 MiB of text in the declared columns: "
        "write it with smaller row groups"
    )
    assert_nothing_stored(client)
    # the same table in row groups within the limit is stored, its names as declared
    sink = io.BytesIO()
    pq.write_table(table, sink, use_dictionary=False, row_group_size=rows // 4)
    response = upload(client, curator, sink.getvalue(), with_columns(*columns), "d.parquet")
    assert response.status_code == 201, response.text


def test_a_header_longer_than_a_read_block_is_named_as_such(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first line longer than the CSV reader's block (4 MiB: one enormous header name,
    or a file without line ends) got "the file has no data rows (it is a single line)",
    though rows followed it (found by the resource audit). The block is made 64 KiB here,
    under the tests' upload limit."""
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES_PER_COLUMN", 0)
    name = "N" * (70 << 10)
    content = f"x,c,b,{name}\n1,A,1,z\n2,B,0,z\n".encode()
    response = upload(client, curator, content, with_columns(*COLUMNS))
    [found] = problems_of(response)
    assert found == {
        "column": None,
        "problem": "the first line is longer than 64 KiB, the most the CSV reader takes at "
        "once: a header of very long names, or a file without line ends?",
        "rows": None,
    }
    assert_nothing_stored(client)
    # a header-only file without a line end, shorter than a block, keeps its message
    response = upload(client, curator, b"x,c,b", with_columns(*COLUMNS))
    [found] = problems_of(response)
    assert found["problem"] == "the file has no data rows (it is a single line)"


def test_a_cell_of_exactly_the_limit_is_not_refused_for_its_length(
    client: TestClient, curator: Caller
) -> None:
    """MAX_CELL_BYTES is the longest cell allowed: a 1024-byte cell is judged as a cell
    (here: no declared category), a 1025-byte one refused for its length."""
    for size, problem in ((1024, "values that are not declared categories"), (1025, None)):
        labels = ["C" * size] + ["A"] * 9
        csv = "x,c,b\n" + "".join(f"1,{label},1\n" for label in labels)
        response = upload(client, curator, csv.encode(), with_columns(*COLUMNS))
        found = problems_of(response)
        if problem is None:
            assert found == [{"column": "c", "problem": "cells longer than 1024 bytes", "rows": 1}]
        else:
            assert [p["column"] for p in found] == ["c"], found
            assert "longer than" not in found[0]["problem"], found
    assert_nothing_stored(client)


def _footer_problems(table: pa.Table, declared: list[str], limit: int, monkeypatch: Any) -> Any:
    """What _check_parquet_sizes finds in ``table`` (one row group, no dictionaries) with
    MAX_ROW_GROUP_TEXT_BYTES at ``limit``."""
    monkeypatch.setattr(validation, "MAX_ROW_GROUP_TEXT_BYTES", limit)
    sink = io.BytesIO()
    pq.write_table(table, sink, use_dictionary=False, compression="none")
    sink.seek(0)
    problems = validation.Problems()
    validation._check_parquet_sizes(sink, declared, problems)
    return list(problems.counts)


def _text_bytes(table: pa.Table, names: list[str]) -> int:
    sink = io.BytesIO()
    pq.write_table(table, sink, use_dictionary=False, compression="none")
    group = pq.ParquetFile(io.BytesIO(sink.getvalue())).metadata.row_group(0)
    return sum(
        group.column(i).total_uncompressed_size
        for i in range(group.num_columns)
        if group.column(i).path_in_schema.split(".")[0] in names
    )


def test_the_row_group_text_bound_sums_the_declared_text_columns_up_to_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The footer check: a row group's declared text columns (strings, fixed-size binary,
    a struct's text leaves) are summed, encoded, and the sum may reach
    MAX_ROW_GROUP_TEXT_BYTES but not pass it; undeclared columns and numbers do not
    count."""
    rows = 1000
    table = pa.table(
        {
            "x": pa.array([1.0] * rows),
            "c": pa.array(["AB"] * rows),
            "d": pa.array(["CD"] * rows),
            "f": pa.array([b"0123"] * rows, pa.binary(4)),
            "s": pa.array([{"t": "EF"}] * rows),
            "u": pa.array(["undeclared" * 10] * rows),
        }
    )
    both = _text_bytes(table, ["c", "d"])
    one = _text_bytes(table, ["c"])
    assert 0 < one < both
    # the sum of the two columns, at the limit and one byte past it
    assert _footer_problems(table, ["x", "c", "d"], both, monkeypatch) == []
    [problem] = _footer_problems(table, ["x", "c", "d"], both - 1, monkeypatch)
    assert problem[1].startswith("1 row group(s) of the file hold more than")
    # each column alone is within the limit: a sum, not the largest column
    assert _footer_problems(table, ["x", "c", "d"], max(one, both - one), monkeypatch) != []
    # an undeclared text column does not count, however large
    assert "u" in table.column_names
    assert _footer_problems(table, ["x", "c", "d"], both, monkeypatch) == []
    # fixed-size binary and a struct's text leaves count
    for name in ("f", "s"):
        size = _text_bytes(table, [name])
        assert size > 0
        assert _footer_problems(table, [name], size, monkeypatch) == []
        assert _footer_problems(table, [name], size - 1, monkeypatch) != []


def test_byte_sizes_are_named_in_the_largest_unit_that_divides_them() -> None:
    assert validation._byte_size(4 << 20) == "4 MiB"
    assert validation._byte_size(1 << 20) == "1 MiB"
    assert validation._byte_size(1 << 10) == "1 KiB"
    assert validation._byte_size(64 << 10) == "64 KiB"
    assert validation._byte_size((1 << 20) + (1 << 10)) == "1025 KiB"
    assert validation._byte_size(1000) == "1000 bytes"
    assert validation._byte_size(1025) == "1025 bytes"


def test_a_single_line_of_exactly_a_read_block_is_a_header_without_rows(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file without a line end that fits the CSV reader's block is one line, a header
    and no rows; only one longer than the block is named as a first line too long."""
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES_PER_COLUMN", 0)
    for size, problem in (
        (64 << 10, "the file has no data rows (it is a single line)"),
        ((64 << 10) + 1, "the first line is longer than 64 KiB"),
    ):
        content = b"x,c,b," + b"N" * (size - 6)
        assert len(content) == size
        response = upload(client, curator, content, with_columns(*COLUMNS))
        [found] = problems_of(response)
        assert found["problem"].startswith(problem), found
    assert_nothing_stored(client)


def test_cell_lengths_are_measured_for_every_text_and_bytes_type() -> None:
    """_cell_lengths gives the byte length of each cell of every Arrow text or bytes type
    (the Parquet reader hands dictionaries of string or binary, but the check takes any),
    through a dictionary without expanding it, nulls kept; None for fixed-width types."""
    cells = ["A" * 2000, None, "Bé"]
    types = [pa.string(), pa.large_string(), pa.string_view()]
    types += [pa.binary(), pa.large_binary(), pa.binary_view()]
    for arrow_type in types:
        values = [
            None if c is None else c.encode() if "binary" in str(arrow_type) else c for c in cells
        ]
        lengths = validation._cell_lengths(pa.array(values, arrow_type))
        assert lengths is not None, arrow_type
        assert lengths.to_pylist() == [2000, None, 3], arrow_type
        encoded = pa.array(values, arrow_type).dictionary_encode()
        lengths = validation._cell_lengths(encoded)
        assert lengths is not None, arrow_type
        assert lengths.to_pylist() == [2000, None, 3], arrow_type
    assert validation._cell_lengths(pa.array([1.5, 2.0])) is None
    assert validation._cell_lengths(pa.array([1, 2]).dictionary_encode()) is None


MOVIE_8 = {"name": "movie", "kind": "public", "max_bytes": 8}


def test_a_public_cell_longer_than_its_declared_max_bytes_is_refused(
    client: TestClient, curator: Caller
) -> None:
    """A public column's declared ``max_bytes`` bounds its cells' UTF-8 bytes (trimmed, as
    stored): a 9-byte cell and a 10-byte one (5 x ``é``) are refused, counted, with the
    column, the limit and the first one's data row, never the value; 8 bytes of ``é``
    with spaces around are not. Nothing is stored."""
    secret = "SECRETVAL"  # 9 bytes
    cells = ["m1", "  éééé  ", secret, "m4", "ééééé", "12345678"]
    csv = "movie,b\n" + "".join(f"{cell},1\n" for cell in cells)
    response = upload(
        client, curator, csv.encode(), with_columns(MOVIE_8, {"name": "b", "kind": "binary"})
    )
    assert problems_of(response) == [
        {
            "column": "movie",
            "problem": "cells longer than its declared max_bytes (8 bytes), the first at data "
            "row 3 (the header not counted)",
            "rows": 2,
        }
    ]
    assert secret not in response.text
    assert "ééééé" not in response.text
    assert_nothing_stored(client)
    # a Parquet integer column is judged by its text: 123456789 is 9 bytes
    table = pa.table({"movie": pa.array([1, 123456789], pa.int64()), "b": [1, 0]})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    response = upload(
        client,
        curator,
        sink.getvalue(),
        with_columns(MOVIE_8, {"name": "b", "kind": "binary"}),
        filename="data.parquet",
    )
    [found] = problems_of(response)
    assert found["column"] == "movie", found
    assert "row 2" in found["problem"], found
    assert "123456789" not in response.text
    assert_nothing_stored(client)
    # within the limit (multi-byte cells of exactly 8 bytes) it is stored as trimmed
    ok = "movie,b\n" + "".join(f"{cell},1\n" for cell in ["m1", "  éééé  ", "😀😀", "12345678"])
    response = upload(
        client, curator, ok.encode(), with_columns(MOVIE_8, {"name": "b", "kind": "binary"})
    )
    assert response.status_code == 201, response.text
    [movie] = [c for c in response.json()["columns"] if c["name"] == "movie"]
    assert movie["max_bytes"] == 8


def test_the_first_long_public_cell_is_numbered_across_batches() -> None:
    """The row number counts the data rows of earlier batches; later batches' long cells
    add to the same problem's count."""
    from app.datasets.schemas import PublicColumn

    check = validation.PublicCheck(PublicColumn(name="movie", kind="public", max_bytes=2))
    problems = validation.Problems()
    validation._process(check, pa.array(["a", "b", "c"]), problems, 0)
    validation._process(check, pa.array(["a", "long", "c"]), problems, 3)
    validation._process(check, pa.array(["longer", "c"]), problems, 6)
    assert problems.counts == {
        (
            "movie",
            "cells longer than its declared max_bytes (2 bytes), the first at data row 5 "
            "(the header not counted)",
        ): 2
    }


@pytest.mark.parametrize("max_bytes", [0, 1025, True, "8", 8.5])
def test_a_public_columns_max_bytes_is_an_integer_from_1_to_1024(
    client: TestClient, curator: Caller, max_bytes: Any
) -> None:
    column = {"name": "movie", "kind": "public", "max_bytes": max_bytes}
    response = upload(client, curator, b"movie\nm1\n", with_columns(column))
    assert response.status_code == 422, response.text
    assert "max_bytes" in response.text
    assert_nothing_stored(client)
