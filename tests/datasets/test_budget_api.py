"""GET/PATCH /v1/datasets/{id}/budget."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from app.core.services import Services
from app.ledger import service as ledger
from app.ledger.units import epsilon_units
from app.models import Release
from tests.conftest import Caller
from tests.datasets.helpers import csv_bytes, upload


def _reserve(
    client: TestClient, curator: Caller, dataset_id: uuid.UUID, epsilon: float, count: int = 1
) -> None:
    """``count`` reservations of ``epsilon`` on the dataset, each for a placeholder release
    of the curator's (the ledger's own entries, as a release request writes them)."""
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    with services.db.transaction() as session:
        for _ in range(count):
            release = Release(
                dataset_id=dataset_id,
                mechanism="test",
                epsilon=0,
                delta=0,
                params={},
                created_by=curator.id,
            )
            session.add(release)
            session.flush()
            ledger.reserve(
                session,
                dataset_id,
                release.id,
                epsilon_units(epsilon, charge=True),
                0,
                ledger.Actor.user(curator.id),
            )


def test_budget_shows_totals_and_entries(client: TestClient, curator: Caller) -> None:
    dataset_id = uuid.UUID(upload(client, curator, csv_bytes()).json()["id"])
    _reserve(client, curator, dataset_id, 0.3)
    body = client.get(f"/v1/datasets/{dataset_id}/budget", headers=curator.headers).json()
    assert body["epsilon_total"] == 1.0
    assert body["epsilon_reserved"] == 0.3
    assert body["epsilon_remaining"] == 0.7
    assert [(e["kind"], e["epsilon"], e["actor"]) for e in body["entries"]] == [
        ("reserve", 0.3, f"user:{curator.id}")
    ]


def test_curator_raises_and_lowers_totals(
    client: TestClient, curator: Caller, admin: Caller
) -> None:
    dataset_id = upload(client, curator, csv_bytes()).json()["id"]
    raised = client.patch(
        f"/v1/datasets/{dataset_id}/budget",
        headers=curator.headers,
        json={"epsilon": 4, "delta": 1e-5},
    )
    assert raised.status_code == 200, raised.text
    assert (raised.json()["epsilon_total"], raised.json()["delta_total"]) == (4.0, 1e-5)
    lowered = client.patch(
        f"/v1/datasets/{dataset_id}/budget", headers=curator.headers, json={"epsilon": 0.5}
    )
    assert lowered.json()["epsilon_remaining"] == 0.5
    bads = ({}, {"epsilon": 0}, {"epsilon": -1}, {"epsilon": 1e-13}, {"epsilon": 2e6})
    for bad in (*bads, {"delta": 1.0}, {"epsilon": 1, "x": 1}):
        response = client.patch(
            f"/v1/datasets/{dataset_id}/budget", headers=curator.headers, json=bad
        )
        assert response.status_code == 422, bad
    tiny = client.patch(
        f"/v1/datasets/{dataset_id}/budget", headers=curator.headers, json={"epsilon": 1e-13}
    )
    message = tiny.json()["error"]["message"]
    assert "epsilon (1e-13) must lie in [1e-12, 1e+06]" in message, message
    events = client.get("/v1/audit", headers=admin.headers).json()
    assert [e["action"] for e in events].count("dataset.budget_update") == 2


def test_patch_answers_the_first_page_and_links_the_next(
    client: TestClient, curator: Caller
) -> None:
    """PATCH answers as the budget's first page (100 entries by default) and, like GET,
    names the next page in its ``Link`` header, which a GET then reads."""
    dataset_id = uuid.UUID(upload(client, curator, csv_bytes()).json()["id"])
    _reserve(client, curator, dataset_id, 0.001, count=101)
    url = f"/v1/datasets/{dataset_id}/budget"
    patched = client.patch(url, headers=curator.headers, json={"epsilon": 2})
    assert patched.status_code == 200, patched.text
    entries = patched.json()["entries"]
    assert len(entries) == 100
    assert patched.json()["epsilon_reserved"] == 0.101  # totals over every entry
    assert "next" in patched.links, patched.headers
    rest = client.get(patched.links["next"]["url"], headers=curator.headers)
    assert rest.status_code == 200, rest.text
    assert len(rest.json()["entries"]) == 1
    assert rest.json()["entries"][0]["id"] > entries[-1]["id"]
    assert "link" not in rest.headers
