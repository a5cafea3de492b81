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

from app.models import LedgerEntry, Release
from app.storage.artifacts import ArtifactStore
from tests.conftest import Caller
from tests.datasets.helpers import upload
from tests.datasets.test_graphs import upload_graph
from tests.releases.helpers import budget, request_release, rows_of, run_all, services_of

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
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    predicted = preview.json()["artifact_bytes"]
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "succeeded", release
    store = ArtifactStore(services_of(client).settings.releases_dir)
    folder = store.version_dir(uuid.UUID(release_id), release["published_version"])
    return predicted, _on_disk(folder)


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
