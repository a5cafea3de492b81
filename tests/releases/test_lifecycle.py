"""The release lifecycle through the API, with the worker stages run in-process."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import os
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text, update
from sqlalchemy.exc import DBAPIError, OperationalError

import tests.releases.fake_mechanism as fake  # registers test_means
from app.mechanisms.privacy import CostPart, PrivacyCost
from app.models import AuditEvent, Release, ReleaseMeasurement
from app.models.base import utcnow
from app.releases import stages
from app.releases.registry import Measured
from app.releases.service import QUEUED
from app.releases.stages import run_measure, run_synthesize, sweep
from app.storage import artifacts
from app.storage.artifacts import ArtifactStore
from tests.conftest import Caller
from tests.datasets.helpers import SENTINELS
from tests.releases.helpers import (
    REQUEST,
    Gate,
    budget,
    dataset,
    heartbeat_finds,
    heartbeat_sees_the_cancel,
    race_same_key,
    request_release,
    run_all,
    services_of,
    wait_for,
)


def _entries(client: TestClient, caller: Caller, dataset_id: str, release_id: str) -> list[str]:
    return [
        e["kind"]
        for e in budget(client, caller, dataset_id)["entries"]
        if e["release_id"] == release_id
    ]


def test_release_end_to_end(client: TestClient, curator: Caller, analyst: Caller) -> None:
    dataset_id = dataset(client, curator)
    response = request_release(client, curator, dataset_id)
    assert response.status_code == 202, response.text
    release = response.json()
    assert release["status"] == "queued"
    assert release["columns"] == ["age", "weight"]  # the continuous ones, by default
    assert release["guarantee"] == "differential privacy"
    assert budget(client, curator, dataset_id)["epsilon_reserved"] == 0.2
    assert services_of(client).queue.pending() == 1  # enqueued after commit

    run_measure(services_of(client), uuid.UUID(release["id"]))
    measured = client.get(f"/v1/releases/{release['id']}", headers=curator.headers).json()
    assert measured["status"] == "synthesizing"
    assert measured["privacy_cost"]["epsilon"] <= 0.2
    assert _entries(client, curator, dataset_id, release["id"]) == ["reserve", "commit"]
    assert budget(client, curator, dataset_id)["epsilon_spent"] == 0.2

    run_synthesize(services_of(client), uuid.UUID(release["id"]))
    done = client.get(f"/v1/releases/{release['id']}", headers=curator.headers).json()
    assert done["status"] == "succeeded"
    assert done["progress"] == 1.0
    assert {a["name"] for a in done["artifacts"]} == {"sample.csv", "sample.parquet", "means.json"}

    csv = client.get(f"/v1/releases/{release['id']}/synthetic?format=csv", headers=curator.headers)
    assert csv.status_code == 200
    table = pacsv.read_csv(io.BytesIO(csv.content))
    assert table.num_rows == 20
    assert all(0 <= v <= 100 for v in table["age"].to_pylist())
    assert all(20 <= v <= 220 for v in table["weight"].to_pylist())
    parquet = client.get(
        f"/v1/releases/{release['id']}/synthetic?format=parquet", headers=curator.headers
    )
    assert pq.read_table(io.BytesIO(parquet.content)).num_rows == 20

    # analysts: 404 everywhere without a grant, read access with one
    paths = [
        f"/v1/releases/{release['id']}",
        f"/v1/releases/{release['id']}/synthetic",
        f"/v1/releases/{release['id']}/artifacts/means.json",
        f"/v1/datasets/{dataset_id}/releases",
    ]
    for path in paths:
        assert client.get(path, headers=analyst.headers).status_code == 404, path
    assert (
        client.delete(f"/v1/releases/{release['id']}", headers=analyst.headers).status_code == 404
    )
    assert (
        client.post(
            f"/v1/releases/{release['id']}/resynthesize", headers=analyst.headers, json={}
        ).status_code
        == 404
    )
    client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    for path in paths:
        assert client.get(path, headers=analyst.headers).status_code == 200, path
    assert request_release(client, analyst, dataset_id).status_code == 403
    assert (
        client.delete(f"/v1/releases/{release['id']}", headers=analyst.headers).status_code == 403
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"mechanism": "nope", "epsilon": 1}, "unknown mechanism 'nope'"),
        ({"mechanism": "test_means", "epsilon": 0}, "epsilon (0.0) must be a positive"),
        ({"mechanism": "test_means", "epsilon": -1}, "epsilon (-1.0) must be a positive"),
        ({"mechanism": "test_means", "epsilon": 0.1, "delta": 1}, "delta (1.0) must lie in [0, 1)"),
        ({"mechanism": "test_means", "epsilon": 1e7}, "epsilon (10000000.0) must be at most 1e6"),
        ({"mechanism": "test_means", "epsilon": 1e30}, "must be at most 1e6"),
        ({"mechanism": "test_means", "epsilon": 0.1, "columns": ["blood"]}, "not: ['blood']"),
        (
            {"mechanism": "test_means", "epsilon": 0.1, "columns": ["nope"]},
            "columns not in the dataset: ['nope']",
        ),
        ({"mechanism": "test_means", "epsilon": 0.1, "columns": ["age", "age"]}, "distinct"),
        ({"mechanism": "test_means", "epsilon": 0.1, "params": {"bogus": 1}}, "params.bogus"),
        ({"mechanism": "test_means", "epsilon": 0.1, "params": {"rows": 0}}, "params.rows"),
    ],
)
def test_bad_requests_are_422_and_reserve_nothing(
    client: TestClient, curator: Caller, body: dict[str, object], fragment: str
) -> None:
    dataset_id = dataset(client, curator)
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 422, response.text
    assert fragment in response.json()["error"]["message"]
    assert budget(client, curator, dataset_id)["entries"] == []
    assert client.get(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers).json() == []


def test_budget_exhausted_is_409_with_what_remains(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator, epsilon=0.3)
    assert request_release(client, curator, dataset_id).status_code == 202
    response = request_release(client, curator, dataset_id)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "budget_exhausted"
    assert error["remaining"]["epsilon"] == pytest.approx(0.1)
    assert (
        len(client.get(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers).json()) == 1
    )
    assert services_of(client).queue.pending() == 1


def test_fifty_concurrent_requests_for_five(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator, epsilon=1.0)
    barrier = threading.Barrier(50)
    codes: list[int] = []
    lock = threading.Lock()

    def attempt() -> None:
        barrier.wait()
        code = request_release(client, curator, dataset_id).status_code
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=attempt) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(set(codes)) == [202, 409], codes
    assert codes.count(202) == 5
    summary = budget(client, curator, dataset_id)
    assert summary["epsilon_reserved"] == 1.0
    assert summary["epsilon_remaining"] == 0.0
    assert [e["kind"] for e in summary["entries"]] == ["reserve"] * 5
    assert services_of(client).queue.pending() == 5


def test_idempotent_retry_charges_once(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    first = request_release(client, curator, dataset_id, key="req-1")
    again = request_release(client, curator, dataset_id, key="req-1")
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == ["reserve"]
    other = request_release(client, curator, dataset_id, {**REQUEST, "epsilon": 0.3}, key="req-1")
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert services_of(client).queue.pending() == 1


def test_idempotent_retries_race(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    race_same_key(client, curator, dataset_id, REQUEST)
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == ["reserve"]


def _record_as(release: Release, dataset_id: str, params: dict[str, Any]) -> None:
    """Rewrite a smooth_synopsis release (epsilon 0.2, delta 0) as code that dumped its
    parameters as ``params`` recorded it: those parameters and the request hash over them
    (the canonical form of ``app.releases.service``, written out here as stored data)."""
    canonical = {
        "dataset": dataset_id,
        "mechanism": "smooth_synopsis",
        "epsilon": repr(0.2),
        "delta": repr(0.0),
        "columns": release.columns,
        "params": params,
    }
    release.params = params
    release.request_hash = hashlib.sha256(
        json.dumps(canonical, sort_keys=True).encode()
    ).hexdigest()


def test_an_idempotent_retry_finds_a_release_recorded_before_a_parameter_existed(
    client: TestClient, curator: Caller
) -> None:
    """A request's hash covers its parameters as the code of its day dumped them: a
    smooth_synopsis release recorded before ``co_spread`` existed hashed none. Its body
    retried with its key after the upgrade got 409 idempotency_key_reused (found by
    retrying, at head, a request recorded by the service at d652c5d, revision 0003); it
    gets that release again (200, charged once), and another body with the key still 409."""
    dataset_id = dataset(client, curator)
    body = {"mechanism": "smooth_synopsis", "epsilon": 0.2, "params": {"smoothness": 4}}
    first = request_release(client, curator, dataset_id, body, key="before-co-spread")
    assert first.status_code == 202, first.text
    release_id = uuid.UUID(first.json()["id"])
    with services_of(client).db.transaction() as session:  # as the older code recorded it
        release = session.get(Release, release_id)
        assert release is not None
        assert "co_spread" in release.params
        _record_as(
            release, dataset_id, {k: v for k, v in release.params.items() if k != "co_spread"}
        )
    again = request_release(client, curator, dataset_id, body, key="before-co-spread")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == str(release_id)
    for other in (
        {**body, "params": {"smoothness": 4, "co_spread": False}},
        {**body, "params": {"smoothness": 6}},
        {**body, "epsilon": 0.3},
    ):
        refused = request_release(client, curator, dataset_id, other, key="before-co-spread")
        assert refused.status_code == 409, other
        assert refused.json()["error"]["code"] == "idempotency_key_reused"
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == ["reserve"]


def test_an_idempotent_retry_finds_a_release_recorded_with_a_negative_zero_delta(
    client: TestClient, curator: Caller
) -> None:
    """Before cb29f94 a body's delta of -0.0 was kept with its sign and hashed as
    ``repr(-0.0)``; it is now read as 0.0, so the same body retried with its key after the
    upgrade hashed differently and got 409 idempotency_key_reused for a release it had
    made. It gets that release again (charged once), with -0.0 or 0.0; another delta with
    the key is still 409."""
    dataset_id = dataset(client, curator)
    body = {"mechanism": "smooth_synopsis", "epsilon": 0.2, "params": {"smoothness": 4}}
    first = request_release(client, curator, dataset_id, body, key="negative-zero-before")
    assert first.status_code == 202, first.text
    release_id = uuid.UUID(first.json()["id"])
    with services_of(client).db.transaction() as session:  # as the older code recorded it
        release = session.get(Release, release_id)
        assert release is not None
        _record_as(release, dataset_id, dict(release.params))
        canonical = {
            "dataset": dataset_id,
            "mechanism": "smooth_synopsis",
            "epsilon": repr(0.2),
            "delta": repr(-0.0),
            "columns": release.columns,
            "params": release.params,
        }
        release.delta = -0.0
        release.request_hash = hashlib.sha256(
            json.dumps(canonical, sort_keys=True).encode()
        ).hexdigest()
    headers = {
        **curator.headers,
        "Content-Type": "application/json",
        "Idempotency-Key": "negative-zero-before",
    }
    raw = json.dumps({**body, "delta": 0.0}).replace('"delta": 0.0', '"delta": -0.0')
    assert '"delta": -0.0' in raw
    again = client.post(f"/v1/datasets/{dataset_id}/releases", headers=headers, content=raw)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == str(release_id)
    zero = request_release(client, curator, dataset_id, body, key="negative-zero-before")
    assert zero.status_code == 200, zero.text
    assert zero.json()["id"] == str(release_id)
    other = request_release(
        client, curator, dataset_id, {**body, "delta": 1e-9}, key="negative-zero-before"
    )
    assert other.status_code == 409, other.text
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == ["reserve"]


def test_an_idempotent_retry_does_not_match_a_release_whose_parameter_was_since_removed(
    client: TestClient, curator: Caller
) -> None:
    """The other side of the retry rule: a release recorded with a parameter today's
    model no longer takes (its hash is this request's with its stored parameters, but
    they do not parse) was not recorded for this request: its key is 409, nothing
    charged again."""
    dataset_id = dataset(client, curator)
    body = {"mechanism": "smooth_synopsis", "epsilon": 0.2, "params": {"smoothness": 4}}
    first = request_release(client, curator, dataset_id, body, key="since-removed")
    assert first.status_code == 202, first.text
    with services_of(client).db.transaction() as session:  # as a later code recorded it
        release = session.get(Release, uuid.UUID(first.json()["id"]))
        assert release is not None
        _record_as(release, dataset_id, {**release.params, "a_parameter_since_removed": 1})
    again = request_release(client, curator, dataset_id, body, key="since-removed")
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "idempotency_key_reused"
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == ["reserve"]


def test_cancel_before_measuring_refunds(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]
    run_measure(services_of(client), uuid.UUID(release_id))  # the queued job finds nothing to do
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]
    assert client.delete(f"/v1/releases/{release_id}", headers=curator.headers).status_code == 409


def test_a_release_ended_before_measuring_says_it_cannot_be_resynthesised(
    client: TestClient, curator: Caller
) -> None:
    """A re-synthesis of a release that ended unmeasured is a 409 that says it never will
    have measurements (it said "no measurements yet", as to a release still running)."""
    dataset_id = dataset(client, curator)
    running = request_release(client, curator, dataset_id).json()["id"]
    url = f"/v1/releases/{running}/resynthesize"
    early = client.post(url, headers=curator.headers, json={"params": {}})
    assert early.status_code == 409
    assert early.json()["error"]["message"] == (
        "the release has no measurements yet; nothing to re-synthesise"
    )
    client.delete(f"/v1/releases/{running}", headers=curator.headers)
    ended = client.post(url, headers=curator.headers, json={"params": {}})
    assert ended.status_code == 409
    assert ended.json()["error"]["message"] == (
        "the release ended (cancelled) before it was measured; it has no measurements to "
        "re-synthesise: request a new release"
    )
    assert _entries(client, curator, dataset_id, running) == ["reserve", "refund"]


def _measuring_at_gate(
    client: TestClient,
    curator: Caller,
    tmp_path: Path,
    gate: str = "after_reading",
    params: dict[str, Any] | None = None,
) -> tuple[str, str, Gate, threading.Thread]:
    """A release of the fake mechanism (``params`` added to the request's) whose measure
    runs in a started worker thread and stands at ``gate`` until the test opens it:
    ``(dataset id, release id, the gate, the worker)``."""
    dataset_id = dataset(client, curator)
    held = Gate(tmp_path)
    body = {**REQUEST, "params": {**held.params(gate), **(params or {})}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    worker = threading.Thread(target=run_measure, args=(services_of(client), uuid.UUID(release_id)))
    worker.start()
    return dataset_id, release_id, held, worker


def _cancel_while_measuring(
    client: TestClient,
    curator: Caller,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gate: str,
    *,
    heartbeat_first: bool,
    **params: Any,
) -> tuple[str, str, dict[str, Any]]:
    """A release cancelled while its worker measures: the fake mechanism stands at
    ``gate`` until the cancel is recorded and, if ``heartbeat_first``, seen by the stage's
    heartbeat; ``params`` add to the request's. Returns the dataset, the release and its
    final state."""
    seen = heartbeat_sees_the_cancel(monkeypatch)
    dataset_id, release_id, held, worker = _measuring_at_gate(
        client, curator, tmp_path, gate, params
    )
    try:
        held.wait_reached()
        response = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
        assert response.json()["status"] == "measuring"
        assert response.json()["cancel_requested"] is True
        again = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
        assert (again.status_code, again.json()["message"]) == (200, response.json()["message"])
        if heartbeat_first:
            assert seen.wait(timeout=30), "the heartbeat did not see the cancel"
    finally:
        held.open()
        worker.join(timeout=60)
    with services_of(client).db.transaction() as session:  # the repeat recorded nothing
        cancels = session.scalars(
            select(AuditEvent.id).where(
                AuditEvent.action == "release.cancel", AuditEvent.object_id == release_id
            )
        ).all()
    assert len(cancels) == 1
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "cancelled"
    return dataset_id, release_id, final


def test_a_short_stage_publishes_its_progress_before_the_next_renewal(
    client: TestClient, curator: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals come every lease_seconds / 4 (15 s by default): a stage shorter than that
    showed progress 0 until it ended. A changed progress is published within
    PROGRESS_SECONDS (0.2 here): the measure stage's 0.99 after its one batch shows while
    the fake mechanism stands at its gate after reading, well within the 30 s the test
    waits (the lease of 600 s puts the first renewal 150 s away)."""
    monkeypatch.setattr(services_of(client).settings, "lease_seconds", 600.0)
    monkeypatch.setattr(stages, "PROGRESS_SECONDS", 0.2)
    _, release_id, held, worker = _measuring_at_gate(client, curator, tmp_path)
    seen: list[float] = []
    try:
        held.wait_reached()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen.append(
                client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()["progress"]
            )
            if seen[-1] > 0:
                break
            time.sleep(0.05)
    finally:
        held.open()
        worker.join(timeout=60)
    assert 0.99 in seen, seen[-5:]


def _stored(client: TestClient, release_id: str) -> bool:
    with services_of(client).db.transaction() as session:
        return session.get(ReleaseMeasurement, uuid.UUID(release_id)) is not None


def test_cancel_seen_before_reading_refunds(
    client: TestClient, curator: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat (every 0.1 s here) sees the cancel while the worker has yet to read
    a row: the progress callback of the first batch raises before the batch reaches the
    mechanism, so nothing was read and the reservation is refunded."""
    monkeypatch.setattr(services_of(client).settings, "lease_seconds", 0.4)
    dataset_id, release_id, final = _cancel_while_measuring(
        client, curator, tmp_path, monkeypatch, "before_reading", heartbeat_first=True
    )
    assert (
        final["message"] == "cancelled while measuring; nothing was read; the budget was refunded"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]
    assert not _stored(client, release_id)


def test_cancel_requested_between_the_claim_and_opening_the_data_refunds(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel recorded after the worker claimed the release but before it opened the
    data: the attempt saw it only at its heartbeat's next beat, after reading, so a short
    measurement completed and the release ended spent although no row had been read when
    the curator cancelled. The attempt now checks for a cancel where it records that it
    opens the data, under the release lock, and stops there: refunded."""
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    start_reading = stages._start_reading

    def cancelled_first(services: Any, claim: Any, mechanism: Any) -> bool:
        response = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
        assert response.json()["status"] == "measuring"
        return start_reading(services, claim, mechanism)

    monkeypatch.setattr(stages, "_start_reading", cancelled_first)
    run_measure(services_of(client), uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "cancelled"
    assert (
        final["message"] == "cancelled while measuring; nothing was read; the budget was refunded"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]
    assert not _stored(client, release_id)
    assert final["measured_at"] is None


def test_a_graph_cancel_seen_before_reading_refunds(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph's read publishes no progress (its edge count is private), and it had no
    cancellation point either: a cancel seen before the first edge was charged."""
    from app.releases.adapters.graph_cuts import GraphCuts
    from tests.datasets.test_graphs import upload_graph

    services = services_of(client)
    monkeypatch.setattr(services.settings, "lease_seconds", 0.4)
    seen = heartbeat_sees_the_cancel(monkeypatch)
    original, started = GraphCuts.measure, threading.Event()

    def held_start(self: GraphCuts, source: Any, *args: Any, **kwargs: Any) -> Any:
        started.set()
        if not seen.wait(timeout=30):  # the heartbeat (every 0.1 s) sees the cancel
            raise RuntimeError("the heartbeat did not see the cancel")
        return original(self, source, *args, **kwargs)

    monkeypatch.setattr(GraphCuts, "measure", held_start)
    graph_id = upload_graph(client, curator, b"0 1\n1 2\n2 3\n").json()["id"]
    body = {"mechanism": "graph_cuts", "epsilon": 1.0}
    release_id = request_release(client, curator, graph_id, body).json()["id"]
    worker = threading.Thread(target=run_measure, args=(services, uuid.UUID(release_id)))
    worker.start()
    assert started.wait(30)
    assert client.delete(f"/v1/releases/{release_id}", headers=curator.headers).status_code == 200
    worker.join(timeout=60)
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert (
        final["message"] == "cancelled while measuring; nothing was read; the budget was refunded"
    )
    assert final["progress"] == 0.0  # still no progress published
    assert _entries(client, curator, graph_id, release_id) == ["reserve", "refund"]


def test_cancel_seen_while_measuring_after_reading_spends(
    client: TestClient, curator: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN rule 6: refund only if nothing was measured. The mechanism reads the data
    twice; the heartbeat sees the cancel after the first batch and the next batch's
    progress call stops the measurement. The rows had been read, so the reservation is
    spent (it was refunded before) and nothing is stored."""
    monkeypatch.setattr(services_of(client).settings, "lease_seconds", 0.4)
    dataset_id, release_id, final = _cancel_while_measuring(
        client, curator, tmp_path, monkeypatch, "after_first_batch", heartbeat_first=True, passes=2
    )
    assert final["message"] == (
        "cancelled while measuring; the data may have been read, so the budget stays spent"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    assert not _stored(client, release_id)


@pytest.mark.parametrize("lease_seconds", [None, 0.4])
def test_cancel_seen_after_the_measurement_keeps_it(
    lease_seconds: float | None,
    client: TestClient,
    curator: Caller,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel that arrives after the last batch was read, whether the heartbeat sees it
    before the mechanism returns (a short lease: the mechanism waits for it) or only when
    the worker persists (the default lease), finds a complete measurement: it is stored
    and spent, and a re-synthesis reaches it (it was refunded and dropped before, and once
    the heartbeat saw it first)."""
    if lease_seconds is not None:
        monkeypatch.setattr(services_of(client).settings, "lease_seconds", lease_seconds)
    dataset_id, release_id, final = _cancel_while_measuring(
        client,
        curator,
        tmp_path,
        monkeypatch,
        "after_reading",
        heartbeat_first=lease_seconds is not None,
    )
    assert final["message"] == "cancelled after measuring; the budget stays spent"
    assert final["measured_at"] is not None
    assert _stored(client, release_id)
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize", headers=curator.headers, json={"params": {}}
    )
    assert again.status_code == 202, again.text
    _synthesizes_without_new_spend(client, curator, dataset_id, release_id)


def test_cancel_after_measuring_keeps_the_spend(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_measure(services_of(client), uuid.UUID(release_id))
    cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert cancelled["status"] == "cancelled"
    run_synthesize(services_of(client), uuid.UUID(release_id))
    assert (
        client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()["status"]
        == "cancelled"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    # the epsilon is spent, so the output stays reachable: a free re-synthesis runs
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize", headers=curator.headers, json={"params": {}}
    )
    assert again.status_code == 202, again.text
    assert again.json()["cancel_requested"] is False
    _synthesizes_without_new_spend(client, curator, dataset_id, release_id)


def _synthesizes_without_new_spend(
    client: TestClient, curator: Caller, dataset_id: str, release_id: str
) -> None:
    """The queued re-synthesis runs to success and the ledger holds only the first spend."""
    run_synthesize(services_of(client), uuid.UUID(release_id))
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]


def test_cancelled_resynthesis_can_be_run_again(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_all(client, release_id)
    url = f"/v1/releases/{release_id}/resynthesize"
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert cancelled["status"] == "succeeded"  # its published version is still served
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    _synthesizes_without_new_spend(client, curator, dataset_id, release_id)


def test_the_work_of_a_dead_synthesis_that_was_cancelled_is_removed(
    client: TestClient, curator: Caller
) -> None:
    """A worker killed in a synthesis leaves its temporary directory, which only the next
    claim of that run removed: when the curator cancelled the run instead (or re-synthesised),
    it stayed on disk for ever, even after later versions were published (found by
    killing a worker mid-synthesis and cancelling). The sweeper removes it; the work of a
    run still going stays."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    store = ArtifactStore(services.settings.releases_dir)
    ended, going = (request_release(client, curator, dataset_id).json()["id"] for _ in range(2))
    for release_id in (ended, going):
        run_measure(services, uuid.UUID(release_id))
    dead = store.begin(uuid.UUID(ended), 0)  # what the killed worker's claim left
    live = store.begin(uuid.UUID(going), 0)
    cancelled = client.delete(f"/v1/releases/{ended}", headers=curator.headers).json()
    assert cancelled["status"] == "cancelled"
    stages.Sweeper(services).start().stop()  # the worker's sweeper runs it first thing
    assert not dead.exists()
    assert live.exists()
    run_synthesize(services, uuid.UUID(going))
    assert not live.exists()  # published
    assert sorted(p.name for p in store.release_dir(uuid.UUID(going)).iterdir()) == ["v0"]


def test_the_work_of_an_earlier_synthesis_run_of_a_resynthesising_release_is_removed(
    client: TestClient, curator: Caller
) -> None:
    """Staleness is per version: a release synthesising a new version does not keep the
    work directory of an earlier run of it that was killed and cancelled."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    store = ArtifactStore(services.settings.releases_dir)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_all(client, release_id)
    url = f"/v1/releases/{release_id}/resynthesize"

    def version() -> int:
        with services.db.transaction() as session:
            release = session.get(Release, uuid.UUID(release_id))
            assert release is not None
            assert release.status == "synthesizing"
            return release.synthesis_version

    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    dead = store.begin(uuid.UUID(release_id), version())  # its killed worker's
    client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    live = store.begin(uuid.UUID(release_id), version())
    assert live != dead
    stages.Sweeper(services).start().stop()
    assert not dead.exists()
    assert live.exists()


def test_what_a_cut_short_removal_left_is_removed_by_the_sweeper(
    client: TestClient, curator: Caller
) -> None:
    """A version is renamed to ``.trash-*`` before it is deleted; a process that died
    in the deletion left it, and only that release's next prune removed it, so a release
    never re-synthesised kept it for ever. The sweeper removes it (and the release's
    directory, if that leaves it empty); the published version stays."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    store = ArtifactStore(services.settings.releases_dir)
    published = request_release(client, curator, dataset_id).json()["id"]
    run_all(client, published)
    left = store.release_dir(uuid.UUID(published)) / ".trash-0123456789abcdef"
    (left / "nested").mkdir(parents=True)
    (left / "nested" / "support.csv").write_text("x\n1\n")
    emptied = store.release_dir(uuid.uuid4()) / ".trash-fedcba9876543210"
    emptied.mkdir(parents=True)
    stages.Sweeper(services).start().stop()
    assert not left.exists()
    assert not emptied.parent.exists()
    names = sorted(p.name for p in store.release_dir(uuid.UUID(published)).iterdir())
    assert names == ["v0"]
    status = client.get(f"/v1/releases/{published}", headers=curator.headers).json()["status"]
    assert status == "succeeded"


def test_the_sweepers_later_passes_list_the_work_directory_only(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sweeper pass listed every release's directory, published ones included, for
    the leftovers of dead runs (10^5 published releases: 7 s a pass every 30 s on SQLite,
    bench/results/sweeper_history_*). The runs' work now lives under one directory
    (``.work``), which a pass lists alone, so a pass costs the runs that exist; only the
    first pass after a start lists the releases' directories (what releases stored before
    kept there). A dead run's work is still removed by a later pass."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    store = ArtifactStore(services.settings.releases_dir)
    published = [request_release(client, curator, dataset_id).json()["id"] for _ in range(3)]
    for release_id in published:
        run_all(client, release_id)
    ended = request_release(client, curator, dataset_id).json()["id"]
    run_measure(services, uuid.UUID(ended))
    dead = store.begin(uuid.UUID(ended), 0)  # what a killed worker's claim left
    client.delete(f"/v1/releases/{ended}", headers=curator.headers)
    listed: list[Path] = []
    real_listed = artifacts._listed

    def spied(folder: Path, pattern: str) -> list[Path]:
        listed.append(folder)
        return real_listed(folder, pattern)

    monkeypatch.setattr(artifacts, "_listed", spied)
    with services.db.transaction(read_only=True) as session:
        assert stages.remove_stale_work(session, services) == 1
    assert not dead.exists()
    release_dirs = {store.release_dir(uuid.UUID(r)) for r in published}
    assert release_dirs.isdisjoint(listed), listed
    listed.clear()
    with services.db.transaction(read_only=True) as session:
        stages.remove_stale_work(session, services, legacy=True)
    assert release_dirs <= set(listed)


def test_a_synthesis_claim_whose_lease_ran_out_leaves_the_new_owners_work_alone(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker held up between its claim of a synthesis and the start of its work (a
    pause, a frozen VM) lost its lease meanwhile, and the sweeper handed the run to another
    worker, which began writing it. The stale worker, resuming, started its work by
    removing every temporary directory of that version, the new owner's included, so the
    live run failed on a missing file (found by stopping and continuing workers in
    synthesis, SIGSTOP/SIGCONT). A claim begins its work only while it holds the lease."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_measure(services, uuid.UUID(release_id))
    held, resume = threading.Event(), threading.Event()
    claim = stages._claim

    def held_claim(*args: Any) -> Any:
        taken = claim(*args)
        if threading.current_thread().name == "stale":
            held.set()
            assert resume.wait(timeout=30)
        return taken

    monkeypatch.setattr(stages, "_claim", held_claim)
    stale = threading.Thread(
        target=run_synthesize, args=(services, uuid.UUID(release_id)), name="stale"
    )
    stale.start()
    try:
        assert held.wait(timeout=30)
        with services.db.transaction() as session:  # its lease runs out
            release = session.get(Release, uuid.UUID(release_id))
            assert release is not None
            release.lease_expires_at = release.created_at
        assert sweep(services) == 1
        synthesize = fake.TestMeans.synthesize

        def new_owner_mid_run(self: fake.TestMeans, *args: Any) -> Any:
            if threading.current_thread().name != "stale":
                resume.set()  # the stale worker resumes while the new owner works
                stale.join(timeout=30)
            return synthesize(self, *args)

        monkeypatch.setattr(fake.TestMeans, "synthesize", new_owner_mid_run)
        run_synthesize(services, uuid.UUID(release_id))
    finally:
        resume.set()
        stale.join(timeout=30)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    assert done["published_version"] == 0
    csv = client.get(f"/v1/releases/{release_id}/synthetic?format=csv", headers=curator.headers)
    assert csv.status_code == 200


@pytest.mark.parametrize("cancelled", [True, False])
def test_a_synthesis_claim_lost_before_it_starts_says_why(
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
    caplog: Any,
    cancelled: bool,
) -> None:
    """A synthesis whose release is cancelled between its claim and its start does nothing.
    It was logged as a WARNING "lease lost before synthesizing", which the concurrency
    audit saw after every such cancel and an operator reads as a fault; it is now an INFO
    "cancelled before synthesizing". A claim taken over by another worker (the lease ran
    out) is still a warning."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_measure(services, uuid.UUID(release_id))
    claim = stages._claim

    def then_lost(*args: Any) -> Any:
        taken = claim(*args)
        if cancelled:
            response = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
            assert response.json()["status"] == "cancelled", response.text
        else:
            with services.db.transaction() as session:
                session.execute(
                    update(Release)
                    .where(Release.id == uuid.UUID(release_id))
                    .values(lease_owner="another-worker")
                )
        return taken

    monkeypatch.setattr(stages, "_claim", then_lost)
    with caplog.at_level("INFO", logger="curator.releases"):
        run_synthesize(services, uuid.UUID(release_id))
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if "before synth" in r.getMessage()
    ]
    if cancelled:
        assert said == [
            ("INFO", f"release {release_id}: cancelled before synthesizing; nothing done")
        ]
    else:
        assert said == [
            ("WARNING", f"release {release_id}: lease lost before synthesizing; nothing done")
        ]


def test_a_cancelled_synthesis_whose_work_was_removed_is_not_logged_as_failed(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A re-synthesis cancelled while its worker computes: the sweeper removes the run's
    work directory (the run is over) and the worker, writing into it, hits a missing file.
    That is the end of a cancelled run, not a failure: it was logged as an ERROR, "synthesize
    failed with FileNotFoundError" and a traceback, once per cancelled run (seen in the
    production topology's logs, re-syntheses cancelled while analysts downloaded)."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_all(client, release_id)
    url = f"/v1/releases/{release_id}/resynthesize"
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    synthesize = fake.TestMeans.synthesize

    def cancelled_meanwhile(self: fake.TestMeans, *args: Any) -> Any:
        cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
        assert cancelled.json()["status"] == "succeeded"  # version 0 is still served
        stages.Sweeper(services).start().stop()  # removes the work of the run that is over
        return synthesize(self, *args)

    monkeypatch.setattr(fake.TestMeans, "synthesize", cancelled_meanwhile)
    with caplog.at_level("WARNING", logger="curator.releases"):
        run_synthesize(services, uuid.UUID(release_id))
    assert not [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("lease lost while synthesizing" in r.getMessage() for r in caplog.records)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    assert done["published_version"] == 0
    assert "cancelled by the curator" in done["message"]


def _dead_measure_attempts(
    client: TestClient, release_id: str, count: int, *, opened: bool
) -> None:
    """As if ``count`` measure attempts had claimed the release and their workers died
    (re-queued by the sweeper), after opening the data if ``opened``."""
    with services_of(client).db.transaction() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        release.status, release.attempts, release.lease_owner = "measuring", count, QUEUED
        release.read_started_at = utcnow() if opened else None


def _served(client: TestClient, caller: Caller, release_id: str) -> tuple[int, Any]:
    """The status of a download of ``means.json`` and its content when 200."""
    response = client.get(f"/v1/releases/{release_id}/artifacts/means.json", headers=caller.headers)
    return response.status_code, response.json() if response.status_code == 200 else None


def _released_then_resynthesizing(
    client: TestClient, curator: Caller, analyst: Caller
) -> tuple[str, str, Any, Any]:
    """A release granted to ``analyst``, its version 0 served to them, and a re-synthesis
    of it requested: ``(dataset id, release id, what the analyst was served, the 202
    response)``."""
    dataset_id = dataset(client, curator)
    client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_all(client, release_id)
    first = _served(client, analyst, release_id)
    assert first[0] == 200
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"rows": 3}},
    )
    assert again.status_code == 202, again.text
    return dataset_id, release_id, first, again


def test_a_download_that_read_the_version_before_a_resynthesis_published_is_served(
    client: TestClient, curator: Caller, analyst: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download reads the published version, then opens its file. A re-synthesis that
    publishes in between must not take that file away: an audit hammering downloads while
    re-synthesising got 500s (the file vanished between the check and the open), 404s
    ("missing on disk") and truncated bodies, on the version README says stays served."""
    from app.releases import downloads

    _, release_id, first, _ = _released_then_resynthesizing(client, curator, analyst)
    path_of = downloads.ArtifactStore.path

    def published_meanwhile(self: Any, *args: Any) -> Path:
        monkeypatch.setattr(downloads.ArtifactStore, "path", path_of)
        run_synthesize(services_of(client), uuid.UUID(release_id))  # publishes version 1
        return path_of(self, *args)

    monkeypatch.setattr(downloads.ArtifactStore, "path", published_meanwhile)
    assert _served(client, analyst, release_id) == first  # version 0, read before
    latest = client.get(f"/v1/releases/{release_id}", headers=analyst.headers).json()
    assert (latest["status"], latest["published_version"]) == ("succeeded", 1)
    assert _served(client, analyst, release_id)[0] == 200


def _two_publishes(client: TestClient, curator: Caller, release_id: str) -> None:
    """Publish the re-synthesis requested (version 1), then another (version 2): the
    publish of version 2 prunes version 0."""
    services = services_of(client)
    run_synthesize(services, uuid.UUID(release_id))
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"rows": 4}},
    )
    assert again.status_code == 202, again.text
    run_synthesize(services, uuid.UUID(release_id))


def test_a_download_whose_version_two_publishes_pruned_before_it_opened_serves_the_newest(
    client: TestClient, curator: Caller, analyst: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two publishes between a download's read of the release and its open of the file
    prune the version it read: it answered 404 "missing on disk". It reads the release
    again and serves the newest version, as a download made after them would."""
    from app.releases import downloads

    _, release_id, _, _ = _released_then_resynthesizing(client, curator, analyst)
    path_of = downloads.ArtifactStore.path

    def two_publishes_meanwhile(self: Any, *args: Any) -> Path:
        monkeypatch.setattr(downloads.ArtifactStore, "path", path_of)
        _two_publishes(client, curator, release_id)
        gone = path_of(self, *args)
        assert not gone.exists()
        return gone

    monkeypatch.setattr(downloads.ArtifactStore, "path", two_publishes_meanwhile)
    status, served = _served(client, analyst, release_id)
    latest = client.get(f"/v1/releases/{release_id}", headers=analyst.headers).json()
    assert latest["published_version"] == 2
    assert (status, served) == _served(client, analyst, release_id)
    assert status == 200


@pytest.mark.parametrize("ranged", [False, True])
def test_a_download_outlives_two_publishes_after_its_response_was_made(
    client: TestClient,
    curator: Caller,
    analyst: Caller,
    monkeypatch: pytest.MonkeyPatch,
    ranged: bool,
) -> None:
    """Two publishes between a download's endpoint and the sending of its body prune the
    version it read (a publish keeps only itself and the version it replaces). The
    response opened the file by its path when sent, so it found it gone: Starlette's
    RuntimeError, a 500 (found possible, not reproduced, by the concurrency audit). It now
    holds the file open from the endpoint on, and serves the version it read, whole or by
    range."""
    from app.releases import downloads

    _, release_id, first, _ = _released_then_resynthesizing(client, curator, analyst)
    made = downloads.OpenedFileResponse.__init__

    def then_two_publishes(self: Any, path: Path, **kwargs: Any) -> None:
        made(self, path, **kwargs)
        monkeypatch.setattr(downloads.OpenedFileResponse, "__init__", made)
        _two_publishes(client, curator, release_id)
        assert not path.exists()

    url = f"/v1/releases/{release_id}/artifacts/means.json"
    version_0 = client.get(url, headers=analyst.headers).content
    assert json.loads(version_0) == first[1]
    monkeypatch.setattr(downloads.OpenedFileResponse, "__init__", then_two_publishes)
    headers = {**analyst.headers, **({"Range": "bytes=0-4"} if ranged else {})}
    response = client.get(url, headers=headers)
    assert response.status_code == (206 if ranged else 200), response.text
    assert response.content == (version_0[:5] if ranged else version_0)
    latest = client.get(f"/v1/releases/{release_id}", headers=analyst.headers).json()
    assert latest["published_version"] == 2


def test_the_download_response_opens_its_file_through_the_hook_it_overrides(
    tmp_path: Path,
) -> None:
    """:class:`~app.releases.downloads.OpenedFileResponse` overrides Starlette's private
    ``FileResponse._open_file`` (Starlette 1.8 on; before it, the handlers opened the path
    themselves and the override was never used). Served over ASGI, whole and by range,
    the body comes through the override, from the descriptor opened when the response
    was made, after the path is gone."""
    import asyncio

    from starlette.responses import FileResponse

    from app.releases import downloads

    assert "_open_file" in FileResponse.__dict__
    path = tmp_path / "artifact.csv"
    path.write_bytes(b"0123456789")
    opened: list[int] = []
    hook = downloads.OpenedFileResponse._open_file

    def counted(self: Any) -> Any:
        opened.append(1)
        return hook(self)

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for headers, expected in (([], b"0123456789"), ([(b"range", b"bytes=2-4")], b"234")):
        response = downloads.OpenedFileResponse(path, media_type="text/csv")
        path.unlink()
        response._open_file = counted.__get__(response)  # type: ignore[method-assign]
        scope = {
            "type": "http",
            "method": "GET",
            "headers": headers,
            "asgi": {"spec_version": "2.4"},
        }
        sent.clear()
        asyncio.run(response(scope, receive, send))
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        assert body == expected
        path.write_bytes(b"0123456789")
    assert len(opened) == 2


def test_downloads_close_their_files(client: TestClient, curator: Caller, analyst: Caller) -> None:
    """A download's response holds its file open from the endpoint on
    (:class:`~app.releases.downloads.OpenedFileResponse`) and closes it once sent: twenty
    downloads, whole and by range, leave the process's open descriptors as they were."""
    _, release_id, _, _ = _released_then_resynthesizing(client, curator, analyst)
    url = f"/v1/releases/{release_id}/artifacts/means.json"
    client.get(url, headers=analyst.headers)  # whatever a first request opens for good
    before = len(os.listdir("/proc/self/fd"))
    for index in range(20):
        headers = {**analyst.headers, **({"Range": "bytes=0-3"} if index % 2 else {})}
        assert client.get(url, headers=headers).status_code in (200, 206)
    assert len(os.listdir("/proc/self/fd")) <= before


@pytest.mark.parametrize(
    ("range_", "status", "part"),
    [
        ("bytes=0-3", 206, slice(0, 4)),
        ("items=0-1", 200, slice(None)),  # a unit the server does not know: ignored
        ("bytes=5-1", 200, slice(None)),  # a range that does not parse: ignored
        ("bytes=", 200, slice(None)),
        ("bytes=100000000-", 416, slice(0, 0)),  # past the end
    ],
)
def test_a_range_the_download_cannot_use_is_ignored_and_one_past_the_end_is_416(
    client: TestClient,
    curator: Caller,
    analyst: Caller,
    range_: str,
    status: int,
    part: slice,
) -> None:
    """RFC 9110 section 14.2: a ``Range`` of another unit, or one that does not parse, is
    ignored: the whole file, 200 (Starlette answered a plain-text 400, outside the error
    body and the documented statuses; fuzz audit). Both 206 and 416 are documented."""
    _, release_id, _, _ = _released_then_resynthesizing(client, curator, analyst)
    url = f"/v1/releases/{release_id}/artifacts/means.json"
    whole = client.get(url, headers=analyst.headers).content
    response = client.get(url, headers={**analyst.headers, "Range": range_})
    assert response.status_code == status, response.text
    assert response.content == whole[part]
    if status == 416:
        assert response.headers["content-range"] == f"bytes */{len(whole)}"
    documented = client.app.openapi()["paths"]["/v1/releases/{release_id}/artifacts/{name}"]
    assert {"200", "206", "416"} <= set(documented["get"]["responses"])


@pytest.mark.parametrize("ending", ["cancelled", "failed", "gave up"])
def test_a_resynthesis_leaves_the_published_version_served(
    ending: str,
    client: TestClient,
    curator: Caller,
    analyst: Caller,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a re-synthesis runs, and after it is cancelled, fails or is given up (its
    workers died), the version already released stays served to the analyst, and the
    release is ``succeeded`` again with that version's parameters (an audit saw a cancelled
    re-synthesis turn the release into ``cancelled`` with every download a 409)."""
    from tests.releases.fake_mechanism import TestMeans

    dataset_id, release_id, first, again = _released_then_resynthesizing(client, curator, analyst)
    running = again.json()
    assert running["status"] == "synthesizing"
    assert running["published_version"] == 0
    assert running["synthesis_version"] == 1
    assert {a["name"] for a in running["artifacts"]} == {
        "sample.csv",
        "sample.parquet",
        "means.json",
    }
    assert _served(client, analyst, release_id) == first
    if ending == "cancelled":
        client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
        run_synthesize(services_of(client), uuid.UUID(release_id))  # the queued job: nothing
    elif ending == "failed":

        def fail(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError("value 37.123456 must never reach a client")

        monkeypatch.setattr(TestMeans, "synthesize", fail)
        run_synthesize(services_of(client), uuid.UUID(release_id))
    else:
        with services_of(client).db.transaction() as session:  # claims whose workers died
            release = session.get(Release, uuid.UUID(release_id))
            assert release is not None
            release.attempts = stages.MAX_SYNTHESIZE_ATTEMPTS
        run_synthesize(services_of(client), uuid.UUID(release_id))
    done = client.get(f"/v1/releases/{release_id}", headers=analyst.headers).json()
    assert done["status"] == "succeeded", done
    assert done["published_version"] == 0
    assert done["synthesis_params"] == {}  # the published version's, not the run's rows = 3
    word = {"cancelled": "cancelled", "failed": "failed", "gave up": "failed"}[ending]
    assert done["message"].startswith(f"re-synthesis (version 1) {word}: ")
    assert done["message"].endswith("version 0 is still served")
    assert "37.123456" not in done["message"]
    assert _served(client, analyst, release_id) == first
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    # and a later run publishes its own version
    client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"rows": 4}},
    )
    monkeypatch.undo()
    run_synthesize(services_of(client), uuid.UUID(release_id))
    latest = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert (latest["status"], latest["published_version"]) == ("succeeded", 2)
    assert latest["synthesis_params"] == {"rows": 4}
    sample = client.get(f"/v1/releases/{release_id}/synthetic", headers=analyst.headers)
    assert pacsv.read_csv(io.BytesIO(sample.content)).num_rows == 4


def test_a_synthesis_whose_workers_keep_dying_is_given_up(
    client: TestClient, curator: Caller
) -> None:
    """A synthesis claimed ``MAX_SYNTHESIZE_ATTEMPTS`` times (its workers died, e.g. out
    of memory) ends failed at the next claim, measurements and spend kept, instead of
    being handed to a worker after every restart. The count starts again with the
    synthesis: two dead measure attempts before it do not count."""
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    _dead_measure_attempts(client, release_id, 2, opened=True)
    run_measure(services_of(client), uuid.UUID(release_id))
    for _ in range(stages.MAX_SYNTHESIZE_ATTEMPTS):  # claims whose workers died
        with services_of(client).db.transaction() as session:
            release = session.get(Release, uuid.UUID(release_id))
            assert release is not None
            assert release.status == "synthesizing"
            release.attempts += 1
    run_synthesize(services_of(client), uuid.UUID(release_id))
    failed = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert failed["status"] == "failed"
    assert failed["message"].startswith(
        f"the synthesis was attempted {stages.MAX_SYNTHESIZE_ATTEMPTS} times"
    )
    assert failed["published_version"] is None
    assert failed["artifacts"] == []
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    assert _stored(client, release_id)
    # a re-synthesis starts its own count
    url = f"/v1/releases/{release_id}/resynthesize"
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    _synthesizes_without_new_spend(client, curator, dataset_id, release_id)


def test_a_synthesis_after_dead_measure_attempts_is_not_given_up(
    client: TestClient, curator: Caller
) -> None:
    """Claims of the measure stage do not count against the synthesis."""
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    _dead_measure_attempts(client, release_id, 2, opened=True)
    run_all(client, release_id)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done


@pytest.mark.parametrize(
    ("fail_in", "outcome", "entries"),
    [
        ("measure_before_reading", "nothing was read; the budget was refunded", "refund"),
        # a refunded failure after reading could depend on the data and be repeated for free
        ("measure", "the data may have been read, so the budget stays spent", "commit"),
    ],
)
def test_measure_failure_refunds_only_before_reading(
    fail_in: str, outcome: str, entries: str, client: TestClient, curator: Caller
) -> None:
    dataset_id = dataset(client, curator)
    body = {**REQUEST, "params": {"fail_in": fail_in}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers)
    assert release.json()["status"] == "failed"
    assert (
        release.json()["message"] == f"internal error (RuntimeError); see the worker log; {outcome}"
    )
    assert all(value not in release.text for value in SENTINELS)
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", entries]


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    [
        (0.2 * (1 + 1e-10), 0.0),  # past within()'s relative tolerance of 1e-12 (was 1e-9)
        (0.1, 1e-12),  # any delta over a reservation of delta = 0
    ],
)
def test_a_measurement_costing_more_than_its_reservation_is_not_kept(
    epsilon: float,
    delta: float,
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run_measure refuses a measurement whose reported privacy cost exceeds the release's
    reservation (epsilon 0.2, delta 0): the release fails, no measurement is stored and,
    the data having been read, the reservation is spent (reserve, commit), never more."""
    measure = fake.TestMeans.measure

    def over_reporting(self: fake.TestMeans, *args: Any, **kwargs: Any) -> Measured:
        measured = measure(self, *args, **kwargs)
        cost = PrivacyCost.compose([CostPart("means", epsilon, delta)])
        return dataclasses.replace(measured, privacy_cost=cost)

    monkeypatch.setattr(fake.TestMeans, "measure", over_reporting)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "failed", release
    assert release["message"] == (
        "internal error (RuntimeError); see the worker log; "
        "the data may have been read, so the budget stays spent"
    )
    assert release["privacy_cost"] is None
    assert not _stored(client, release_id)
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    summary = budget(client, curator, dataset_id)
    assert (summary["epsilon_spent"], summary["delta_spent"]) == (0.2, 0.0)


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
@pytest.mark.parametrize("opened", [True, False])
def test_a_measure_retried_after_a_lost_worker_refunds_only_if_nothing_was_opened(
    ending: str, opened: bool, client: TestClient, curator: Caller
) -> None:
    """The sweeper re-queues a measure whose worker died. If that attempt had opened the
    data (``read_started_at`` set), a retry that ends without measurements, even before
    reading anything itself, keeps the spend (it was refunded). If it died before opening
    the data, nothing was read and the retry's end refunds (it was spent)."""
    dataset_id = dataset(client, curator)
    params = {"fail_in": "measure_before_reading"} if ending == "failed" else {}
    release_id = request_release(client, curator, dataset_id, {**REQUEST, "params": params})
    release_id = release_id.json()["id"]
    _dead_measure_attempts(client, release_id, 1, opened=opened)
    if ending == "cancelled":
        cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
        assert cancelled.json()["cancel_requested"] is True
    run_measure(services_of(client), uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == ending
    if opened:
        assert final["message"].endswith("the data may have been read, so the budget stays spent")
        assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    else:
        assert final["message"].endswith("refunded")
        assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]


def test_an_attempt_records_that_it_opened_the_data_before_reading(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_started_at`` is committed before the first row is read (the mechanism sees
    it set), and an attempt that then fails before reading any row is still refunded."""
    services = services_of(client)
    dataset_id = dataset(client, curator)
    body = {**REQUEST, "params": {"fail_in": "measure_before_reading"}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    seen: list[object] = []
    original = stages.EncryptedTableSource

    def spying(*args: object, **kwargs: object) -> object:
        with services.db.transaction(read_only=True) as session:
            release = session.get(Release, uuid.UUID(release_id))
            assert release is not None
            seen.append(release.read_started_at)
        return original(*args, **kwargs)

    monkeypatch.setattr(stages, "EncryptedTableSource", spying)
    run_measure(services, uuid.UUID(release_id))
    assert len(seen) == 1
    assert seen[0] is not None
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "failed"
    assert final["message"].endswith("nothing was read; the budget was refunded")
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]


def test_a_measurement_that_cannot_be_stored_ends_the_release_spent(
    client: TestClient, curator: Caller
) -> None:
    """Storing a complete measurement failed outside the stage's error handling: the
    release stayed measuring with its reservation open, and every sweep handed it to
    another attempt that read the data again and drew fresh noise."""
    dataset_id = dataset(client, curator)
    body = {**REQUEST, "params": {"fail_in": "persist"}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_measure(services_of(client), uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "failed"
    assert final["message"].startswith("internal error (")  # the class depends on the driver
    assert final["message"].endswith(
        "see the worker log; the data may have been read, so the budget stays spent"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    assert not _stored(client, release_id)


def test_a_measurement_whose_connection_drops_while_stored_is_stored_on_a_retry(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database's connection dropped in the transaction that stores a finished
    measurement (a PostgreSQL restart or failover; a SQLite lock held past its busy
    timeout): the release ended failed and spent, its measurement thrown away, where the
    same transaction commits once the database is back. The store is tried again with the
    same measurement: one draw, one spend, and the release goes on to its synthesis."""
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    monkeypatch.setattr(stages, "PERSIST_RETRY_DELAY", 0.01)
    commit, failures = stages.ledger.commit, []
    measured: list[Measured] = []
    measure = fake.TestMeans.measure

    def drops_twice(session: Any, *args: Any) -> Any:
        if len(failures) < 2:
            failures.append(1)
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return commit(session, *args)

    def recorded(self: Any, *args: Any, **kwargs: Any) -> Measured:
        measured.append(measure(self, *args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(stages.ledger, "commit", drops_twice)
    monkeypatch.setattr(fake.TestMeans, "measure", recorded)
    run_measure(services_of(client), uuid.UUID(release_id))
    monkeypatch.undo()
    assert len(failures) == 2
    assert len(measured) == 1
    with services_of(client).db.transaction() as session:
        stored = session.get(ReleaseMeasurement, uuid.UUID(release_id))
        assert stored is not None
        assert stored.payload == measured[0].payload
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    run_all(client, release_id)
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "succeeded", final


def test_a_store_the_database_refuses_as_a_statement_is_not_retried(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite raises ``OperationalError`` for a statement's own errors too (no such
    column, a syntax error): a bug that fails the same way every time, not a connection
    that may come back. The store is not tried again for two leases: the release ends
    failed (spent: the data were read) at the first failure, where it was tried again
    and the second try stored it, hiding the bug."""
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    monkeypatch.setattr(stages, "PERSIST_RETRY_DELAY", 0.01)
    commit, failures = stages.ledger.commit, []

    def no_such_column(session: Any, *args: Any) -> Any:
        if failures:  # a retry, or the failed release's spend
            return commit(session, *args)
        failures.append(1)
        connection = sqlite3.connect(":memory:")
        try:
            connection.execute("SELECT nope")
        except sqlite3.OperationalError as exc:
            raise OperationalError("SELECT nope", {}, exc) from exc
        raise AssertionError("SELECT nope ran")

    monkeypatch.setattr(stages.ledger, "commit", no_such_column)
    run_measure(services_of(client), uuid.UUID(release_id))
    monkeypatch.undo()
    assert failures == [1]
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "failed", final
    assert not _stored(client, release_id)
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]


def test_a_synthesis_that_cannot_begin_its_files_fails_at_once(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data directory made read-only (or full) under the worker: the run's temporary
    directory could not be made, the error escaped the stage, and the run was claimed
    again after each lease until its attempts ran out, ending as "its workers died or lost
    their leases, e.g. out of memory". It fails at its first claim and says why; the
    measurements are kept, and a re-synthesis once the directory is writable succeeds."""
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_measure(services_of(client), uuid.UUID(release_id))

    def read_only(*_args: Any) -> Path:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(ArtifactStore, "begin", read_only)
    run_synthesize(services_of(client), uuid.UUID(release_id))
    monkeypatch.undo()
    failed = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert failed["status"] == "failed"
    assert failed["message"].startswith("the service could not write the release's files")
    assert failed["message"].endswith("re-synthesise with other parameters at no privacy cost")
    assert _stored(client, release_id)
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize", json={"params": {}}, headers=curator.headers
    )
    assert again.status_code == 202, again.text
    run_all(client, release_id)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]


@pytest.mark.parametrize("opened", [True, False])
def test_the_measure_stage_gives_up_after_its_attempts(
    opened: bool, client: TestClient, curator: Caller
) -> None:
    """Each claim of the measure stage may read the data: after MAX_MEASURE_ATTEMPTS claims
    whose workers died, the next ends the release instead of reading again: spent if an
    attempt opened the data, refunded if every one died before that."""
    from app.releases.stages import MAX_MEASURE_ATTEMPTS

    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    with services_of(client).db.transaction() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        release.status, release.lease_owner = "measuring", QUEUED
        release.attempts = MAX_MEASURE_ATTEMPTS
        release.read_started_at = utcnow() if opened else None
    run_measure(services_of(client), uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "failed"
    outcome = (
        "the data may have been read, so the budget stays spent"
        if opened
        else "nothing was read; the budget was refunded"
    )
    assert final["message"] == (
        f"the measure stage was attempted {MAX_MEASURE_ATTEMPTS} times (its workers died or "
        f"lost their leases); {outcome}"
    )
    settled = "commit" if opened else "refund"
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", settled]


def test_a_cancel_the_stage_ignores_ends_the_release_through_the_sweeper(
    client: TestClient, curator: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mechanism busy after its last progress call (standing at its gate here) never
    raised the cancel, and its heartbeat renewed the lease, so the release stayed measuring
    for as long as the worker lived. After CANCEL_GRACE_LEASES lease periods the heartbeat
    lets the lease run out; the sweeper re-queues the stage and the next claim ends it
    (spent: the first attempt read the data)."""
    services = services_of(client)
    monkeypatch.setattr(services.settings, "lease_seconds", 0.5)
    dataset_id, release_id, held, worker = _measuring_at_gate(client, curator, tmp_path)
    try:
        held.wait_reached()
        assert (
            client.delete(f"/v1/releases/{release_id}", headers=curator.headers).status_code == 200
        )
        # the grace (2 s) and then the lease (0.5 s) run out
        wait_for(lambda: sweep(services) > 0, "the sweeper to take the stage over")
        assert worker.is_alive(), "the hung attempt ended before the sweeper took over"
        run_measure(services, uuid.UUID(release_id))
        final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    finally:
        held.open()  # the hung attempt finishes, finds its lease gone, stores nothing
        worker.join(timeout=30)
    assert final["status"] == "cancelled"
    assert final["message"] == (
        "cancelled while measuring; the data may have been read, so the budget stays spent"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    assert not _stored(client, release_id)


def test_an_attempt_that_gave_up_its_lease_over_an_ignored_cancel_stores_nothing(
    client: TestClient, curator: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the heartbeat has stopped renewing the lease over a cancel the stage ignored
    (no grace here), the attempt no longer holds the stage: its measurement, completed
    before the sweeper hands the stage over, is discarded, nothing settled, and the next
    claim ends the release (spent: the data were read), as when the sweeper came first
    (test_a_cancel_the_stage_ignores_ends_the_release_through_the_sweeper)."""
    services = services_of(client)
    monkeypatch.setattr(services.settings, "lease_seconds", 0.4)
    monkeypatch.setattr(stages, "CANCEL_GRACE_LEASES", 0)
    gave_up = heartbeat_finds(monkeypatch, "lost")
    dataset_id, release_id, held, worker = _measuring_at_gate(client, curator, tmp_path)
    try:
        held.wait_reached()
        assert (
            client.delete(f"/v1/releases/{release_id}", headers=curator.headers).status_code == 200
        )
        assert gave_up.wait(timeout=30), "the heartbeat did not give the lease up"
    finally:
        held.open()  # the measurement completes before any sweep
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert not _stored(client, release_id)
    waiting = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert waiting["status"] == "measuring", waiting
    assert _entries(client, curator, dataset_id, release_id) == ["reserve"]
    wait_for(lambda: sweep(services) > 0, "the lease to run out")
    run_measure(services, uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["message"] == (
        "cancelled while measuring; the data may have been read, so the budget stays spent"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    assert not _stored(client, release_id)


@pytest.mark.parametrize("fail_in", ["synthesize", "store"])
def test_synthesis_failure_keeps_measurements_and_resynthesis_is_free(
    fail_in: str, client: TestClient, curator: Caller
) -> None:
    """A synthesis fails in the mechanism or when its finished artifacts are stored (that
    failure escaped: the release stayed synthesizing and the sweeper retried it without
    end); the release fails and keeps its measurements."""
    dataset_id = dataset(client, curator)
    body = {**REQUEST, "params": {"fail_in": fail_in, "rows": 5}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    failed = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert failed["status"] == "failed"
    assert "measurements are kept" in failed["message"]
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    # nothing of the failed version is left on disk (a failed commit left it published there)
    store = ArtifactStore(services_of(client).settings.releases_dir)
    assert not store.version_dir(uuid.UUID(release_id), 0).exists()
    with services_of(client).db.transaction() as session:
        payload = session.get(ReleaseMeasurement, uuid.UUID(release_id)).payload  # type: ignore[union-attr]

    refused = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"pause": 0}},
    )
    assert refused.status_code == 422  # not a post-processing parameter
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"rows": 7}},
    )
    assert again.status_code == 202, again.text
    assert again.json()["synthesis_version"] == 1
    # the failure came from a measurement-time parameter, so this attempt fails the same way
    run_synthesize(services_of(client), uuid.UUID(release_id))
    assert (
        client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()["status"]
        == "failed"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    with services_of(client).db.transaction() as session:
        assert session.get(ReleaseMeasurement, uuid.UUID(release_id)).payload == payload  # type: ignore[union-attr]


def test_resynthesis_uses_stored_measurements(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_all(client, release_id)
    first = client.get(
        f"/v1/releases/{release_id}/artifacts/means.json", headers=curator.headers
    ).json()
    response = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"rows": 3}},
    )
    assert response.json()["status"] == "synthesizing"
    run_measure(services_of(client), uuid.UUID(release_id))  # a stray measure job does nothing
    run_synthesize(services_of(client), uuid.UUID(release_id))
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "succeeded"
    assert release["synthesis_params"] == {"rows": 3}
    assert (
        client.get(
            f"/v1/releases/{release_id}/artifacts/means.json", headers=curator.headers
        ).json()
        == first
    )
    sample = pacsv.read_csv(
        io.BytesIO(
            client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers).content
        )
    )
    assert sample.num_rows == 3
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]

    def versions() -> list[str]:
        return sorted(
            p.name for p in (services_of(client).settings.releases_dir / release_id).iterdir()
        )

    assert versions() == ["v0", "v1"]  # the replaced version stays for readers of it
    client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"rows": 4}},
    )
    run_synthesize(services_of(client), uuid.UUID(release_id))
    assert versions() == ["v1", "v2"]


