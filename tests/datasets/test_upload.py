"""POST /v1/datasets: validation against the declared schema, normalisation, encryption."""

from __future__ import annotations

import asyncio
import errno
import gzip
import json
import logging
import threading
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from app.core.security import hash_api_key
from app.core.services import Services
from app.models import ApiKey, AuditEvent, Dataset
from app.models.base import utcnow
from app.storage import tables
from app.storage.tables import open_table
from tests.conftest import Caller
from tests.datasets.helpers import (
    HEADER,
    ROWS,
    SCHEMA,
    SENTINELS,
    csv_bytes,
    parquet_bytes,
    stored_table,
    upload,
    with_columns,
)


def _services(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def assert_nothing_stored(client: TestClient) -> None:
    services = _services(client)
    assert list(services.settings.datasets_dir.iterdir()) == []
    assert list(services.settings.tmp_dir.iterdir()) == []
    with services.db.transaction() as session:
        assert session.query(Dataset).count() == 0
        assert session.query(AuditEvent).filter(AuditEvent.action == "dataset.create").count() == 0


def assert_no_raw_values(text: str) -> None:
    for value in SENTINELS:
        assert value not in text


def test_csv_upload_is_validated_normalised_and_encrypted(
    client: TestClient, curator: Caller
) -> None:
    response = upload(client, curator, csv_bytes())
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["n_rows"] == 4
    assert body["budget"]["epsilon_total"] == 1.0
    assert body["budget"]["delta_total"] == 1e-6
    assert body["budget"]["epsilon_remaining"] == 1.0
    assert body["validation"] == {"format": "csv", "n_rows": 4, "clipped": {}}
    assert_no_raw_values(response.text)

    services = _services(client)
    stored = services.settings.datasets_dir / f"{body['id']}.parquet"
    raw = stored.read_bytes()
    assert raw[:4] == b"PARE"  # encrypted footer: Parquet modular encryption
    assert all(value.encode() not in raw for value in SENTINELS)
    assert list(services.settings.tmp_dir.iterdir()) == []  # the spool is gone

    table = stored_table(client, body["id"])
    np.testing.assert_allclose(
        table["age"].to_numpy(), [2 * 37.123456 / 100 - 1, 2 * 59.987654 / 100 - 1, -0.6, 0.6]
    )
    np.testing.assert_allclose(
        table["weight"].to_numpy(),
        [2 * (81.654321 - 20) / 200 - 1, 2 * (70.5 - 20) / 200 - 1, -0.6, 0.0],
    )
    assert table["blood"].to_pylist() == [0, 3, 2, 1]
    assert table["smoker"].to_pylist() == [1, 0, 1, 0]
    assert table.schema.field("blood").type == pa.int32()


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_a_utf8_byte_order_mark_and_crlf_line_ends_are_read_as_plain_csv(
    client: TestClient, curator: Caller, line_end: str
) -> None:
    # Excel's "CSV UTF-8" export starts with EF BB BF and ends lines with CRLF
    content = b"\xef\xbb\xbf" + csv_bytes().decode().replace("\n", line_end).encode()
    response = upload(client, curator, content)
    assert response.status_code == 201, response.text
    table = stored_table(client, response.json()["id"])
    assert table.column_names == ["age", "weight", "blood", "smoker"]
    assert table["smoker"].to_pylist() == [1, 0, 1, 0]


def test_stored_file_needs_its_own_key(client: TestClient, curator: Caller) -> None:
    """A stored file opens with the dataset's own file key only: not with another key,
    and not with the service's data key either, which seals the file key in the
    dataset's row (so deleting the data can forget it: tests/datasets/test_delete_data)."""
    from cryptography.fernet import Fernet

    body = upload(client, curator, csv_bytes()).json()
    services = _services(client)
    stored = services.settings.datasets_dir / f"{body['id']}.parquet"
    for key in (Fernet.generate_key(), services.data_key):
        with pytest.raises(PermissionError, match="no key of CURATOR_DATA_KEY"):
            open_table(stored, key).read()
    with services.db.transaction(read_only=True) as session:
        sealed = session.get(Dataset, uuid.UUID(body["id"])).file_keys
    assert sealed is not None
    assert sealed.encode() not in stored.read_bytes()
    (file_key,) = tables.unseal_file_keys(services.data_key, sealed)
    assert open_table(stored, file_key).read().equals(stored_table(client, body["id"]))


def test_parquet_upload(client: TestClient, curator: Caller) -> None:
    table = pa.table(
        {
            "age": pa.array([10.0, 50.0]),
            "weight": pa.array([20, 220], type=pa.int64()),
            "blood": pa.array(["O", "A"]),
            "smoker": pa.array([True, False]),
        }
    )
    response = upload(client, curator, parquet_bytes(table), filename="x.parquet")
    assert response.status_code == 201, response.text
    assert response.json()["validation"]["format"] == "parquet"
    out = stored_table(client, response.json()["id"])
    np.testing.assert_allclose(out["age"].to_numpy(), [-0.8, 0.0])
    np.testing.assert_allclose(out["weight"].to_numpy(), [-1.0, 1.0])
    assert out["blood"].to_pylist() == [3, 0]
    assert out["smoker"].to_pylist() == [1, 0]


def test_parquet_integers_beyond_two_to_the_53_are_numbers(
    client: TestClient, curator: Caller
) -> None:
    # int64 and uint64 cells that a float64 cannot hold exactly are still numbers: rounded
    # and clipped, not "the file could not be read as Parquet" (pyarrow's safe cast refused
    # them and the message blamed the file)
    table = pa.table(
        {
            "age": pa.array([2**53 + 1, 50], type=pa.int64()),
            "weight": pa.array([2**64 - 1, 120], type=pa.uint64()),
            "blood": pa.array(["O", "A"]),
            "smoker": pa.array([True, False]),
        }
    )
    response = upload(client, curator, parquet_bytes(table), filename="x.parquet")
    assert response.status_code == 201, response.text
    assert response.json()["validation"]["clipped"] == {"age": 1, "weight": 1}
    out = stored_table(client, response.json()["id"])
    np.testing.assert_allclose(out["age"].to_numpy(), [1.0, 0.0])
    np.testing.assert_allclose(out["weight"].to_numpy(), [1.0, 0.0])


def test_parquet_decimal_and_string_view_columns(client: TestClient, curator: Caller) -> None:
    # a decimal column (SQL NUMERIC exports) holds numbers and a string_view column text:
    # both were refused as "has type ...; expected numbers" / "expected category labels"
    table = pa.table(
        {
            "age": pa.array([Decimal("10.00"), Decimal("50.00")], type=pa.decimal128(5, 2)),
            "weight": pa.array([Decimal("20"), Decimal("220")], type=pa.decimal256(40, 0)),
            "blood": pa.array(["O", "A"], type=pa.string_view()),
            "smoker": pa.array(["1", "0"], type=pa.string_view()),
        }
    )
    response = upload(client, curator, parquet_bytes(table), filename="x.parquet")
    assert response.status_code == 201, response.text
    out = stored_table(client, response.json()["id"])
    np.testing.assert_allclose(out["age"].to_numpy(), [-0.8, 0.0])
    np.testing.assert_allclose(out["weight"].to_numpy(), [-1.0, 1.0])
    assert out["blood"].to_pylist() == [3, 0]
    assert out["smoker"].to_pylist() == [1, 0]


def test_clip_reports_counts_per_column(client: TestClient, curator: Caller) -> None:
    rows = ["-5,60,A,0", "150,60,A,0", "101,300,A,1", "50,60,A,1"]
    response = upload(client, curator, csv_bytes(rows=rows))
    assert response.status_code == 201, response.text
    assert response.json()["validation"]["clipped"] == {"age": 3, "weight": 1}
    # an exact statistic: reported once, to the uploader, and neither stored nor served again
    dataset_id = response.json()["id"]
    later = client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json()
    assert later["validation"] == {"format": "csv", "n_rows": 4, "clipped": None}
    listed = client.get("/v1/datasets", headers=curator.headers).json()
    assert all(d["validation"]["clipped"] is None for d in listed)
    with _services(client).db.transaction() as session:
        assert session.get(Dataset, uuid.UUID(dataset_id)).validation["clipped"] is None
    out = stored_table(client, response.json()["id"])
    assert out["age"].to_pylist() == [-1.0, 1.0, 1.0, 0.0]


def test_reject_policy_refuses_out_of_bounds(client: TestClient, curator: Caller) -> None:
    rows = ["-5,60,A,0", "150,60,A,0", "50,60,A,1"]
    response = upload(client, curator, csv_bytes(rows=rows), with_columns(out_of_bounds="reject"))
    assert response.status_code == 422
    problems = response.json()["error"]["problems"]
    assert problems == [
        {"column": "age", "problem": "values outside the declared bounds [0.0, 100.0]", "rows": 2}
    ]
    assert_nothing_stored(client)


CONTINUOUS = {"name": "age", "kind": "continuous", "lower": 0, "upper": 100}


@pytest.mark.parametrize(
    ("content", "schema", "column", "problem", "rows"),
    [
        pytest.param(
            csv_bytes("weight,blood,smoker", [r.split(",", 1)[1] for r in ROWS]),
            None,
            "age",
            "missing from the file",
            None,
            id="missing-column",
        ),
        pytest.param(
            csv_bytes(HEADER + ",extra", [r + ",1" for r in ROWS]),
            None,
            None,
            "1 column(s) of the file are not declared in the schema (positions [5]): declare "
            "them, or remove them from the file",
            None,
            id="extra-column",
        ),
        pytest.param(
            csv_bytes("age,age,weight,blood,smoker", ["1," + r for r in ROWS]),
            None,
            "age",
            "appears 2 times in the file's header",
            None,
            id="duplicate-header",
        ),
        pytest.param(
            csv_bytes(rows=[f"{SENTINELS[0]},{SENTINELS[1]},A,1", "abc,60,A,1", "12x,61,B,0"]),
            None,
            "age",
            "non-numeric values",
            2,
            id="non-numeric",
        ),
        pytest.param(
            csv_bytes(rows=[f"{SENTINELS[0]},,A,1", "20,60,A,1"]),
            None,
            "weight",
            "empty cells",
            1,
            id="empty-cell",
        ),
        pytest.param(
            csv_bytes(rows=[f"NaN,{SENTINELS[1]},A,1", "nan,60,A,1", "20,60,A,1"]),
            None,
            "age",
            "NaN cells",
            2,
            id="nan-cells",
        ),
        pytest.param(
            csv_bytes(rows=[f"inf,{SENTINELS[1]},A,1", "20,60,A,1"]),
            None,
            "age",
            "infinite values",
            1,
            id="infinite",
        ),
        pytest.param(
            csv_bytes(rows=[f"{SENTINELS[0]},60,Z,1", "20,60,A,1", "20,60,,1"]),
            None,
            "blood",
            "values that are not declared categories",
            1,
            id="unknown-category",
        ),
        pytest.param(
            csv_bytes(rows=[f"{SENTINELS[0]},60,A,2", "20,60,A,yes"]),
            None,
            "smoker",
            "values other than 0/1/true/false",
            2,
            id="bad-binary",
        ),
    ],
)
def test_malformed_uploads_name_the_column_and_store_nothing(
    client: TestClient,
    curator: Caller,
    content: bytes,
    schema: dict[str, Any] | None,
    column: str | None,
    problem: str,
    rows: int | None,
) -> None:
    response = upload(client, curator, content, schema)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_upload"
    assert {"column": column, "problem": problem, "rows": rows} in error["problems"]
    if column is not None:
        assert f"column {column!r}" in error["message"]
    assert_no_raw_values(response.text)
    assert_nothing_stored(client)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(b"", "the file is empty", id="empty-file"),
        pytest.param((HEADER + "\n").encode(), "the file has no data rows", id="header-only"),
        pytest.param(
            HEADER.encode(),
            "the file has no data rows (it is a single line)",
            id="header-only-without-line-end",
        ),
        pytest.param(
            HEADER.encode() + b"\n1,2,\xff\xfe,1\n",
            "the file is not valid UTF-8 text (Latin-1 or Windows-1252?): save it as UTF-8 (in "
            "Excel: 'CSV UTF-8'), or upload Parquet",
            id="not-utf8",
        ),
        pytest.param(
            b"PAR1" + b"\x00" * 64 + SENTINELS[0].encode(),
            "the file could not be read as Parquet (is it truncated or corrupt?)",
            id="broken-parquet",
        ),
        # a CSV parser calls these "ragged" or "empty": say what the file is instead
        pytest.param(
            csv_bytes().decode().encode("utf-16"),
            "the file is UTF-16 or UTF-32 text (it starts with such a byte-order mark), "
            "not UTF-8 text: upload CSV as UTF-8 text, or Parquet",
            id="utf-16",
        ),
        pytest.param(
            csv_bytes().decode().encode("utf-16-be"),
            "the file is not UTF-8 text: it contains NUL bytes (UTF-16 text, or a binary "
            "file?): upload CSV as UTF-8 text, or Parquet",
            id="utf-16-without-bom",
        ),
        pytest.param(
            b"PK\x03\x04" + SENTINELS[0].encode() + b"\x00" * 64,
            "the file is a ZIP archive (an Excel .xlsx workbook is one), not UTF-8 text: "
            "upload CSV as UTF-8 text, or Parquet",
            id="zip",
        ),
        pytest.param(
            gzip.compress(csv_bytes()),
            "the file is gzip-compressed, not UTF-8 text: upload CSV as UTF-8 text, or Parquet",
            id="gzip",
        ),
    ],
)
def test_unreadable_files(
    client: TestClient, curator: Caller, content: bytes, problem: str
) -> None:
    response = upload(client, curator, content)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["problems"] == [
        {"column": None, "problem": problem, "rows": None}
    ]
    assert_no_raw_values(response.text)
    assert_nothing_stored(client)


