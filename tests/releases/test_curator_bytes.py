"""``CURATOR_MAX_CURATOR_BYTES``: what a curator's releases may store, published and
predicted.

``CURATOR_MAX_RELEASE_BYTES`` bounds one release; 61 default ``smooth_synthetic`` releases
of a 2000-column table, each under any sensible per-release cap, left 41 GB on the data
disk, after which every user got 503s. Past the quota a request or re-synthesis is a 422
``storage_quota_exceeded`` before anything is reserved, recorded or changed.
"""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.models import LedgerEntry, Release
from app.releases import stages
from app.storage.artifacts import ArtifactStore
from tests.conftest import Caller, make_user
from tests.releases.helpers import (
    REQUEST,
    budget,
    dataset,
    request_release,
    rows_of,
    run_all,
    services_of,
)


def _release(client: TestClient, release_id: str) -> Release:
    with services_of(client).db.transaction(read_only=True) as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        session.expunge(release)
        return release


def _predicted(client: TestClient, curator: Caller, dataset_id: str) -> int:
    preview = client.post(
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=REQUEST
    )
    assert preview.status_code == 200, preview.text
    return int(preview.json()["artifact_bytes"])


def test_a_curator_past_the_stored_bytes_quota_gets_422_with_nothing_reserved(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = services_of(client).settings
    first, second = dataset(client, curator, epsilon=10.0), dataset(client, curator, epsilon=10.0)
    predicted = _predicted(client, curator, first)
    monkeypatch.setattr(settings, "max_curator_bytes", 2 * predicted)

    # queued releases count their predicted bytes
    one = request_release(client, curator, first)
    two = request_release(client, curator, first)
    assert [one.status_code, two.status_code] == [202, 202], two.text
    assert _release(client, one.json()["id"]).predicted_bytes == predicted

    # on another of the curator's datasets too: the quota is the curator's
    refused = request_release(client, curator, second)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "storage_quota_exceeded"
    assert f"({2 * predicted} bytes)" in error["message"]
    assert "could add up to" in error["message"]
    assert "CURATOR_MAX_CURATOR_BYTES = " in error["message"]
    assert budget(client, curator, second)["epsilon_reserved"] == 0
    assert rows_of(client, Release, second) == 0
    assert rows_of(client, LedgerEntry, second) == 0

    # another curator is not held back
    other = make_user(client, "curator")
    assert request_release(client, other, dataset(client, other)).status_code == 202

    # published, a release counts the bytes its files take on disk (less than predicted)
    store = ArtifactStore(settings.releases_dir)
    for response in (one, two):
        run_all(client, response.json()["id"])
        release = _release(client, response.json()["id"])
        assert release.status == "succeeded"
        on_disk = store.disk_bytes(release.id, 0)
        assert 0 < release.stored_bytes == on_disk < predicted
    assert request_release(client, curator, second).status_code == 202

    # now past it again: a re-synthesis (which adds a version) is refused, left as it was
    url = f"/v1/releases/{one.json()['id']}/resynthesize"
    again = client.post(url, headers=curator.headers, json={"params": {}})
    assert again.status_code == 422, again.text
    assert again.json()["error"]["code"] == "storage_quota_exceeded"
    shown = client.get(f"/v1/releases/{one.json()['id']}", headers=curator.headers).json()
    assert (shown["status"], shown["synthesis_version"]) == ("succeeded", 0)
    monkeypatch.setattr(settings, "max_curator_bytes", 0)  # 0: no limit
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202


def test_a_cancelled_release_being_measured_does_not_count_its_predicted_bytes(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release being measured that its curator cancelled stays ``measuring`` until its
    worker's next heartbeat, or for as long as no worker runs; it never publishes (the
    measure stage ends it cancelled where it would have started the synthesis), and its
    predicted bytes counted until then, so a curator who cancelled to make room got 422s.
    A cancelled re-synthesis leaves its published version counted, not its prediction."""
    settings = services_of(client).settings
    first, second = dataset(client, curator, epsilon=10.0), dataset(client, curator, epsilon=10.0)
    predicted = _predicted(client, curator, first)
    monkeypatch.setattr(settings, "max_curator_bytes", predicted)
    release_id = request_release(client, curator, first).json()["id"]
    assert request_release(client, curator, second).status_code == 422
    # a worker measures it (its lease runs), and its curator cancels it
    assert stages._claim(services_of(client), uuid.UUID(release_id), "measure") is not None
    cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
    assert (cancelled.json()["status"], cancelled.json()["cancel_requested"]) == (
        "measuring",
        True,
    )
    accepted = request_release(client, curator, second)
    assert accepted.status_code == 202, accepted.text

    # a re-synthesis counts its prediction while it runs, and not once it is cancelled
    run_all(client, accepted.json()["id"])
    stored = _release(client, accepted.json()["id"]).stored_bytes
    assert 0 < stored < predicted
    monkeypatch.setattr(settings, "max_curator_bytes", stored + predicted)
    url = f"/v1/releases/{accepted.json()['id']}"
    assert (
        client.post(f"{url}/resynthesize", headers=curator.headers, json={"params": {}}).status_code
        == 202
    )
    assert request_release(client, curator, second).status_code == 422
    ended = client.delete(url, headers=curator.headers).json()
    assert (ended["status"], ended["published_version"]) == ("succeeded", 0)
    assert request_release(client, curator, second).status_code == 202


def _set(client: TestClient, release_id: str, **values: object) -> None:
    with services_of(client).db.transaction() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        for name, value in values.items():
            setattr(release, name, value)


def test_the_sweeper_records_the_stored_bytes_of_releases_published_before_they_were(
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Migration 0014 left ``stored_bytes`` 0 for the releases published before it, so
    each counted 0 toward the quota. The sweeper's first pass after a start records what
    their versions take on disk, as a publish does (the published version and the one it
    replaced; not a later, unpublished one); once, and never over a count that a publish
    set meanwhile, nor for a release whose files were withdrawn meanwhile."""
    services = services_of(client)
    store = ArtifactStore(services.settings.releases_dir)
    dataset_id = dataset(client, curator, epsilon=10.0)
    legacy, published_again, withdrawn = (
        request_release(client, curator, dataset_id).json()["id"] for _ in range(3)
    )
    for release_id in (legacy, published_again, withdrawn):
        run_all(client, release_id)
    url = f"/v1/releases/{legacy}/resynthesize"
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    run_all(client, legacy)  # v1 published, v0 kept a publish longer
    unpublished = store.version_dir(uuid.UUID(legacy), 7)  # a run's, moved into place
    unpublished.mkdir()
    (unpublished / "sample.csv").write_bytes(b"x" * 100_000)
    kept = store.disk_bytes(uuid.UUID(legacy), 0, 1)
    assert _release(client, legacy).stored_bytes == kept > store.disk_bytes(uuid.UUID(legacy), 1)
    not_published = request_release(client, curator, dataset_id).json()["id"]
    for release_id in (legacy, published_again, withdrawn):
        _set(client, release_id, stored_bytes=0)  # as migration 0014 left them
    unfilled = stages._unfilled

    def meanwhile(services: object) -> list[uuid.UUID]:
        listed = unfilled(services_of(client))
        _set(client, published_again, stored_bytes=12345)  # a publish's count
        _set(client, withdrawn, published_version=None, artifacts={})
        return listed

    monkeypatch.setattr(stages, "_unfilled", meanwhile)
    stages.Sweeper(services).start().stop()  # its first pass fills them
    assert "sweep failed" not in caplog.text
    assert _release(client, legacy).stored_bytes == kept
    assert _release(client, published_again).stored_bytes == 12345
    assert _release(client, withdrawn).stored_bytes == 0
    assert _release(client, not_published).stored_bytes == 0
    monkeypatch.setattr(stages, "_unfilled", unfilled)
    assert stages._unfilled(services) == []  # nothing left to fill: one query
    assert stages.fill_stored_bytes(services) == 0
    assert _release(client, legacy).stored_bytes == kept


def test_filling_stored_bytes_skips_releases_with_no_version_on_disk_without_a_transaction(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release published before ``stored_bytes`` was recorded whose files are gone from
    disk counts 0 and stays listed, so every start's first pass meets it again. It took a
    write transaction each (10^4 of them: 9-24 s of the sweeper's first pass, every start,
    with no sweep meanwhile); with nothing on disk there is nothing to record. One with
    its files is still filled, under its lock."""
    services = services_of(client)
    store = ArtifactStore(services.settings.releases_dir)
    dataset_id = dataset(client, curator, epsilon=10.0)
    lost, kept = (request_release(client, curator, dataset_id).json()["id"] for _ in range(2))
    for release_id in (lost, kept):
        run_all(client, release_id)
        _set(client, release_id, stored_bytes=0)  # as migration 0014 left them
    store.remove_versions(uuid.UUID(lost), 0)
    assert store.versions(uuid.UUID(lost)) == []
    locked: list[uuid.UUID] = []
    lock = stages.lock_release

    def counted(session: object, release_id: uuid.UUID) -> Release | None:
        locked.append(release_id)
        return lock(session, release_id)  # type: ignore[arg-type]

    monkeypatch.setattr(stages, "lock_release", counted)
    assert stages.fill_stored_bytes(services) == 1
    assert locked == [uuid.UUID(kept)]
    assert _release(client, kept).stored_bytes == store.disk_bytes(uuid.UUID(kept), 0) > 0
    assert _release(client, lost).stored_bytes == 0
    assert stages._unfilled(services) == [uuid.UUID(lost)]  # listed again next start