def test_measurements_are_immutable(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_measure(services_of(client), uuid.UUID(release_id))
    for statement in (
        "UPDATE release_measurements SET payload = '{}'",
        "DELETE FROM release_measurements",
    ):
        with (
            pytest.raises(DBAPIError, match="append-only"),
            services_of(client).db.transaction() as session,
        ):
            session.execute(text(statement))


def test_a_release_left_waiting_in_the_queue_is_enqueued_again_ever_less_often(
    client: TestClient, curator: Caller
) -> None:
    """A release no worker has claimed since it was enqueued waits behind busy workers:
    each time the sweeper enqueues it again, its next wait doubles, up to
    MAX_QUEUED_LEASES leases (before, it was enqueued again every lease, and each copy
    filled the queue). A stage whose worker died is enqueued again after one lease."""
    from datetime import timedelta

    services = services_of(client)
    lease = timedelta(seconds=services.settings.lease_seconds)
    release_id = uuid.UUID(request_release(client, curator, dataset(client, curator)).json()["id"])

    def expire(waited: timedelta, owner: str = QUEUED) -> timedelta:
        """End a wait of ``waited``, sweep, and return the next wait."""
        now = utcnow()
        with services.db.transaction() as session:
            session.execute(
                update(Release)
                .where(Release.id == release_id)
                .values(
                    lease_owner=owner,
                    lease_expires_at=now - timedelta(seconds=1),
                    updated_at=now - timedelta(seconds=1) - waited,  # the wait began then
                )
            )
        before = services.queue.pending()
        assert sweep(services) == 1
        assert services.queue.pending() == before + 1
        with services.db.transaction(read_only=True) as session:
            release = session.get(Release, release_id)
            assert release is not None
            assert release.lease_owner == QUEUED
            return release.lease_expires_at - utcnow()

    def close(got: timedelta, want: timedelta) -> bool:
        return abs((got - want).total_seconds()) < 5

    assert close(expire(lease), 2 * lease)
    assert close(expire(4 * lease), 8 * lease)
    assert close(expire(8 * lease), stages.MAX_QUEUED_LEASES * lease)
    assert close(expire(stages.MAX_QUEUED_LEASES * lease), stages.MAX_QUEUED_LEASES * lease)
    # a worker that died holding the stage: its lease, as before
    assert close(expire(10 * lease, owner="dead-worker"), lease)


def test_downloads_wait_for_success(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    response = client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers)
    assert response.status_code == 409
    run_all(client, release_id)
    missing = client.get(f"/v1/releases/{release_id}/synopsis", headers=curator.headers)
    assert missing.status_code == 404
    assert "no artifact 'synopsis.json'" in missing.json()["error"]["message"]


def test_sweeper_requeues_expired_leases(client: TestClient, curator: Caller) -> None:
    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    assert sweep(services) == 0  # fresh: the enqueue's lease is still valid
    with services.db.transaction() as session:
        session.execute(
            text(
                "UPDATE releases SET status = 'measuring', lease_owner = 'dead-worker', lease_expires_at = :past"
            ),
            {"past": "2000-01-01 00:00:00"},
        )
    before = services.queue.pending()
    assert sweep(services) == 1
    assert services.queue.pending() == before + 1
    assert sweep(services) == 0  # requeued with a fresh lease
    run_all(client, release_id)
    assert (
        client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()["status"]
        == "succeeded"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]


def test_a_reclaim_on_the_same_thread_is_another_owner(client: TestClient, curator: Caller) -> None:
    """Owners were host:pid:thread, so an attempt whose lease lapsed and a new claim on
    the same thread (or in another container with the same hostname and PID 1) were one
    owner, and the stale attempt could still persist or settle the release."""
    from app.releases.stages import _claim

    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = uuid.UUID(request_release(client, curator, dataset_id).json()["id"])
    first = _claim(services, release_id, "measure")
    assert first is not None
    with services.db.transaction() as session:
        release = session.get(Release, release_id)
        assert release is not None
        release.lease_expires_at = release.created_at  # lapsed
    second = _claim(services, release_id, "measure")
    assert second is not None
    assert first.owner != second.owner


def _lapse_and_sweep(client: TestClient, release_id: str) -> None:
    """The lease of the release's stage runs out (its worker died or is held up) and the
    sweeper hands the stage over (re-queued)."""
    services = services_of(client)
    with services.db.transaction() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        release.lease_expires_at = release.created_at  # lapsed
    assert sweep(services) == 1


def test_every_claim_of_the_measure_stage_counts_as_an_attempt(
    client: TestClient, curator: Caller
) -> None:
    """The attempts are counted by the claims themselves (the give-up test above sets the
    count): MAX_MEASURE_ATTEMPTS claims whose workers died before opening the data, each
    re-queued by the sweeper, and the next claim ends the release, refunded, instead of
    reading the data once more."""
    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    for _ in range(stages.MAX_MEASURE_ATTEMPTS):
        assert stages._claim(services, uuid.UUID(release_id), "measure") is not None  # dies
        _lapse_and_sweep(client, release_id)
    run_measure(services, uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "failed", final
    assert final["message"] == (
        f"the measure stage was attempted {stages.MAX_MEASURE_ATTEMPTS} times (its workers "
        "died or lost their leases); nothing was read; the budget was refunded"
    )
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]
    assert not _stored(client, release_id)


def test_a_stage_whose_lease_is_held_is_not_claimed_again(
    client: TestClient, curator: Caller
) -> None:
    """A measure job delivered again (the sweeper's re-enqueue of a release waiting in the
    queue, say) while a worker holds the stage's lease: the second claim gets nothing and
    counts no attempt, and its run_measure reads nothing and settles nothing; the stage
    stays the first worker's."""
    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = uuid.UUID(request_release(client, curator, dataset_id).json()["id"])
    first = stages._claim(services, release_id, "measure")
    assert first is not None
    assert stages._claim(services, release_id, "measure") is None
    run_measure(services, release_id)
    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert (release.status, release.lease_owner, release.attempts) == (
            "measuring",
            first.owner,
            1,
        )
        assert release.read_started_at is None
    assert _entries(client, curator, dataset_id, str(release_id)) == ["reserve"]


def test_a_heartbeat_whose_lease_was_taken_over_renews_nothing(
    client: TestClient, curator: Caller
) -> None:
    """The heartbeat of an attempt whose lease the sweeper handed to another claim (its
    worker was held up) marks the lease lost, and neither renews the new owner's lease
    nor publishes its own progress over the new owner's."""
    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    stale = stages._claim(services, uuid.UUID(release_id), "measure")
    assert stale is not None
    _lapse_and_sweep(client, release_id)
    owner = stages._claim(services, uuid.UUID(release_id), "measure")
    assert owner is not None

    def lease() -> tuple[Any, ...]:
        with services.db.transaction(read_only=True) as session:
            release = session.get(Release, uuid.UUID(release_id))
            assert release is not None
            return release.lease_owner, release.lease_expires_at, release.progress

    before = lease()
    heartbeat = stages.Heartbeat(services, stale)
    heartbeat.progress = 0.5
    heartbeat.beat()
    assert heartbeat.lost
    with pytest.raises(stages.LeaseLost):
        heartbeat.check()
    assert lease() == before
    assert before[0] == owner.owner


@pytest.mark.parametrize("ending", ["measured", "failed"])
def test_a_measure_attempt_whose_lease_was_taken_over_leaves_the_release_alone(
    ending: str, client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker held up in its measurement (a pause, a frozen VM: its heartbeat did not
    beat meanwhile) lost its lease, and the sweeper handed the stage to a new claim. The
    stale attempt, resuming with its measurement complete or failed after reading, stores
    nothing, settles nothing and ends nothing: the release stays measuring, the new
    owner's, its reservation open."""
    services = services_of(client)
    # no beat of the attempt's heartbeat meanwhile (a beat between the lapse and the sweep
    # would renew the lease): its first renewal is 150 s away, and so is its first progress
    monkeypatch.setattr(services.settings, "lease_seconds", 600.0)
    monkeypatch.setattr(stages, "PROGRESS_SECONDS", 600.0)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    measure = fake.TestMeans.measure
    owners: list[stages.Claim] = []

    def held_up(self: fake.TestMeans, *args: Any, **kwargs: Any) -> Measured:
        measured = measure(self, *args, **kwargs)  # the rows are read
        _lapse_and_sweep(client, release_id)
        owner = stages._claim(services, uuid.UUID(release_id), "measure")
        assert owner is not None
        owners.append(owner)
        if ending == "failed":
            raise RuntimeError("failed after its lease was taken over")
        return measured

    monkeypatch.setattr(fake.TestMeans, "measure", held_up)
    run_measure(services, uuid.UUID(release_id))
    assert len(owners) == 1
    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        assert (release.status, release.lease_owner) == ("measuring", owners[0].owner)
        assert (release.message, release.measured_at) == (None, None)
    assert _entries(client, curator, dataset_id, release_id) == ["reserve"]
    assert not _stored(client, release_id)


def test_preview_reads_nothing_and_spends_nothing(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator, epsilon=0.1)
    response = client.post(
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=REQUEST
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["accuracy"] == {"noise_scale": pytest.approx(2 * 2 / (4 * 0.2))}
    assert body["fits_budget"] is False
    assert body["remaining"] == {"epsilon": 0.1, "delta": 1e-6}
    assert budget(client, curator, dataset_id)["entries"] == []
    assert (
        client.post(
            f"/v1/datasets/{dataset_id}/preview",
            headers=curator.headers,
            json={"mechanism": "x", "epsilon": 1},
        ).status_code
        == 422
    )


def test_non_dp_release_needs_the_opt_in_and_spends_nothing(
    client: TestClient, curator: Caller
) -> None:
    dataset_id = dataset(client, curator)
    body = {"mechanism": "test_non_dp"}
    refused = request_release(client, curator, dataset_id, body)
    assert refused.status_code == 409
    assert "allow non-DP releases" in refused.json()["error"]["message"]
    client.patch(
        f"/v1/datasets/{dataset_id}", headers=curator.headers, json={"allow_non_dp_releases": True}
    )
    with_epsilon = request_release(client, curator, dataset_id, {**body, "epsilon": 1})
    assert with_epsilon.status_code == 422
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    assert response.json()["guarantee"] == "none (tests only)"
    run_all(client, response.json()["id"])
    assert (
        client.get(f"/v1/releases/{response.json()['id']}", headers=curator.headers).json()[
            "status"
        ]
        == "succeeded"
    )
    summary = budget(client, curator, dataset_id)
    assert [(e["kind"], e["epsilon"], e["delta"]) for e in summary["entries"]] == [
        ("non_dp", 0.0, 0.0)
    ]
    assert (
        summary["epsilon_spent"],
        summary["epsilon_reserved"],
        summary["epsilon_remaining"],
    ) == (0.0, 0.0, 1.0)


def test_opt_in_withdrawn_while_a_non_dp_release_waits_ends_it_unread(
    client: TestClient, curator: Caller
) -> None:
    """The curator withdraws the non-DP opt-in while a non-DP release is queued: its worker
    must not read the data for it (an audit saw the PATCH answer 200 and the worker then
    read the data and publish the release)."""
    dataset_id = dataset(client, curator)
    opt_in = f"/v1/datasets/{dataset_id}"
    client.patch(opt_in, headers=curator.headers, json={"allow_non_dp_releases": True})
    release_id = request_release(client, curator, dataset_id, {"mechanism": "test_non_dp"}).json()[
        "id"
    ]
    withdrawn = client.patch(opt_in, headers=curator.headers, json={"allow_non_dp_releases": False})
    assert withdrawn.status_code == 200
    run_all(client, release_id)
    ended = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert ended["status"] == "failed", ended
    assert ended["message"].startswith("the curator withdrew the dataset's opt-in")
    assert ended["message"].endswith("nothing was read")
    assert ended["measured_at"] is None
    assert not _stored(client, release_id)
    assert budget(client, curator, dataset_id)["entries"] == []
    with services_of(client).db.transaction() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        assert release.read_started_at is None
    # it ended failed unmeasured: a re-synthesis is told it never will have measurements
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize", headers=curator.headers, json={"params": {}}
    )
    assert again.status_code == 409
    assert again.json()["error"]["message"].startswith(
        "the release ended (failed) before it was measured"
    )


def test_dp_mechanisms_need_epsilon(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator)
    response = request_release(client, curator, dataset_id, {"mechanism": "test_means"})
    assert response.status_code == 422
    assert "needs epsilon" in response.json()["error"]["message"]


def test_table_mechanisms_refuse_graphs(client: TestClient, curator: Caller) -> None:
    from tests.datasets.test_graphs import upload_graph

    graph_id = upload_graph(client, curator, b"0 1\n").json()["id"]
    response = request_release(client, curator, graph_id)
    assert response.status_code == 422
    assert "releases table datasets; this one is a graph" in response.json()["error"]["message"]


def _checks_that(monkeypatch: pytest.MonkeyPatch, mechanism: str, meanwhile: Any) -> None:
    """Make ``mechanism``'s request checks call ``meanwhile()`` before they run."""
    from app.releases import registry

    target = type(registry.get(mechanism))
    check = target.check

    def check_meanwhile(self: Any, *args: Any) -> None:
        meanwhile()
        check(self, *args)

    monkeypatch.setattr(target, "check", check_meanwhile)


def test_release_checks_hold_no_write_lock(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's checks may take seconds (a tree's calibration at extreme budgets took
    12 s); another writer goes ahead meanwhile. On SQLite they used to run inside the
    request's BEGIN IMMEDIATE transaction, and the PATCH below waited for them (on
    PostgreSQL the PATCH never waited: no row lock is taken before the checks)."""
    dataset_id = dataset(client, curator)
    entered, proceed = threading.Event(), threading.Event()
    waited: list[bool] = []

    def held() -> None:
        entered.set()
        waited.append(proceed.wait(timeout=10))

    _checks_that(monkeypatch, "test_means", held)
    codes: list[int] = []
    requester = threading.Thread(
        target=lambda: codes.append(request_release(client, curator, dataset_id).status_code)
    )
    requester.start()
    try:
        assert entered.wait(timeout=30)
        patched = client.patch(
            f"/v1/datasets/{dataset_id}",
            headers=curator.headers,
            json={"allow_non_dp_releases": True},
        )
    finally:
        proceed.set()
        requester.join(timeout=60)
    assert patched.status_code == 200, patched.text
    assert waited == [True], "the PATCH waited for the release request's checks"
    assert codes == [202]
    assert budget(client, curator, dataset_id)["epsilon_reserved"] == 0.2


def test_key_revoked_while_a_release_is_checked_reserves_nothing(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.datasets.test_upload import revoke_key

    dataset_id = dataset(client, curator)
    _checks_that(monkeypatch, "test_means", lambda: revoke_key(client, curator))
    response = request_release(client, curator, dataset_id)
    assert response.status_code == 401, response.text
    monkeypatch.undo()
    with services_of(client).db.transaction() as session:
        assert session.execute(text("SELECT count(*) FROM releases")).scalar_one() == 0
        assert session.execute(text("SELECT count(*) FROM ledger_entries")).scalar_one() == 0
    assert services_of(client).queue.pending() == 0


def test_opt_in_withdrawn_while_a_release_is_checked_is_409(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The non-DP opt-in is read again when the release is recorded."""
    from app.models import Dataset

    dataset_id = dataset(client, curator)
    client.patch(
        f"/v1/datasets/{dataset_id}", headers=curator.headers, json={"allow_non_dp_releases": True}
    )

    def withdraw() -> None:
        with services_of(client).db.transaction() as session:
            row = session.get(Dataset, uuid.UUID(dataset_id))
            assert row is not None
            row.allow_non_dp_releases = False

    _checks_that(monkeypatch, "test_non_dp", withdraw)
    response = request_release(client, curator, dataset_id, {"mechanism": "test_non_dp"})
    assert response.status_code == 409, response.text
    assert "allow non-DP releases" in response.json()["error"]["message"]
    assert budget(client, curator, dataset_id)["entries"] == []
    assert services_of(client).queue.pending() == 0


def test_previews_in_progress_leave_sessions_to_other_requests(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preview's checks and prediction (seconds at extreme budgets) hold no session (it
    used to hold a read session throughout). Previews run a few at a time
    (``release_checks``, fewer than the session slots): widened here, so that more
    previews than session slots are in progress at once."""
    from app.core.deps import MAX_CONCURRENT_TRANSACTIONS
    from app.core.threads import ThreadLimit
    from app.releases import registry, service
    from tests.releases.helpers import assert_sessions_free_while_held

    assert service.MAX_CONCURRENT_RELEASE_CHECKS < MAX_CONCURRENT_TRANSACTIONS
    wide = ThreadLimit("test_wide_release_checks", MAX_CONCURRENT_TRANSACTIONS + 1)
    monkeypatch.setattr(service, "release_checks", wide)
    dataset_id = dataset(client, curator)
    assert_sessions_free_while_held(
        client,
        curator,
        monkeypatch,
        type(registry.get("test_means")),
        "preview",
        lambda: (
            client.post(
                f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=REQUEST
            ).status_code
        ),
    )


def test_a_delta_not_below_one_over_n_is_warned_about(client: TestClient, curator: Caller) -> None:
    """A delta of 1/n or more lets an (epsilon, delta)-DP release publish whole rows: the
    dataset (its delta total), a preview (the request's delta) and the release (its delta)
    say so, without refusing;
    below 1/n they say nothing. n is public, so the warning reveals nothing."""
    from tests.datasets.helpers import ROWS

    n = len(ROWS)
    for delta, warned in ((1.0 / n, True), (0.999 / n, False)):
        dataset_id = dataset(client, curator, epsilon=5.0, delta=delta)
        for shown in (
            client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json(),
            client.get("/v1/datasets", headers=curator.headers).json()[-1],
        ):
            assert len(shown["warnings"]) == warned, shown
            if warned:
                assert f"(n = {n} rows)" in shown["warnings"][0]
                assert "delta total" in shown["warnings"][0]
        response = client.post(
            f"/v1/datasets/{dataset_id}/preview",
            headers=curator.headers,
            json={**REQUEST, "delta": delta},
        )
        assert response.status_code == 200, response.text
        assert len(response.json()["warnings"]) == warned
        small = client.post(
            f"/v1/datasets/{dataset_id}/preview",
            headers=curator.headers,
            json={**REQUEST, "delta": 1e-9},
        )
        assert small.json()["warnings"] == []
        # the release says it too: in the request's answer and whenever it is shown
        created = client.post(
            f"/v1/datasets/{dataset_id}/releases",
            headers=curator.headers,
            json={**REQUEST, "delta": delta},
        )
        assert created.status_code == 202, created.text
        release_id = created.json()["id"]
        for shown in (
            created.json(),
            client.get(f"/v1/releases/{release_id}", headers=curator.headers).json(),
            client.get(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers).json()[-1],
        ):
            assert shown["id"] == release_id
            assert len(shown["warnings"]) == warned, shown
            if warned:
                assert f"(n = {n} rows)" in shown["warnings"][0]
                assert "release's delta" in shown["warnings"][0]


def test_a_graphs_delta_is_not_warned_about_its_private_edge_count(
    client: TestClient, curator: Caller
) -> None:
    """A graph's stored row count is its number of edges, private under edge-level DP:
    the 1/n warning is for tables only, so a graph's delta total of 0.5 over 3 edges
    (0.5 * 3 >= 1) is not compared with it, and nothing shown tells the count."""
    from tests.datasets.test_graphs import upload_graph

    schema = {
        "name": "g",
        "kind": "graph",
        "vertices": 6,
        "budget": {"epsilon": 5.0, "delta": 0.5},
    }
    uploaded = upload_graph(client, curator, b"0 1\n1 2\n4 5\n", schema)
    assert uploaded.status_code == 201, uploaded.text
    graph_id = uploaded.json()["id"]
    for shown in (
        uploaded.json(),
        client.get(f"/v1/datasets/{graph_id}", headers=curator.headers).json(),
        client.get("/v1/datasets", headers=curator.headers).json()[-1],
    ):
        assert shown["id"] == graph_id
        assert shown["n_rows"] is None
        assert shown["warnings"] == [], shown


def test_one_row_read_counts_as_read() -> None:
    """_has_read: a single row read by this attempt, or an earlier attempt that opened the
    data, means the data may have been read (spent); no row and no earlier opening does
    not (refunded)."""
    claim = stages.Claim(
        release_id=uuid.uuid4(),
        owner="w",
        mechanism="test_means",
        dataset_id=uuid.uuid4(),
        epsilon=1,
        delta=0,
        columns=[],
        params={},
        synthesis_params={},
        synthesis_version=1,
        seed=0,
        cancel_requested=False,
    )
    source = type("Source", (), {"rows_read": 0})()
    assert not stages._has_read(claim, None)
    assert not stages._has_read(claim, source)  # type: ignore[arg-type]
    source.rows_read = 1
    assert stages._has_read(claim, source)  # type: ignore[arg-type]
    assert stages._has_read(dataclasses.replace(claim, read_before=True), None)


def test_a_measure_job_for_a_measured_release_draws_no_new_noise(
    client: TestClient, curator: Caller
) -> None:
    """A measure job delivered again once the release was measured (a duplicate enqueue)
    finds it synthesising and does nothing: the stored noisy values, the ledger and the
    status stay as they were."""
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    services = services_of(client)
    run_measure(services, uuid.UUID(release_id))
    with services.db.transaction(read_only=True) as session:
        stored = session.get(ReleaseMeasurement, uuid.UUID(release_id))
        assert stored is not None
        payload = dict(stored.payload)
    run_measure(services, uuid.UUID(release_id))
    with services.db.transaction(read_only=True) as session:
        again = session.get(ReleaseMeasurement, uuid.UUID(release_id))
        release = session.get(Release, uuid.UUID(release_id))
        assert again is not None
        assert release is not None
        assert dict(again.payload) == payload
        assert (release.status, release.attempts) == ("synthesizing", 0)
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
    run_synthesize(services, uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "succeeded"


def test_a_queued_release_is_not_measured_while_space_is_low(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Below CURATOR_MIN_FREE_BYTES free only new uploads and release requests were
    refused: a release queued before was still measured, its epsilon spent, and it failed
    at synthesis on the full disk (its curator, seeing it fail, asked and paid again). Its
    measure stage now leaves it unclaimed: nothing read, nothing spent, no attempt counted,
    one warning, the reason in its message; the sweeper enqueues it again a lease later,
    and once space is freed it is measured as any other."""
    from datetime import timedelta

    from app.config import Settings
    from app.core import disk

    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    monkeypatch.setattr(services.settings, "min_free_bytes", Settings().min_free_bytes)
    monkeypatch.setattr(disk, "free_bytes", lambda settings: settings.min_free_bytes - 1)

    def never_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the data were opened while space was low")

    with monkeypatch.context() as patched:
        patched.setattr(stages, "EncryptedTableSource", never_read)
        with caplog.at_level("WARNING", logger="curator"):
            run_measure(services, uuid.UUID(release_id))
            run_measure(services, uuid.UUID(release_id))  # a second copy of its job
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= 30]
    assert len(warnings) == 2, warnings  # one line a postponement, no error
    assert all("measure postponed" in w and "CURATOR_MIN_FREE_BYTES" in w for w in warnings)
    assert all(r.levelname == "WARNING" for r in caplog.records)
    shown = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert shown["status"] == "queued", shown
    assert shown["message"] == stages.MEASURE_POSTPONED
    assert _entries(client, curator, dataset_id, release_id) == ["reserve"]
    assert budget(client, curator, dataset_id)["epsilon_spent"] == 0
    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        assert (release.attempts, release.read_started_at) == (0, None)
        assert session.get(ReleaseMeasurement, release.id) is None
        assert release.lease_owner == QUEUED
        left = release.lease_expires_at - utcnow()
        assert abs(left.total_seconds() - services.settings.lease_seconds) < 5
    # the sweeper enqueues it again once that lease runs out (not before)
    assert sweep(services) == 0
    with services.db.transaction() as session:
        session.execute(
            update(Release)
            .where(Release.id == uuid.UUID(release_id))
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
    before = services.queue.pending()
    assert sweep(services) == 1
    assert services.queue.pending() == before + 1
    # space freed: measured and synthesised, the reservation spent once
    monkeypatch.setattr(disk, "free_bytes", lambda settings: settings.min_free_bytes)
    run_all(client, release_id)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    assert done["message"] is None
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]


def test_a_cancel_is_not_held_up_by_low_space(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A measure stage whose worker died, cancelled since: low space does not postpone its
    end (ending it reads nothing), and the budget is refunded as before."""
    from app.config import Settings
    from app.core import disk

    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    _dead_measure_attempts(client, release_id, 1, opened=False)
    cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
    assert cancelled.json()["status"] == "measuring", cancelled.text
    monkeypatch.setattr(services.settings, "min_free_bytes", Settings().min_free_bytes)
    monkeypatch.setattr(disk, "free_bytes", lambda settings: 0)
    run_measure(services, uuid.UUID(release_id))
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "cancelled", done
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]


def _database_down(*args: Any, **kwargs: Any) -> Any:
    raise OperationalError("COMMIT", {}, Exception("server closed the connection"))


@pytest.mark.parametrize("stage", ["measure", "synthesize"])
def test_a_stage_that_could_not_be_ended_is_not_logged_as_failed(
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
    caplog: Any,
    stage: str,
) -> None:
    """A stage that stopped on an error while the database was down (the error itself,
    or its failure could not be recorded) is not ended: its claim stays until its lease
    runs out and the sweeper hands it to a worker again. It was logged as an ERROR,
    "<stage> failed with ...", for a failure that was never recorded (and the task failed
    as well); it is one warning that says the stage is retried, and the retry succeeds."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    if stage == "synthesize":
        run_measure(services, uuid.UUID(release_id))
    with monkeypatch.context() as patched:
        if stage == "measure":
            patched.setattr(stages, "_persist_measurement", _database_down)
            patched.setattr(stages, "PERSIST_RETRY_LEASES", 0)
            patched.setattr(stages, "_end_measuring", _database_down)
        else:
            patched.setattr(stages, "_publish_synthesis", _database_down)
            patched.setattr(stages, "_end_synthesizing", _database_down)
        with caplog.at_level("INFO", logger="curator"):
            (run_measure if stage == "measure" else run_synthesize)(services, uuid.UUID(release_id))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert not errors, errors
    said = [r.getMessage() for r in caplog.records if "could not be ended" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"release {release_id}: {stage} stopped with OperationalError")
    assert "the release is not failed: the stage is retried once its lease runs out" in said[0]
    assert all(r.levelname == "WARNING" for r in caplog.records if r.getMessage() in said)
    shown = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert shown["status"] == ("measuring" if stage == "measure" else "synthesizing"), shown
    _lapse_and_sweep(client, release_id)
    run_all(client, release_id)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]
