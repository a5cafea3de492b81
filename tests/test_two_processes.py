"""Two API processes (and workers) sharing one database and data directory.

Two apps built by ``create_app`` on the same settings stand in for two processes: each has
its own engine, pool and queue handle, and only the database and the data directory are
shared (the in-process answer cache is a module's, so it is shared here: what these tests
check goes through the database and the disk, not through it)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.ledger import service as ledger
from app.main import create_app
from app.releases import service as releases_service
from app.releases import stages
from app.releases.service import lock_release
from app.releases.stages import WORKER
from tests.conftest import Caller, make_user
from tests.datasets.helpers import upload


@pytest.fixture
def other(settings: Settings) -> Iterator[TestClient]:
    """A second API process on the same settings (database, data directory, key)."""
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _table(client: TestClient, curator: Caller, n: int = 600) -> str:
    rng = np.random.default_rng(3)
    ages, weights = rng.uniform(0, 100, n).round(2), rng.uniform(40, 120, n).round(2)
    lines = ["age,weight"] + [f"{a},{w}" for a, w in zip(ages, weights, strict=True)]
    schema = {
        "name": "people",
        "columns": [
            {"name": "age", "kind": "continuous", "lower": 0, "upper": 100},
            {"name": "weight", "kind": "continuous", "lower": 20, "upper": 220},
        ],
        "budget": {"epsilon": 10, "delta": 1e-6},
    }
    response = upload(client, curator, ("\n".join(lines) + "\n").encode(), json.dumps(schema))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_an_opt_out_committed_by_another_process_before_the_lock_refuses_the_request(
    client: TestClient,
    other: TestClient,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A non-DP request re-checks the curator's opt-in when it is recorded, but read it
    before it took the dataset's lock: on PostgreSQL an opt-out committed by the other API
    process in between (its UPDATE held the row until its commit, for which the request's
    lock waited) was recorded anyway (202, a reservation of a release the curator had
    just withdrawn). It is read under the lock now (409). On SQLite the request's
    transaction holds the database's write lock from its start: no opt-out can commit
    in between."""
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises the write transactions whole")
    curator = make_user(client, "curator")
    dataset_id = _table(client, curator)
    opt = f"/v1/datasets/{dataset_id}"
    assert (
        client.patch(opt, headers=curator.headers, json={"allow_non_dp_releases": True}).status_code
        == 200
    )
    lock = releases_service.ledger.lock_dataset
    withdrawn: list[int] = []

    def opt_out_then_lock(session: Any, locked_id: Any) -> Any:
        if not withdrawn:  # the other process withdraws the opt-in, and commits
            response = other.patch(
                opt, headers=curator.headers, json={"allow_non_dp_releases": False}
            )
            withdrawn.append(response.status_code)
        return lock(session, locked_id)

    monkeypatch.setattr(releases_service.ledger, "lock_dataset", opt_out_then_lock)
    body = {"mechanism": "compressed", "params": {"delta_max": 0.05}}
    response = client.post(
        f"/v1/datasets/{dataset_id}/releases", headers=curator.headers, json=body
    )
    assert withdrawn == [200]
    assert response.status_code == 409, response.text
    assert "allow non-DP releases" in response.json()["error"]["message"]
    monkeypatch.undo()
    listed = other.get(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers).json()
    assert listed == []