@pytest.mark.parametrize("filename", ["data.parquet", "DATA.PQ"])
def test_a_file_named_parquet_that_is_not_parquet_is_refused_as_such(
    client: TestClient, curator: Caller, filename: str
) -> None:
    # read as CSV, these bytes would get "the file is not valid UTF-8 text"
    content = b"\x89\xff" + SENTINELS[0].encode() + b"\xfe\x00" * 16
    response = upload(client, curator, content, filename=filename)
    assert response.status_code == 422, response.text
    [problem] = response.json()["error"]["problems"]
    assert problem["problem"].startswith("the file is named as Parquet but is not a Parquet file")
    assert_no_raw_values(response.text)
    assert_nothing_stored(client)
    # the name only ever adds this refusal (the Parquet tests upload as data.csv)
    assert upload(client, curator, csv_bytes(), filename="data.csv").status_code == 201


def test_headerless_file_is_not_quoted_back(client: TestClient, curator: Caller) -> None:
    # Without a header the first data row would be the "column names": never echo them.
    response = upload(client, curator, csv_bytes(header=ROWS[0], rows=ROWS[1:]))
    assert response.status_code == 422
    assert "header row" in response.text
    assert_no_raw_values(response.text)
    assert_nothing_stored(client)


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        pytest.param(
            with_columns({**CONTINUOUS, "lower": 5, "upper": 5}),
            "lower (5.0) must be < upper (5.0)",
            id="lower-ge-upper",
        ),
        pytest.param(
            '{"name": "x", "columns": [{"name": "age", "kind": "continuous", "lower": 0, "upper": Infinity}], "budget": {"epsilon": 1}}',
            "must be finite",
            id="non-finite-bound",
        ),
        pytest.param(
            with_columns({**CONTINUOUS, "lower": -1e308, "upper": 1e308}),
            "upper - lower must be a finite number",
            id="bound-width-overflows",
        ),
        pytest.param(
            # finite, but 2 (x - lower) is not: values near upper were stored as 1 and
            # synthetic ones near it released as inf
            with_columns({**CONTINUOUS, "lower": -8e307, "upper": 8e307}),
            "upper - lower (1.6e+308) must be at most 8.98847e+307, half the largest double",
            id="bound-width-doubled-overflows",
        ),
        pytest.param(
            with_columns(CONTINUOUS, CONTINUOUS),
            "duplicate column names in the schema: ['age']",
            id="duplicate-names",
        ),
        pytest.param(
            with_columns(budget={"epsilon": 0}),
            "budget.epsilon (0.0) must be a positive",
            id="epsilon-zero",
        ),
        pytest.param(
            with_columns(budget={"epsilon": -1}),
            "budget.epsilon (-1.0) must be a positive",
            id="epsilon-negative",
        ),
        pytest.param(
            with_columns(budget={"epsilon": 1, "delta": 1}),
            "budget.delta (1.0) must lie in [0, 1)",
            id="delta-one",
        ),
        pytest.param(
            with_columns(budget={"epsilon": 1, "delta": -0.1}),
            "budget.delta (-0.1) must lie in [0, 1)",
            id="delta-negative",
        ),
        pytest.param(
            with_columns({"name": "c", "kind": "categorical", "categories": ["a", "a"]}),
            "categories must be distinct",
            id="repeated-category",
        ),
        pytest.param(
            # cells are trimmed before they are matched: " a" could never match one, and
            # "a " was a second, unreachable category beside "a"
            with_columns({"name": "c", "kind": "categorical", "categories": ["a", "a "]}),
            "category 'a ' has leading or trailing whitespace",
            id="category-with-whitespace",
        ),
        pytest.param(
            with_columns({"name": "c", "kind": "categorical", "categories": ["  ", "b"]}),
            "category '  ' has leading or trailing whitespace",
            id="blank-category",
        ),
        pytest.param(
            with_columns({"name": "c", "kind": "ordinal"}), "schema.columns.0", id="unknown-kind"
        ),
        pytest.param(with_columns(out_of_bounds="wrap"), "out_of_bounds", id="bad-policy"),
        pytest.param("{not json", "invalid schema", id="not-json"),
    ],
)
def test_bad_schemas_are_422(
    client: TestClient, curator: Caller, schema: Any, fragment: str
) -> None:
    response = upload(client, curator, csv_bytes(), schema)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert fragment in response.json()["error"]["message"]
    assert_nothing_stored(client)


