"""Building uploads for the datasets tests."""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fastapi.testclient import TestClient
from httpx2 import Response

from app.models import Dataset
from app.storage import tables
from tests.conftest import Caller

SCHEMA: dict[str, Any] = {
    "name": "patients",
    "columns": [
        {"name": "age", "kind": "continuous", "lower": 0, "upper": 100},
        {"name": "weight", "kind": "continuous", "lower": 20, "upper": 220},
        {"name": "blood", "kind": "categorical", "categories": ["A", "B", "AB", "O"]},
        {"name": "smoker", "kind": "binary"},
    ],
    "budget": {"epsilon": 1.0, "delta": 1e-6},
}
HEADER = "age,weight,blood,smoker"
# Cell values that must never come back in any response body.
SENTINELS = ("37.123456", "81.654321", "59.987654")
ROWS = [
    f"{SENTINELS[0]},{SENTINELS[1]},A,1",
    f"{SENTINELS[2]},70.5,O,0",
    "20,60,AB,true",
    "80,120,B,false",
]


def csv_bytes(header: str = HEADER, rows: list[str] | None = None) -> bytes:
    return ("\n".join([header, *(ROWS if rows is None else rows)]) + "\n").encode()


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def upload(
    client: TestClient,
    caller: Caller,
    content: bytes,
    schema: dict[str, Any] | str | None = None,
    filename: str = "data.csv",
    key: str | None = None,
) -> Response:
    """``key``: the upload's ``Idempotency-Key``, if any."""
    files: dict[str, Any] = {"file": (filename, content, "application/octet-stream")}
    schema_value = SCHEMA if schema is None else schema
    data = {"schema": schema_value if isinstance(schema_value, str) else json.dumps(schema_value)}
    headers = caller.headers if key is None else {**caller.headers, "Idempotency-Key": key}
    return client.post("/v1/datasets", headers=headers, files=files, data=data)


def with_columns(*columns: dict[str, Any], **changes: Any) -> dict[str, Any]:
    schema = {**SCHEMA, "columns": list(columns) or SCHEMA["columns"]}
    schema.update(changes)
    return schema


def stored_table(client: TestClient, dataset_id: str) -> pa.Table:
    """A dataset's stored (encrypted) table, opened as the measure stage opens it: with
    the dataset's own file key, unsealed with the service's data key."""
    services = client.app.state.services  # type: ignore[attr-defined]
    with services.db.transaction(read_only=True) as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None
        path = services.settings.datasets_dir / dataset.storage_name
        key = tables.file_ring(services.data_key, dataset.file_keys)
    return tables.open_table(path, key).read()