def test_a_ledger_read_page_by_page_misses_no_entry_committed_meanwhile(
    client: TestClient, other: TestClient, database_url: str
) -> None:
    """The ledger is read by ``after_id``, "by id (the order they were written)". A
    reservation takes the dataset's lock, but a worker's spend (or a cancel's refund) took
    only the release's: on PostgreSQL its entry got its id, and a request on the other
    API process reserved (a larger id) and committed before the spend did. A reader
    between the two commits went past the spend's id and never saw it. Every entry of a
    dataset is now written under the dataset's lock, so ids follow the commits."""
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises the write transactions whole")
    curator = make_user(client, "curator")
    dataset_id = _table(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": 0.5}
    first = client.post(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers, json=body)
    assert first.status_code == 202, first.text
    services = client.app.state.services  # type: ignore[attr-defined]
    held, done = threading.Event(), threading.Event()

    def worker_spends() -> None:  # a worker storing the first release's measurements
        with services.db.transaction() as session:
            lock_release(session, uuid.UUID(first.json()["id"]))
            ledger.commit(session, uuid.UUID(first.json()["id"]), WORKER)
            held.set()
            time.sleep(1.0)
        done.set()

    spender = threading.Thread(target=worker_spends)
    spender.start()
    try:
        assert held.wait(10)
        second = other.post(
            f"/v1/datasets/{dataset_id}/releases", headers=curator.headers, json=body
        )
        assert second.status_code == 202, second.text
        budget = f"/v1/datasets/{dataset_id}/budget"
        seen = other.get(budget, headers=curator.headers).json()["entries"]
    finally:
        spender.join()
    assert done.is_set()
    rest = other.get(budget, headers=curator.headers, params={"after_id": seen[-1]["id"]}).json()[
        "entries"
    ]
    everything = other.get(budget, headers=curator.headers).json()["entries"]
    assert [e["kind"] for e in everything] == ["reserve", "commit", "reserve"]
    assert [e["id"] for e in seen + rest] == [e["id"] for e in everything]


def _non_dp_release(client: TestClient) -> tuple[Caller, str, Any]:
    """A curator, their table opted in to non-DP releases, and the response that requested
    a ``compressed`` release of it (queued, not measured)."""
    curator = make_user(client, "curator")
    dataset_id = _table(client, curator)
    opt = f"/v1/datasets/{dataset_id}"
    assert (
        client.patch(opt, headers=curator.headers, json={"allow_non_dp_releases": True}).status_code
        == 200
    )
    body = {"mechanism": "compressed", "params": {"delta_max": 0.05}}
    created = client.post(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers, json=body)
    assert created.status_code == 202, created.text
    return curator, dataset_id, created


def test_an_opt_out_committed_before_the_worker_starts_reading_stops_it(
    client: TestClient, other: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An opt-out withdraws a non-DP release "not yet measured: it ends failed without
    reading the data" (README). The worker read the opt-in in one transaction and
    recorded that it starts reading in the next: an opt-out that the other API process
    committed in between was not seen, and the worker read the data and measured.
    The opt-in is now read under the dataset's lock (the one the opt-out's update takes)
    in the transaction that records the start of the read."""
    curator, dataset_id, created = _non_dp_release(client)
    opt = f"/v1/datasets/{dataset_id}"
    start_reading = stages._start_reading
    withdrawn: list[int] = []

    def opt_out_then_start(*args: Any, **kwargs: Any) -> Any:
        response = other.patch(opt, headers=curator.headers, json={"allow_non_dp_releases": False})
        withdrawn.append(response.status_code)
        return start_reading(*args, **kwargs)

    monkeypatch.setattr(stages, "_start_reading", opt_out_then_start)
    services = client.app.state.services  # type: ignore[attr-defined]
    stages.run_measure(services, uuid.UUID(created.json()["id"]))
    assert withdrawn == [200]
    release = other.get(f"/v1/releases/{created.json()['id']}", headers=curator.headers).json()
    assert release["status"] == "failed", release
    assert "withdrew" in release["message"]
    assert release["measured_at"] is None
    entries = other.get(f"/v1/datasets/{dataset_id}/budget", headers=curator.headers).json()
    assert [e["kind"] for e in entries["entries"]] == []


def test_an_opt_out_after_the_worker_started_reading_does_not_stop_it(
    client: TestClient, other: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opt-in is read where the worker records that it starts reading, and not
    after: an opt-out committed once that record is committed finds the release
    "measuring" and neither stops its read nor its publication (the README says so: an
    opt-out ends failed only a release whose worker has not started reading)."""
    curator, dataset_id, created = _non_dp_release(client)
    opt = f"/v1/datasets/{dataset_id}"
    start_reading = stages._start_reading
    withdrawn: list[int] = []

    def start_then_opt_out(*args: Any, **kwargs: Any) -> Any:
        started = start_reading(*args, **kwargs)
        response = other.patch(opt, headers=curator.headers, json={"allow_non_dp_releases": False})
        withdrawn.append(response.status_code)
        return started

    monkeypatch.setattr(stages, "_start_reading", start_then_opt_out)
    services = client.app.state.services  # type: ignore[attr-defined]
    stages.run_measure(services, uuid.UUID(created.json()["id"]))
    assert withdrawn == [200]
    release = other.get(f"/v1/releases/{created.json()['id']}", headers=curator.headers).json()
    assert release["status"] == "synthesizing", release
    assert release["measured_at"] is not None
    entries = other.get(f"/v1/datasets/{dataset_id}/budget", headers=curator.headers).json()
    assert [e["kind"] for e in entries["entries"]] == ["non_dp"]
