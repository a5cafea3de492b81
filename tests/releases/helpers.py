"""Helpers of the release tests."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient

from app.core.services import Services
from app.releases.stages import run_measure, run_synthesize
from tests.conftest import Caller
from tests.datasets.helpers import csv_bytes, upload

REQUEST: dict[str, Any] = {"mechanism": "test_means", "epsilon": 0.2}


def services_of(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def dataset(client: TestClient, curator: Caller, epsilon: float = 1.0, delta: float = 1e-6) -> str:
    from tests.datasets.helpers import SCHEMA

    schema = {**SCHEMA, "budget": {"epsilon": epsilon, "delta": delta}}
    response = upload(client, curator, csv_bytes(), schema)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def request_release(
    client: TestClient,
    caller: Caller,
    dataset_id: str,
    body: dict[str, Any] | None = None,
    key: str | None = None,
) -> Any:
    headers = dict(caller.headers)
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(f"/v1/datasets/{dataset_id}/releases", headers=headers, json=body or REQUEST)


def run_all(client: TestClient, release_id: str) -> None:
    services = services_of(client)
    run_measure(services, uuid.UUID(release_id))
    run_synthesize(services, uuid.UUID(release_id))


def budget(client: TestClient, caller: Caller, dataset_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/datasets/{dataset_id}/budget", headers=caller.headers)
    assert response.status_code == 200
    return dict(response.json())