def test_the_widest_bounds_allowed_are_half_the_largest_double(
    client: TestClient, curator: Caller
) -> None:
    """upper - lower equal to MAX_BOUND_WIDTH still normalises without overflow (2 (x -
    lower) is at most the largest double): it is accepted, only wider bounds are not."""
    from app.datasets.schemas import MAX_BOUND_WIDTH

    columns = [
        {**c, "lower": 0.0, "upper": MAX_BOUND_WIDTH} if c["name"] == "age" else c
        for c in SCHEMA["columns"]
    ]
    widest = with_columns(*columns)
    response = upload(client, curator, csv_bytes(), widest)
    assert response.status_code == 201, response.text


def test_missing_parts(client: TestClient, curator: Caller) -> None:
    no_schema = client.post(
        "/v1/datasets", headers=curator.headers, files={"file": ("d.csv", csv_bytes())}
    )
    assert no_schema.status_code == 422
    assert "'schema' form field is missing" in no_schema.json()["error"]["message"]
    no_file = client.post(
        "/v1/datasets",
        headers=curator.headers,
        data={"schema": json.dumps(SCHEMA)},
        files={"other": ("x", b"1")},
    )
    assert no_file.status_code == 422
    assert "'file' part is missing" in no_file.json()["error"]["message"]
    not_multipart = client.post("/v1/datasets", headers=curator.headers, json=SCHEMA)
    assert not_multipart.status_code == 415
    assert_nothing_stored(client)


