"""``CURATOR_MAX_RELEASE_BYTES``: a release's files are predicted, and capped, before
anything is reserved.

Default ``smooth_synthetic`` releases of a 30-row, 2000-column table wrote about 711 MB
each, and 61 of them left 41 GB on the data disk. Each release type predicts an upper
bound on its files' bytes from public values (:meth:`Mechanism.artifact_bytes`); a
request, preview or re-synthesis past the cap is a 422 naming both. The bounds are checked
here against the bytes real releases write (``du``'s count: whole blocks).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.models import Dataset, LedgerEntry, Release
from app.storage import sizes
from app.storage.artifacts import ArtifactStore, sample_chunk_rows
from tests.conftest import Caller
from tests.datasets.helpers import upload
from tests.datasets.test_graphs import upload_graph
from tests.releases.helpers import (
    budget,
    finished_release,
    request_release,
    rows_of,
    run_all,
    services_of,
)

CONTINUOUS = [f"a_rather_long_column_name_{j}" for j in range(6)]
LONG_CATEGORIES = [f'"=category, number {i}"' for i in range(5)]


def _table(client: TestClient, curator: Caller, n: int = 400) -> str:
    rng = np.random.default_rng(23)
    values = rng.uniform(-1e6, 1e6, (n, len(CONTINUOUS)))
    header = ",".join([*CONTINUOUS, "cat", "flag", "movie"])
    lines = [header] + [
        ",".join(
            [
                *(repr(float(v)) for v in values[i]),
                '"' + LONG_CATEGORIES[i % 5].replace('"', '""') + '"',
                str(i % 2),
                f"movie-{i % 7}",
            ]
        )
        for i in range(n)
    ]
    schema = {
        "name": "sizes",
        "columns": [
            *({"name": c, "kind": "continuous", "lower": -1e6, "upper": 1e6} for c in CONTINUOUS),
            {"name": "cat", "kind": "categorical", "categories": LONG_CATEGORIES},
            {"name": "flag", "kind": "binary"},
            {"name": "movie", "kind": "public"},
        ],
        "budget": {"epsilon": 100, "delta": 1e-4},
        "allow_non_dp_releases": True,
    }
    response = upload(client, curator, ("\n".join(lines) + "\n").encode(), schema)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _on_disk(folder: Path) -> int:
    """The bytes of the files under ``folder`` as ``du`` counts them (whole blocks), or
    their lengths where larger."""
    return sum(
        max(path.stat().st_size, path.stat().st_blocks * 512)
        for path in folder.rglob("*")
        if path.is_file()
    )


def _predicted_and_written(
    client: TestClient, curator: Caller, dataset_id: str, body: dict[str, Any]
) -> tuple[int, int]:
    predicted, folder = _predicted_and_folder(client, curator, dataset_id, body)
    return predicted, _on_disk(folder)


def _predicted_and_folder(
    client: TestClient, curator: Caller, dataset_id: str, body: dict[str, Any]
) -> tuple[int, Path]:
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    predicted = preview.json()["artifact_bytes"]
    release = finished_release(client, curator, dataset_id, body)
    store = ArtifactStore(services_of(client).settings.releases_dir)
    return predicted, store.version_dir(uuid.UUID(release["id"]), release["published_version"])


TABLE_RELEASES: list[dict[str, Any]] = [
    {"mechanism": "smooth_synthetic", "epsilon": 1.0, "columns": CONTINUOUS},
    {"mechanism": "smooth_synthetic", "epsilon": 1.0, "delta": 1e-6, "columns": CONTINUOUS},
    {
        "mechanism": "smooth_synthetic",
        "epsilon": 1.0,
        "columns": CONTINUOUS[:3],
        "params": {"method": "moments", "grid_size": 2000, "sample_size": 3000},
    },
    {
        "mechanism": "randomized_response",
        "epsilon": 2.0,
        "columns": ["cat", "flag", CONTINUOUS[0], "movie"],
    },
    {"mechanism": "smooth_synopsis", "epsilon": 1.0, "columns": CONTINUOUS[:3]},
    {"mechanism": "compressed", "columns": CONTINUOUS[:2], "params": {"delta_max": 0.05}},
]


@pytest.mark.parametrize("body", TABLE_RELEASES, ids=lambda b: str(b.get("delta", b["mechanism"])))
def test_the_prediction_bounds_the_bytes_a_release_writes(
    client: TestClient, curator: Caller, body: dict[str, Any]
) -> None:
    predicted, written = _predicted_and_written(client, curator, _table(client, curator), body)
    assert 0 < written <= predicted


def test_the_prediction_bounds_a_graph_release(client: TestClient, curator: Caller) -> None:
    # a dense graph at a large epsilon: most pairs are edges
    vertices = 60
    edges = "\n".join(f"{u} {v}" for u in range(vertices) for v in range(u + 1, vertices))
    dataset_id = upload_graph(
        client,
        curator,
        edges.encode(),
        {"name": "g", "kind": "graph", "vertices": vertices, "budget": {"epsilon": 50}},
    ).json()["id"]
    body = {"mechanism": "graph_cuts", "epsilon": 20.0}
    predicted, written = _predicted_and_written(client, curator, dataset_id, body)
    assert 0 < written <= predicted


def test_a_release_predicted_past_the_cap_is_refused_with_nothing_reserved(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset_id = _table(client, curator)
    body: dict[str, Any] = {
        "mechanism": "smooth_synthetic",
        "epsilon": 1.0,
        "columns": CONTINUOUS,
        "params": {"grid_size": 2000, "sample_size": 400},
    }
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    predicted = preview.json()["artifact_bytes"]
    limit = predicted - 1
    monkeypatch.setattr(services_of(client).settings, "max_release_bytes", limit)

    for path in ("preview", "releases"):
        refused = client.post(
            f"/v1/datasets/{dataset_id}/{path}", headers=curator.headers, json=body
        )
        assert refused.status_code == 422, refused.text
        message = refused.json()["error"]["message"]
        assert f"({predicted} bytes)" in message
        assert "CURATOR_MAX_RELEASE_BYTES = " in message
        assert f"({limit} bytes)" in message
    assert budget(client, curator, dataset_id)["epsilon_reserved"] == 0
    assert rows_of(client, Release, dataset_id) == 0
    assert rows_of(client, LedgerEntry, dataset_id) == 0

    # at the cap it is taken; a re-synthesis that would write more is refused, the
    # release left as it was
    monkeypatch.setattr(services_of(client).settings, "max_release_bytes", predicted)
    accepted = request_release(client, curator, dataset_id, body)
    assert accepted.status_code == 202, accepted.text
    release_id = accepted.json()["id"]
    run_all(client, release_id)
    url = f"/v1/releases/{release_id}/resynthesize"
    again = client.post(url, headers=curator.headers, json={"params": {"sample_size": 5000}})
    assert again.status_code == 422, again.text
    assert "CURATOR_MAX_RELEASE_BYTES" in again.json()["error"]["message"]
    shown = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert (shown["status"], shown["synthesis_version"]) == ("succeeded", 0)
    smaller = client.post(url, headers=curator.headers, json={"params": {"sample_size": 100}})
    assert smaller.status_code == 202, smaller.text


def test_no_release_size_limit_at_zero(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(services_of(client).settings, "max_release_bytes", 0)
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "columns": CONTINUOUS}
    dataset_id = _table(client, curator)
    assert request_release(client, curator, dataset_id, body).status_code == 202


def test_the_prediction_bounds_json_of_non_ascii_names(client: TestClient, curator: Caller) -> None:
    """JSON escapes every non-ASCII character (``json.dumps``' ``ensure_ascii``): a name
    of 200 emoji is 800 bytes of UTF-8 and 2400 of ``synopsis.json`` (``\\ud83d\\ude00``
    each), three times its bytes, where the bound allowed two."""
    d, n = 300, 20
    names = [chr(0x1F600 + j % 64) * 197 + f"{j:03d}" for j in range(d)]
    rng = np.random.default_rng(7)
    values = rng.uniform(0.0, 1.0, (n, d))
    lines = [",".join(names)] + [",".join(repr(float(v)) for v in row) for row in values]
    schema = {
        "name": "wide",
        "columns": [{"name": c, "kind": "continuous", "lower": 0, "upper": 1} for c in names],
        "budget": {"epsilon": 10},
    }
    response = upload(client, curator, ("\n".join(lines) + "\n").encode(), schema)
    assert response.status_code == 201, response.text
    body = {"mechanism": "smooth_synopsis", "epsilon": 1.0, "params": {"basis_size": 1}}
    predicted, written = _predicted_and_written(client, curator, response.json()["id"], body)
    assert 0 < written <= predicted


def test_a_declared_public_max_bytes_bounds_randomized_responses_prediction() -> None:
    """A public cell was predicted at the 1024-byte cell limit (about 3.3 KB a row of CSV
    and Parquet), so a randomized_response release with a public column was refused past
    about 1.3 10^6 rows; declared ``max_bytes`` of 8 (a movie id), 10^7 rows predict well
    under the 4 GiB default. A declaration stored before ``max_bytes`` reads as 1024."""
    import app.releases.adapters  # noqa: F401  (registers the release types)
    from app.releases import registry
    from app.releases.registry import ColumnInfo, DatasetInfo

    mechanism = registry.get("randomized_response")
    params = mechanism.parse_params({})
    cap = 4 << 30

    def predicted(public: dict[str, Any]) -> int:
        columns = (
            ColumnInfo.from_declared(
                {"name": "rating", "kind": "categorical", "categories": ["1", "5"]}
            ),
            ColumnInfo.from_declared({"name": "flag", "kind": "binary"}),
            ColumnInfo.from_declared(public),
        )
        info = DatasetInfo(n_rows=10**7, columns=columns)
        return mechanism.artifact_bytes(info, 1.0, 0.0, params, {})

    old = {"name": "movie", "kind": "public"}  # as stored before max_bytes
    assert ColumnInfo.from_declared(old).max_bytes == 1024
    assert predicted(old) > cap
    assert predicted({**old, "max_bytes": 1024}) == predicted(old)
    assert predicted({**old, "max_bytes": 8}) < cap / 4


def _tight_public(i: int) -> str:
    """A distinct public cell of exactly 12 UTF-8 bytes, at a bound's worst in turn: two-,
    three- and four-byte characters, quotes (doubled in CSV) and a formula (quoted and
    prefixed with ``'``); distinct, so that Parquet's dictionary does not shrink them."""
    digits = f"{i:010d}"
    return [
        "é" + digits,
        "😀" + digits[2:],
        '""""' + digits[2:],
        '=""' + digits[1:],
        "€" + digits[1:],
    ][i % 5]


def test_the_prediction_bounds_a_release_of_public_cells_as_long_as_declared(
    client: TestClient, curator: Caller
) -> None:
    """With ``max_bytes`` declared tight (every cell exactly 12 bytes), the prediction
    still bounds the bytes written, and is smaller than with the default 1024."""
    import csv
    import io

    n = 30_000
    assert all(len(_tight_public(i).encode()) == 12 for i in range(10))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["movie", "flag"])
    writer.writerows([_tight_public(i), str(i % 2)] for i in range(n))
    ids = []
    for movie in (
        {"name": "movie", "kind": "public", "max_bytes": 12},
        {"name": "movie", "kind": "public"},
    ):
        schema = {
            "name": "tight",
            "columns": [movie, {"name": "flag", "kind": "binary"}],
            "budget": {"epsilon": 10},
        }
        response = upload(client, curator, text.getvalue().encode(), schema)
        assert response.status_code == 201, response.text
        ids.append(str(response.json()["id"]))
    body = {"mechanism": "randomized_response", "epsilon": 2.0, "columns": ["flag", "movie"]}
    predicted, folder = _predicted_and_folder(client, curator, ids[0], body)
    assert 0 < _on_disk(folder) <= predicted
    # each table file within its own bound: a bound's slack elsewhere (Parquet's, for
    # distinct values that compress) does not hide a CSV cell bound that is too tight
    names = ["flag", "movie"]
    csv_bound = sizes.csv_bytes(n, [2, sizes.csv_text_cell(12)], names)
    assert 0 < (folder / "sample.csv").stat().st_size <= csv_bound
    parquet_cells = [sizes.PARQUET_INT32_CELL, sizes.parquet_text_cell(12)]
    parquet_bound = sizes.parquet_bytes(n, parquet_cells, names, sample_chunk_rows(2))
    assert 0 < (folder / "sample.parquet").stat().st_size <= parquet_bound
    default = client.post(f"/v1/datasets/{ids[1]}/preview", headers=curator.headers, json=body)
    assert default.status_code == 200, default.text
    assert predicted < default.json()["artifact_bytes"]


