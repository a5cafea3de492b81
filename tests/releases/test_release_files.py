"""What an analyst downloads conforms to the declaration: values inside the declared
domain, in original units, the same in the CSV and the Parquet file."""

from __future__ import annotations

import io
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from app.models import ReleaseMeasurement
from app.releases.registry import ColumnInfo, DatasetInfo
from tests.conftest import Caller
from tests.datasets.helpers import upload
from tests.releases.helpers import budget, finished_release, run_all, services_of

#: Declared bounds whose width, added back to the lower bound, rounds past the upper one:
#: -5 + (0.2 - -5) = 0.20000000000000018, -5 + (-0.1 - -5) = -0.09999999999999964.
OVERSHOOTING_BOUNDS = [(-5.0, 0.2), (-5.0, -0.1), (-932828.8493890712, 459310.8928598881)]


@pytest.mark.parametrize(("lower", "upper"), OVERSHOOTING_BOUNDS)
def test_the_normalised_bounds_map_back_onto_the_declared_bounds(
    lower: float, upper: float
) -> None:
    column = ColumnInfo("x", "continuous", lower, upper)
    info = DatasetInfo(n_rows=1, columns=(column, column))
    ends = np.array([-1.0, np.nextafter(-1.0, 0.0), np.nextafter(1.0, 0.0), 1.0])
    for values in (column.to_original(ends), info.to_original(np.column_stack([ends, ends]))):
        assert values.min() == lower, values.tolist()
        assert values.max() == upper, values.tolist()


def _downloads(client: TestClient, caller: Caller, release_id: str, kind: str) -> list[pa.Table]:
    tables = []
    for form in ("csv", "parquet"):
        response = client.get(
            f"/v1/releases/{release_id}/synthetic",
            params={"format": form, "kind": kind},
            headers=caller.headers,
        )
        assert response.status_code == 200, response.text
        body = io.BytesIO(response.content)
        tables.append(pacsv.read_csv(body) if form == "csv" else pq.read_table(body))
    return tables


@pytest.mark.parametrize(
    "params",
    [{"method": "marginals", "bound_atoms": True}, {"method": "tree", "bound_atoms": True}],
)
def test_synthetic_values_at_the_bounds_stay_inside_the_declared_bounds(
    client: TestClient, curator: Caller, params: dict[str, Any]
) -> None:
    """Rows piled on the declared bounds give the released histograms atoms there, and
    every support point drawn from an atom sits at exactly -1 or 1 on the normalised
    scale: mapped back, it is the declared bound itself, never a value one rounding past
    it (sample.csv held 0.20000000000000018 for an upper bound of 0.2)."""
    rng = np.random.default_rng(3)
    n = 2000
    columns, data = [], {}
    for j, (lower, upper) in enumerate(OVERSHOOTING_BOUNDS):
        name = f"c{j}"
        columns.append({"name": name, "kind": "continuous", "lower": lower, "upper": upper})
        data[name] = np.where(rng.uniform(size=n) < 0.5, upper, lower)
    schema = {"name": "piled", "columns": columns, "budget": {"epsilon": 20, "delta": 1e-5}}
    sink = io.BytesIO()
    pq.write_table(pa.table(data), sink)
    response = upload(client, curator, sink.getvalue(), schema, filename="piled.parquet")
    assert response.status_code == 201, response.text
    body = {
        "mechanism": "smooth_synthetic",
        "epsilon": 10.0,
        "delta": 1e-6 if params["method"] == "tree" else 0.0,
        "params": params,
    }
    release = finished_release(client, curator, response.json()["id"], body)
    for kind in ("sample", "support"):
        csv_table, parquet_table = _downloads(client, curator, release["id"], kind)
        assert csv_table.equals(parquet_table)
        for column in columns:
            values = parquet_table.column(column["name"]).to_numpy()
            assert np.isfinite(values).all()
            outside = values[(values < column["lower"]) | (values > column["upper"])]
            assert outside.size == 0, (kind, column, outside[:5].tolist())
            # the atoms are there: values at the bounds themselves
            assert (values == column["upper"]).any()
            assert (values == column["lower"]).any()
        if kind == "support":
            weights = parquet_table.column("weight").to_numpy()
            assert (weights >= 0).all()
            assert abs(weights.sum() - 1.0) < 1e-9