def test_upload_over_the_limit_is_413_and_leaves_nothing(
    client: TestClient, curator: Caller
) -> None:
    limit = _services(client).settings.max_upload_bytes
    rows = ["50,60,A,1"] * (limit // 9 + 10)
    response = upload(client, curator, csv_bytes(rows=rows))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert_nothing_stored(client)


def test_a_parquet_file_that_decodes_to_more_cells_than_a_csv_could_is_refused(
    client: TestClient, curator: Caller
) -> None:
    """Run-length encoded zeros: a small file, many rows (the scale audit's 874 KB decoded
    to 10^7 rows of 20 columns). Refused from the footer, before a row is validated, when
    rows times declared columns exceed what a CSV at the upload limit could hold."""
    from app.datasets.validation import max_cells

    limit = max_cells(_services(client).settings.max_upload_bytes)  # 1 Mi cells in tests
    rows = limit // 4 + 1  # 4 declared columns

    def zeros(n: int) -> bytes:
        return parquet_bytes(
            pa.table(
                {
                    "age": pa.array(np.zeros(n)),
                    "weight": pa.array(np.full(n, 60.0)),
                    "blood": pa.array(["A"] * n),
                    "smoker": pa.array(np.zeros(n, dtype=np.int64)),
                }
            )
        )

    content = zeros(rows)
    assert len(content) < limit // 100  # small on the wire
    response = upload(client, curator, content, filename="d.parquet")
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert f"holds {rows} rows of 4 declared columns, more than {limit} cells" in message
    assert_nothing_stored(client)
    accepted = upload(client, curator, zeros(rows - 1), filename="d.parquet")
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["n_rows"] == rows - 1


def test_streamed_upload_without_length_is_counted(client: TestClient, curator: Caller) -> None:
    limit = _services(client).settings.max_upload_bytes
    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="schema"\r\n\r\n{json.dumps(SCHEMA)}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.csv"\r\n\r\n'
        ).encode()
        + csv_bytes(rows=["50,60,A,1"] * (limit // 9 + 10))
        + f"\r\n--{boundary}--\r\n".encode()
    )

    def chunks() -> Any:
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    response = client.post(
        "/v1/datasets",
        headers={**curator.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=chunks(),
    )
    assert response.status_code == 413
    assert_nothing_stored(client)


def test_a_client_that_disconnects_mid_upload_is_not_a_server_error(
    client: TestClient, curator: Caller, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that goes away while its file streams (a closed laptop, a killed curl) is
    no bug of the service: an audit saw each such upload logged as ``ERROR unhandled
    ClientDisconnect`` with a stack trace, and a 500 sent after it. It is logged as one
    line, nothing is answered, and nothing is stored."""
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="schema"\r\n\r\n'
        f"{json.dumps(SCHEMA)}\r\n"
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.csv"\r\n\r\n'
    ).encode() + csv_bytes()
    messages = [
        {"type": "http.request", "body": head, "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = {**curator.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/datasets",
        "raw_path": b"/v1/datasets",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    with caplog.at_level(logging.INFO):
        asyncio.run(client.app(scope, receive, send))  # type: ignore[attr-defined]
    assert sent == []
    assert "unhandled" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "disconnected" in caplog.text
    assert_nothing_stored(client)


def revoke_key(client: TestClient, caller: Caller) -> None:
    with _services(client).db.transaction() as session:
        key = session.scalars(
            select(ApiKey).where(ApiKey.key_hash == hash_api_key(caller.key))
        ).one()
        key.revoked_at = utcnow()


def test_key_revoked_while_the_file_streams_creates_nothing(
    client: TestClient, curator: Caller
) -> None:
    """The key is checked when the request starts and again just before the dataset is
    recorded: revoking it while the upload streams leaves nothing behind."""
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="schema"\r\n\r\n{json.dumps(SCHEMA)}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.csv"\r\n\r\n'
    ).encode()
    tail = csv_bytes(rows=["50,60,A,1"] * 200) + f"\r\n--{boundary}--\r\n".encode()

    def chunks() -> Any:
        yield head
        revoke_key(client, curator)
        yield tail

    response = client.post(
        "/v1/datasets",
        headers={**curator.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=chunks(),
    )
    assert response.status_code == 401, response.text
    assert_nothing_stored(client)


def test_only_curators_upload(client: TestClient, analyst: Caller, admin: Caller) -> None:
    for caller in (analyst, admin):
        response = upload(client, caller, csv_bytes())
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forbidden"
    assert client.post("/v1/datasets", files={"file": ("d.csv", csv_bytes())}).status_code == 401
    assert_nothing_stored(client)


def test_upload_is_audited_without_values(client: TestClient, curator: Caller) -> None:
    body = upload(client, curator, csv_bytes()).json()
    with _services(client).db.transaction() as session:
        event = session.query(AuditEvent).filter(AuditEvent.action == "dataset.create").one()
        assert event.actor_id == curator.id
        assert event.object_id == body["id"]
        assert_no_raw_values(json.dumps(event.details))


def test_failed_commit_removes_the_stored_file(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.datasets import service

    def boom(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("simulated failure after the file was written")

    monkeypatch.setattr(service, "record", boom)
    failing = TestClient(client.app, raise_server_exceptions=False)
    response = upload(failing, curator, csv_bytes())
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "simulated" not in response.text
    assert_nothing_stored(client)


def test_uploads_in_progress_leave_sessions_to_other_requests(
    client: TestClient, curator: Caller, analyst: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload holds no session while its file streams and is validated: with more
    uploads stuck in validation than there are session slots, a request that needs a
    session (GET /v1/datasets) is still served."""
    from app.core.deps import MAX_CONCURRENT_TRANSACTIONS
    from app.datasets import endpoints, service

    n_uploads = MAX_CONCURRENT_TRANSACTIONS + 1
    arrived = threading.Semaphore(0)  # one release per upload whose body has been read
    finish = threading.Event()
    receive, validate = endpoints.receive_multipart, service.validate_and_store

    async def counted_receive(*args: Any) -> Any:
        received = await receive(*args)
        arrived.release()
        return received

    def held_validate(*args: Any, **kwargs: Any) -> Any:
        finish.wait(timeout=60)
        return validate(*args, **kwargs)

    monkeypatch.setattr(endpoints, "receive_multipart", counted_receive)
    monkeypatch.setattr(service, "validate_and_store", held_validate)
    codes: list[int] = []
    served: list[int] = []

    def attempt() -> None:
        codes.append(upload(client, curator, csv_bytes()).status_code)

    def other_request() -> None:
        served.append(client.get("/v1/datasets", headers=analyst.headers).status_code)

    uploads = [threading.Thread(target=attempt) for _ in range(n_uploads)]
    other = threading.Thread(target=other_request)
    try:
        for thread in uploads:
            thread.start()
        # at least as many uploads past their body as there are session slots
        assert all(arrived.acquire(timeout=30) for _ in range(MAX_CONCURRENT_TRANSACTIONS))
        other.start()
        other.join(timeout=10)
        served_while_uploading = list(served)
    finally:
        finish.set()
        for thread in [*uploads, other]:
            thread.join(timeout=60)
    assert served_while_uploading == [200], "GET /v1/datasets waited for the uploads"
    assert codes == [201] * n_uploads
    with _services(client).db.transaction() as session:
        assert session.query(Dataset).count() == n_uploads


def test_key_revoked_while_the_file_is_validated_creates_nothing(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.datasets import service

    validate = service.validate_and_store

    def validate_then_revoke(*args: Any, **kwargs: Any) -> Any:
        stored = validate(*args, **kwargs)
        revoke_key(client, curator)
        return stored

    monkeypatch.setattr(service, "validate_and_store", validate_then_revoke)
    response = upload(client, curator, csv_bytes())
    assert response.status_code == 401, response.text
    assert_nothing_stored(client)


def test_transaction_that_cannot_begin_removes_the_stored_file(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is stored before the dataset's transaction begins: if it never begins (the
    database refuses), the file goes too."""
    database = _services(client).db
    transaction = database.transaction

    def refuse_writes(*, read_only: bool = False, lock_timeout: float | None = None) -> Any:
        if not read_only:
            raise OperationalError("BEGIN IMMEDIATE", {}, Exception("database is locked"))
        return transaction(read_only=True, lock_timeout=lock_timeout)

    monkeypatch.setattr(database, "transaction", refuse_writes)
    failing = TestClient(client.app, raise_server_exceptions=False)
    response = upload(failing, curator, csv_bytes())
    assert response.status_code == 503  # the database's, not a bug
    assert response.json()["error"]["code"] == "service_unavailable"
    monkeypatch.undo()
    assert_nothing_stored(client)


@pytest.mark.parametrize("where", ["spool", "stored table"])
def test_a_full_disk_is_a_503_and_not_the_files_fault(
    where: str, client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data directory that takes no more bytes (ENOSPC, also read-only or over quota)
    while the upload spools or its table is stored: the stored table's write error was
    taken for pyarrow's read error, a 422 telling the curator that a valid file "could not
    be read as CSV", and a full spool was a 500 "this is a bug"; both are a 503 that says
    to try again later, and nothing is left behind."""
    from app.storage.spool import EncryptedSpool
    from app.storage.tables import EncryptedTableWriter

    def full(*_args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    owner = EncryptedSpool if where == "spool" else EncryptedTableWriter
    monkeypatch.setattr(owner, "write", full)
    response = upload(client, curator, csv_bytes())
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "service_unavailable"
    assert "full or read-only" in response.json()["error"]["message"]
    assert response.headers["retry-after"] == "30"
    assert_no_raw_values(response.text)
    monkeypatch.undo()
    assert_nothing_stored(client)


def test_an_error_after_the_commit_keeps_the_recorded_file(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error (or a cancellation) that reaches the endpoint after the dataset's
    transaction committed must not remove the file a recorded dataset points to."""
    from app.core.deps import DeferredTransaction

    run = DeferredTransaction.run

    async def run_then_fail(self: DeferredTransaction, *args: Any, **kwargs: Any) -> Any:
        await run(self, *args, **kwargs)
        raise RuntimeError("simulated failure after the commit")

    monkeypatch.setattr(DeferredTransaction, "run", run_then_fail)
    failing = TestClient(client.app, raise_server_exceptions=False)
    assert upload(failing, curator, csv_bytes()).status_code == 500
    services = _services(client)
    with services.db.transaction(read_only=True) as session:
        names = [d.storage_name for d in session.query(Dataset).all()]
    assert len(names) == 1
    assert [p.name for p in services.settings.datasets_dir.iterdir()] == names


def test_path_of_datasets_dir(tmp_path: Path) -> None:
    # the settings keep raw tables, artifacts and spools apart under DATA_DIR
    from app.config import Settings

    s = Settings(data_dir=tmp_path)
    assert {s.datasets_dir.name, s.releases_dir.name, s.tmp_dir.name} == {
        "datasets",
        "releases",
        "tmp",
    }


def test_stray_upload_files_are_removed_once_old(client: TestClient, curator: Caller) -> None:
    """What a killed process leaves (a stored file no dataset records, a spool) goes once
    older than STRAY_FILE_AGE; recorded datasets' files and young files stay."""
    import os

    from app.datasets.service import STRAY_FILE_AGE, remove_stray_files
    from app.models.base import utcnow
    from app.releases.stages import Sweeper

    assert upload(client, curator, csv_bytes()).status_code == 201
    services = _services(client)
    (recorded,) = list(services.settings.datasets_dir.iterdir())
    stray = services.settings.datasets_dir / "0f5c1e6e-stray.parquet"
    spool = services.settings.tmp_dir / "upload-stray.spool"
    young = services.settings.tmp_dir / "upload-young.spool"
    # what a key rotation killed before its rename leaves beside the recorded file
    rotating = services.settings.datasets_dir / f"{recorded.name}.rotating"
    # and one a rotation is writing now (its rename would fail if it went)
    rotating_now = services.settings.datasets_dir / f"{recorded.name}.5e2a.rotating"
    # the temporary copy of a generated key, left by a start killed before its unlink,
    # and one that a process starting now is about to publish
    key_copy = services.settings.data_dir / ".data.key.4242.0a1b2c3d"
    key_now = services.settings.data_dir / ".data.key.4243.0a1b2c3e"
    for path in (stray, spool, young, rotating, rotating_now, key_copy, key_now):
        path.write_bytes(b"ciphertext")
    old = (utcnow() - STRAY_FILE_AGE).timestamp() - 60
    for path in (recorded, stray, spool, rotating, key_copy):
        os.utime(path, (old, old))
    Sweeper(services).start().stop()  # the worker's sweeper runs it first thing
    assert sorted(p.name for p in services.settings.datasets_dir.iterdir()) == sorted(
        [recorded.name, rotating_now.name]
    )
    assert sorted(p.name for p in services.settings.tmp_dir.iterdir()) == [young.name]
    assert not key_copy.exists()
    assert key_now.exists()
    with services.db.transaction(read_only=True) as session:
        assert remove_stray_files(session, services) == 0


class _PausedUpload:
    """An upload run in a thread, paused once its file is validated and stored (held,
    not yet recorded) until :meth:`finish`; its files' modification times set 10 days
    back (a clock stepped forward, a validation of days)."""

    def __init__(
        self, client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import os

        from app.datasets import service

        self.services = _services(client)
        validated, self._finish = threading.Event(), threading.Event()
        validate = service.validate_and_store

        def paused_validate(*args: Any, **kwargs: Any) -> Any:
            stored = validate(*args, **kwargs)  # the stored file written
            validated.set()
            self._finish.wait(timeout=60)
            return stored

        monkeypatch.setattr(service, "validate_and_store", paused_validate)
        self.codes: list[int] = []
        self._thread = threading.Thread(
            target=lambda: self.codes.append(upload(client, curator, csv_bytes()).status_code)
        )
        self._thread.start()
        assert validated.wait(timeout=30)
        (self.stored,) = self.services.settings.datasets_dir.glob("*.parquet")
        (self.spool,) = self.services.settings.tmp_dir.glob("upload-*.spool")
        self.long_ago = (utcnow() - timedelta(days=10)).timestamp()
        for path in (self.stored, self.spool):
            os.utime(path, (self.long_ago, self.long_ago))

    def finish(self) -> None:
        self._finish.set()
        self._thread.join(timeout=60)

    def recorded(self) -> None:
        """The upload recorded its dataset, with its file."""
        assert self.codes == [201]
        assert not self.spool.exists()  # removed by the upload itself
        with self.services.db.transaction(read_only=True) as session:
            (dataset,) = session.scalars(select(Dataset))
            assert dataset.storage_name == self.stored.name
        assert self.stored.exists()


def test_a_live_uploads_files_are_not_removed_however_old(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload holds its spool and its stored file until its dataset is recorded: a
    sweep while it validates leaves them, however old they look, and removes an old file
    no one holds (README "Clocks")."""
    import os

    from app.datasets.service import remove_stray_files

    live = _PausedUpload(client, curator, monkeypatch)
    services = live.services
    try:
        stray = services.settings.datasets_dir / f"{uuid.uuid4()}.parquet"
        stray.write_bytes(b"ciphertext")
        os.utime(stray, (live.long_ago, live.long_ago))
        with services.db.transaction(read_only=True) as session:
            assert remove_stray_files(session, services) == 1
        assert live.stored.exists()
        assert live.spool.exists()
        assert not stray.exists()
    finally:
        live.finish()
    live.recorded()
    with services.db.transaction(read_only=True) as session:
        assert remove_stray_files(session, services) == 0
    assert live.stored.exists()


def test_a_live_key_rotations_copy_is_not_removed_however_old(
    client: TestClient, curator: Caller
) -> None:
    """A key rotation holds the re-encrypted copy it writes beside a file until its
    rename: a sweep before the rename leaves it, however old it looks."""
    import os

    from app.datasets.service import remove_stray_files

    assert upload(client, curator, csv_bytes()).status_code == 201
    services = _services(client)
    with services.db.transaction(read_only=True) as session:
        (dataset,) = session.scalars(select(Dataset))
    path = services.settings.datasets_dir / dataset.storage_name
    long_ago = (utcnow() - timedelta(days=10)).timestamp()
    left: list[bool] = []

    def sweep() -> None:
        (copy,) = services.settings.datasets_dir.glob("*" + tables.ROTATING_SUFFIX)
        os.utime(copy, (long_ago, long_ago))
        with services.db.transaction(read_only=True) as session:
            assert remove_stray_files(session, services) == 0
        left.append(copy.exists())

    ring = tables.file_ring(services.data_key, dataset.file_keys)
    tables.rotate(path, ring, tables.new_file_key(), before_replace=sweep)
    assert left == [True]


def test_an_upload_recorded_during_a_sweep_keeps_its_file(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload that records its dataset, and lets its file go, after the sweep read the
    dataset rows keeps its file: the sweep found it held before it read a row (on SQLite,
    a transaction reads the rows as they were at its first read: a file found unheld after
    that could be a dataset's recorded since)."""
    from app.datasets import service

    live = _PausedUpload(client, curator, monkeypatch)
    recorded_files = service._recorded_files
    calls = 0

    def then_record(*args: Any) -> Any:
        nonlocal calls
        found = recorded_files(*args)
        calls += 1
        if calls == 1:  # the sweep has read rows: the upload records its dataset now
            live.finish()
            assert live.codes == [201]
        return found

    monkeypatch.setattr(service, "_recorded_files", then_record)
    try:
        with live.services.db.transaction(read_only=True) as session:
            service.remove_stray_files(session, live.services)
    finally:
        live.finish()
    live.recorded()