def test_a_public_column_stored_before_max_bytes_reads_as_1024(
    client: TestClient, curator: Caller
) -> None:
    """A declaration stored before ``max_bytes`` (its public column without the field) is
    shown with 1024, and released with the prediction of a column declared with 1024; a
    new declaration stores the field, so a declaration read back is complete."""
    content = "movie,flag\n" + "".join(f"m{i},{i % 2}\n" for i in range(50))
    schema = {
        "name": "old",
        "columns": [{"name": "movie", "kind": "public"}, {"name": "flag", "kind": "binary"}],
        "budget": {"epsilon": 10},
    }
    response = upload(client, curator, content.encode(), schema)
    assert response.status_code == 201, response.text
    dataset_id = response.json()["id"]
    body = {"mechanism": "randomized_response", "epsilon": 1.0, "columns": ["flag", "movie"]}
    with services_of(client).db.transaction() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None
        assert dataset.columns[0] == {"name": "movie", "kind": "public", "max_bytes": 1024}
    before = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert before.status_code == 200, before.text
    with services_of(client).db.transaction() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None
        dataset.columns = [{"name": "movie", "kind": "public"}, dict(dataset.columns[1])]
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers)
    assert shown.status_code == 200, shown.text
    assert shown.json()["columns"][0]["max_bytes"] == 1024
    after = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert after.status_code == 200, after.text
    assert after.json()["artifact_bytes"] == before.json()["artifact_bytes"]
    predicted, written = _predicted_and_written(client, curator, dataset_id, body)
    assert 0 < written <= predicted