def test_randomized_response_files_keep_the_release_column_order(
    client: TestClient, curator: Caller
) -> None:
    """The sample's columns are the release's ``columns`` in their order, in the CSV and
    the Parquet file alike: the public column came last wherever it stood."""
    rng = np.random.default_rng(5)
    n = 200
    columns = [
        {"name": "id", "kind": "public"},
        {"name": "blood", "kind": "categorical", "categories": ["A", "B"]},
        {"name": "smoker", "kind": "binary"},
        {"name": "age", "kind": "continuous", "lower": 0, "upper": 100},
    ]
    data = {
        "id": [f"p{i % 7}" for i in range(n)],
        "blood": rng.choice(["A", "B"], n),
        "smoker": rng.integers(0, 2, n),
        "age": rng.uniform(0, 100, n),
    }
    schema = {"name": "people", "columns": columns, "budget": {"epsilon": 10, "delta": 0}}
    sink = io.BytesIO()
    pq.write_table(pa.table(data), sink)
    response = upload(client, curator, sink.getvalue(), schema, filename="people.parquet")
    assert response.status_code == 201, response.text
    dataset_id = response.json()["id"]
    for order in (["id", "blood", "smoker", "age"], ["age", "id", "smoker"]):
        body = {"mechanism": "randomized_response", "epsilon": 2.0, "columns": order}
        release = finished_release(client, curator, dataset_id, body)
        assert release["columns"] == order
        csv_table, parquet_table = _downloads(client, curator, release["id"], "sample")
        assert csv_table.column_names == order
        assert parquet_table.column_names == order


def test_a_compressed_download_gives_no_validator_that_resumes_it_with_plain_bytes(
    client: TestClient, curator: Caller
) -> None:
    """A CSV served gzip-compressed carried the strong ETag and the Last-Modified of the
    file; a client resuming it (``Range`` with ``If-Range`` naming either) got a 206 of
    the plain file's bytes from that offset and appended them to its compressed part: a
    corrupt download. A compressed response's ETag is weak (the same content, another
    encoding: RFC 9110, section 8.8.1) and it carries no Last-Modified, so ``If-Range``
    with it gets the whole file; the plain response keeps both and resumes."""
    rng = np.random.default_rng(11)
    n = 400
    columns = [{"name": "x", "kind": "continuous", "lower": 0, "upper": 1}]
    schema = {"name": "plain", "columns": columns, "budget": {"epsilon": 10, "delta": 0}}
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": rng.uniform(0, 1, n)}), sink)
    response = upload(client, curator, sink.getvalue(), schema, filename="plain.parquet")
    assert response.status_code == 201, response.text
    body = {"mechanism": "smooth_synthetic", "epsilon": 5.0}
    release = finished_release(client, curator, response.json()["id"], body)
    url = f"/v1/releases/{release['id']}/synthetic"
    plain = client.get(url, headers={**curator.headers, "Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert len(plain.content) > 4096  # compressed when the client accepts gzip
    packed = client.get(url, headers={**curator.headers, "Accept-Encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip"
    assert packed.content == plain.content  # as decoded by the client
    assert packed.headers["etag"] == f"W/{plain.headers['etag']}"
    assert "last-modified" not in packed.headers
    resume = {**curator.headers, "Accept-Encoding": "gzip", "Range": "bytes=100-"}
    again = client.get(url, headers={**resume, "If-Range": packed.headers["etag"]})
    assert again.status_code == 200
    assert again.content == plain.content
    # the plain download resumes as before
    for validator in (plain.headers["etag"], plain.headers["last-modified"]):
        part = client.get(url, headers={**resume, "If-Range": validator})
        assert part.status_code == 206
        assert "content-encoding" not in part.headers
        assert part.content == plain.content[100:]


def test_a_resynthesis_with_the_same_params_draws_a_new_sample_from_the_same_measurements(
    client: TestClient, curator: Caller
) -> None:
    """Each synthesis version draws from a generator seeded by the release and the
    version: a re-synthesis with unchanged parameters publishes another sample and
    support (post-processing, no budget), from the measurements stored at the request,
    which it leaves as they were."""
    rng = np.random.default_rng(13)
    n = 300
    columns = [
        {"name": "x", "kind": "continuous", "lower": 0, "upper": 1},
        {"name": "y", "kind": "continuous", "lower": -1, "upper": 1},
    ]
    schema = {"name": "twice", "columns": columns, "budget": {"epsilon": 10, "delta": 0}}
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": rng.uniform(0, 1, n), "y": rng.uniform(-1, 1, n)}), sink)
    response = upload(client, curator, sink.getvalue(), schema, filename="twice.parquet")
    assert response.status_code == 201, response.text
    dataset_id = response.json()["id"]
    body = {"mechanism": "smooth_synthetic", "epsilon": 5.0}
    release = finished_release(client, curator, dataset_id, body)
    release_id = release["id"]

    def measurements() -> Any:
        with services_of(client).db.transaction(read_only=True) as session:
            row = session.get(ReleaseMeasurement, uuid.UUID(release_id))
            assert row is not None
            return row.payload

    def downloads() -> list[bytes]:
        return [
            client.get(
                f"/v1/releases/{release_id}/synthetic",
                params={"format": form, "kind": kind},
                headers=curator.headers,
            ).content
            for form in ("csv", "parquet")
            for kind in ("sample", "support")
        ]

    stored, first, spent = measurements(), downloads(), budget(client, curator, dataset_id)
    response = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {}},
    )
    assert response.status_code == 202, response.text
    run_all(client, release_id)
    again = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert again["status"] == "succeeded"
    assert again["params"] == release["params"]
    second = downloads()
    assert all(a != b for a, b in zip(first, second, strict=True))
    assert measurements() == stored
    assert budget(client, curator, dataset_id) == spent
