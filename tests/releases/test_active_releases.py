"""``CURATOR_MAX_ACTIVE_RELEASES``: a curator's releases queued or running at once.

Workers take jobs first come, first served, and a release request costs its curator as
little as epsilon 1e-12: 300 requests in a minute held the worker of ``curator serve``
for over an hour while another curator's release stayed queued. Past the limit a request
or a re-synthesis is a 429 before anything is reserved, recorded or changed.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.core.db import db_now
from app.models import LedgerEntry, Release
from app.releases import stages
from app.releases.service import lock_release
from tests.conftest import Caller, make_user
from tests.releases.helpers import (
    REQUEST,
    Gate,
    budget,
    dataset,
    request_release,
    rows_of,
    run_all,
    services_of,
    wait_for,
)


def test_a_curator_past_the_active_release_limit_gets_429_with_nothing_reserved(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(services_of(client).settings, "max_active_releases", 2)
    first, second = dataset(client, curator, epsilon=10.0), dataset(client, curator, epsilon=10.0)
    done = request_release(client, curator, first).json()["id"]
    run_all(client, done)  # ended: not counted
    accepted = [request_release(client, curator, first, key=f"k{i}") for i in range(2)]
    assert [r.status_code for r in accepted] == [202, 202]

    # on another of the curator's datasets too: the limit is the curator's
    refused = request_release(client, curator, second)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "too_many_active_releases"
    assert "CURATOR_MAX_ACTIVE_RELEASES = 2" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "30"
    assert budget(client, curator, second)["epsilon_reserved"] == 0
    assert rows_of(client, Release, second) == 0
    assert rows_of(client, LedgerEntry, second) == 0

    # a retry of an accepted request is still its replay, not a 429
    replay = request_release(client, curator, first, key="k0")
    assert replay.status_code == 200, replay.text
    assert replay.json()["id"] == accepted[0].json()["id"]

    # a re-synthesis is a run of the worker too: refused, the release left as it was
    url = f"/v1/releases/{done}/resynthesize"
    before = client.get(f"/v1/releases/{done}", headers=curator.headers).json()
    again = client.post(url, headers=curator.headers, json={"params": {}})
    assert again.status_code == 429, again.text
    shown = client.get(f"/v1/releases/{done}", headers=curator.headers).json()
    assert shown["status"] == "succeeded"
    assert shown["synthesis_version"] == before["synthesis_version"]

    # another curator is not held back
    other = make_user(client, "curator")
    assert request_release(client, other, dataset(client, other)).status_code == 202

    # once one has ended, the curator may ask again; a cancelled one ends at once
    run_all(client, accepted[0].json()["id"])
    assert request_release(client, curator, second).status_code == 202
    cancelled = client.delete(f"/v1/releases/{accepted[1].json()['id']}", headers=curator.headers)
    assert cancelled.json()["status"] == "cancelled"
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202


def test_no_active_release_limit_at_zero(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(services_of(client).settings, "max_active_releases", 0)
    dataset_id = dataset(client, curator, epsilon=10.0)
    codes = [request_release(client, curator, dataset_id).status_code for _ in range(20)]
    assert codes == [202] * 20


def test_concurrent_requests_on_several_datasets_are_counted_one_after_the_other(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request holds only its own dataset's lock: without the curator's lock
    (``lock_curator_limits``) concurrent requests on different datasets each counted the
    others' uncommitted releases as absent, and on PostgreSQL several passed a limit of 1."""
    monkeypatch.setattr(services_of(client).settings, "max_active_releases", 1)
    copies = 6
    datasets = [dataset(client, curator, epsilon=10.0) for _ in range(copies)]
    barrier = threading.Barrier(copies)
    codes: list[int] = []

    def attempt(dataset_id: str) -> None:
        barrier.wait()
        codes.append(request_release(client, curator, dataset_id).status_code)

    threads = [threading.Thread(target=attempt, args=(d,)) for d in datasets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(codes) == [202] + [429] * (copies - 1), codes


def _cancel(client: TestClient, curator: Caller, release_id: str) -> None:
    response = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
    assert response.status_code == 200, response.text
    shown = response.json()
    assert (shown["status"], shown["cancel_requested"]) == ("measuring", True)


def test_a_cancelled_release_counts_only_while_a_worker_holds_its_lease(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release being measured that its curator cancelled stops at its worker's next
    heartbeat; a worker that died (or no worker at all) leaves it ``measuring``. It counted
    as active until a worker ended it, so a curator who cancelled to make room got 429s for
    as long as no worker ran. It counts while its worker's lease runs (the worker is busy
    with it), not once the lease is gone; the next claim ends it, nothing read."""
    services = services_of(client)
    monkeypatch.setattr(services.settings, "max_active_releases", 1)
    first, second = dataset(client, curator, epsilon=10.0), dataset(client, curator, epsilon=10.0)
    release_id = request_release(client, curator, first).json()["id"]
    # a worker claims it, and stops (dies) before it ends it
    assert stages._claim(services, uuid.UUID(release_id), "measure") is not None
    _cancel(client, curator, release_id)
    assert request_release(client, curator, second).status_code == 429  # its lease runs

    with services.db.transaction() as session:  # the dead worker's lease runs out
        release = lock_release(session, uuid.UUID(release_id))
        assert release is not None
        release.lease_expires_at = db_now(session) - timedelta(seconds=1)
    accepted = request_release(client, curator, second)
    assert accepted.status_code == 202, accepted.text

    # the next claim ends it, refunded, with nothing measured or synthesised
    stages.run_measure(services, uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert (final["status"], final["message"]) == (
        "cancelled",
        "cancelled before measuring; refunded",
    )
    assert final["published_version"] is None
    assert not (services.settings.releases_dir / release_id).exists()


def test_a_cancelled_release_whose_stage_ignores_the_cancel_counts_until_its_lease_lapses(
    client: TestClient, curator: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How long a cancelled release holds its worker: a stage hung after its last progress
    call (standing at its gate) never raises the cancel; its heartbeat renews the lease for
    CANCEL_GRACE_LEASES (4) lease periods after it read the cancel and then lets it run out,
    at most a lease later. The release counts against the limit for that long (4 to 5
    leases: 2.54 to 2.64 s measured in 7 runs at a 0.5 s lease, both lanes) and not after,
    though the hung thread itself has yet to return. The lease here is 1.5 s: at 0.5 s a
    loaded machine delayed a renewal (due every quarter lease) past the lease, which ran
    out before the cancel (a 202 where the 429 was due; a full-suite run beside others)."""
    services = services_of(client)
    monkeypatch.setattr(services.settings, "lease_seconds", 1.5)
    monkeypatch.setattr(services.settings, "max_active_releases", 1)
    first, second = dataset(client, curator, epsilon=10.0), dataset(client, curator, epsilon=10.0)
    held = Gate(tmp_path)
    body = {**REQUEST, "params": held.params("after_reading")}
    release_id = request_release(client, curator, first, body).json()["id"]
    worker = threading.Thread(target=stages.run_measure, args=(services, uuid.UUID(release_id)))
    worker.start()
    try:
        held.wait_reached()
        cancelled_at = time.monotonic()
        _cancel(client, curator, release_id)
        assert request_release(client, curator, second).status_code == 429
        accepted: list[int] = []

        def accepted_now() -> bool:
            accepted.append(request_release(client, curator, second).status_code)
            return accepted[-1] == 202

        wait_for(accepted_now, "the cancelled release's lease to lapse")
        waited = time.monotonic() - cancelled_at
        assert worker.is_alive(), "the hung stage returned before its lease lapsed"
    finally:
        held.open()
        worker.join(timeout=30)
    grace = stages.CANCEL_GRACE_LEASES * services.settings.lease_seconds
    assert waited >= grace, waited
    assert set(accepted[:-1]) <= {429}
    # the hung attempt found its lease gone and stored nothing; the next claim ends it
    stages.run_measure(services, uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "cancelled"
    assert final["published_version"] is None
