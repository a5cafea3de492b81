"""``DELETE /v1/releases/{id}/artifacts``: a curator deletes a release's published files.

With ``CURATOR_MAX_CURATOR_BYTES`` on, a curator at the limit had no way to free storage
but asking an administrator to raise it. Deleting the files frees their bytes; the
measurements and the spend stay, downloads and answers are 410 ``files_deleted``, and a
re-synthesis (no budget) publishes the release again.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

import tests.releases.fake_mechanism  # registers test_means
from app.models import AuditEvent, LedgerEntry, Release
from app.releases import stages
from app.storage.artifacts import ArtifactStore
from tests.conftest import Caller, make_user
from tests.releases.helpers import (
    REQUEST,
    budget,
    dataset,
    finished_release,
    request_release,
    rows_of,
    run_all,
    services_of,
)


def _delete(client: TestClient, caller: Caller, release_id: str) -> Any:
    return client.delete(f"/v1/releases/{release_id}/artifacts", headers=caller.headers)


def _versions(client: TestClient, release_id: str) -> list[str]:
    folder = ArtifactStore(services_of(client).settings.releases_dir).release_dir(
        uuid.UUID(release_id)
    )
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _stored_bytes(client: TestClient, release_id: str) -> int:
    with services_of(client).db.transaction(read_only=True) as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        return release.stored_bytes


def _deleted_by_a_process_that_died(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A published release whose deletion committed and whose process died before it
    removed the files (version 0 left on disk); its id."""
    dataset_id = dataset(client, curator, epsilon=10.0)
    release_id = str(finished_release(client, curator, dataset_id, REQUEST)["id"])
    with monkeypatch.context() as died:
        died.setattr(ArtifactStore, "remove_versions", lambda *args: 0)
        assert _delete(client, curator, release_id).status_code == 200
    assert _versions(client, release_id) == ["v0"]
    return release_id


def test_deleting_the_files_frees_their_storage_and_a_resynthesis_publishes_again(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = services_of(client).settings
    dataset_id = dataset(client, curator, epsilon=10.0)
    analyst = make_user(client, "analyst")
    granted = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    assert granted.status_code == 201, granted.text
    release = finished_release(client, curator, dataset_id, REQUEST)
    release_id = release["id"]
    download = f"/v1/releases/{release_id}/synthetic"
    assert client.get(download, headers=analyst.headers).status_code == 200
    stored = _stored_bytes(client, release_id)
    assert stored > 0
    assert _versions(client, release_id) == ["v0"]
    spent = budget(client, curator, dataset_id)["epsilon_spent"]
    entries = rows_of(client, LedgerEntry, dataset_id)

    # at the quota: a second release is refused until the first one's files are deleted
    preview = client.post(
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=REQUEST
    ).json()
    monkeypatch.setattr(settings, "max_curator_bytes", stored + preview["artifact_bytes"] - 1)
    refused = request_release(client, curator, dataset_id)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "storage_quota_exceeded"
    assert "(DELETE /v1/releases/{id}/artifacts)" in refused.json()["error"]["message"]

    deleted = _delete(client, curator, release_id)
    assert deleted.status_code == 200, deleted.text
    shown = deleted.json()
    assert shown["status"] == "succeeded"
    assert shown["files_deleted_at"] is not None
    assert (shown["published_version"], shown["artifacts"]) == (None, [])
    assert _versions(client, release_id) == []
    assert _stored_bytes(client, release_id) == 0
    # the measurements and the spend stay: the ledger has no new entry
    assert budget(client, curator, dataset_id)["epsilon_spent"] == spent
    assert rows_of(client, LedgerEntry, dataset_id) == entries
    assert request_release(client, curator, dataset_id).status_code == 202

    # downloads and answers are 410, for the analyst and the curator alike
    for caller in (analyst, curator):
        gone = client.get(download, headers=caller.headers)
        assert gone.status_code == 410, gone.text
        assert gone.json()["error"]["code"] == "files_deleted"
        assert "re-synthesises" in gone.json()["error"]["message"]
        answers = client.post(
            f"/v1/releases/{release_id}/answers",
            headers=caller.headers,
            json={"queries": [{"type": "pca", "k": 1}]},
        )
        assert answers.status_code == 410, answers.text
        assert answers.json()["error"]["code"] == "files_deleted"

    # a second deletion answers as the first did, and records nothing
    again = _delete(client, curator, release_id)
    assert again.status_code == 200, again.text
    assert again.json()["files_deleted_at"] == shown["files_deleted_at"]
    with services_of(client).db.transaction(read_only=True) as session:
        events = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "release.delete_files")
        ).all()
        assert [(str(e.object_id), e.details["stored_bytes"]) for e in events] == [
            (release_id, stored)
        ]

    # a re-synthesis publishes the release again, at no budget
    monkeypatch.setattr(settings, "max_curator_bytes", 0)
    url = f"/v1/releases/{release_id}/resynthesize"
    resynthesis = client.post(url, headers=curator.headers, json={"params": {}})
    assert resynthesis.status_code == 202, resynthesis.text
    stages.run_synthesize(services_of(client), uuid.UUID(release_id))
    published = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert (published["status"], published["published_version"]) == ("succeeded", 1)
    assert published["files_deleted_at"] is None
    assert _versions(client, release_id) == ["v1"]
    assert client.get(download, headers=analyst.headers).status_code == 200
    assert budget(client, curator, dataset_id)["epsilon_spent"] == spent


def test_a_release_that_runs_or_published_nothing_keeps_its_state(
    client: TestClient, curator: Caller
) -> None:
    dataset_id = dataset(client, curator, epsilon=10.0)
    queued = request_release(client, curator, dataset_id).json()["id"]
    refused = _delete(client, curator, queued)
    assert refused.status_code == 409, refused.text
    assert "cancel it" in refused.json()["error"]["message"]

    failed = request_release(
        client, curator, dataset_id, {**REQUEST, "params": {"fail_in": "measure"}}
    ).json()["id"]
    run_all(client, failed)
    refused = _delete(client, curator, failed)
    assert refused.status_code == 409, refused.text
    assert "published no files" in refused.json()["error"]["message"]

    # a re-synthesis of a published release runs: its worker would publish
    published = finished_release(client, curator, dataset_id, REQUEST)["id"]
    url = f"/v1/releases/{published}/resynthesize"
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    refused = _delete(client, curator, published)
    assert refused.status_code == 409, refused.text
    shown = client.get(f"/v1/releases/{published}", headers=curator.headers).json()
    assert (shown["status"], shown["published_version"]) == ("synthesizing", 0)
    assert shown["files_deleted_at"] is None
    assert _versions(client, published) == ["v0"]
    assert client.get(f"/v1/releases/{published}/synthetic", headers=curator.headers).is_success


def test_the_sweeper_removes_the_versions_a_dead_deletion_left(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files go once the deletion commits; a process that died in between left them
    on disk, unserved: the sweeper's first pass after a start removes versions up to the
    release's synthesis version, never a later run's."""
    services = services_of(client)
    release_id = _deleted_by_a_process_that_died(client, curator, monkeypatch)
    store = ArtifactStore(services.settings.releases_dir)
    later = store.version_dir(uuid.UUID(release_id), 1)  # as a re-synthesis begun since
    later.mkdir()
    assert _versions(client, release_id) == ["v0", "v1"]

    with services.db.transaction(read_only=True) as session:
        assert stages.remove_stale_work(session, services) == 0  # not on every pass
        assert _versions(client, release_id) == ["v0", "v1"]
        assert stages.remove_stale_work(session, services, legacy=True) == 1
    assert _versions(client, release_id) == ["v1"]


def test_remove_versions_removes_those_up_to_the_one_named(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    release_id = uuid.uuid4()
    for version in (0, 1, 2, 10):
        (store.version_dir(release_id, version)).mkdir(parents=True)
        (store.version_dir(release_id, version) / "sample.csv").write_text("x\n")
    assert store.remove_versions(release_id, 2) == 3
    assert sorted(p.name for p in store.release_dir(release_id).iterdir()) == ["v10"]
    assert store.remove_versions(release_id, 10) == 1
    assert not store.release_dir(release_id).exists()  # empty: removed
    assert store.remove_versions(release_id, 10) == 0  # nothing left: nothing to do


def test_the_sweepers_first_pass_spares_the_version_a_resynthesis_is_publishing(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweeper starting (another worker's) while a re-synthesis of a deleted release
    publishes reads the release as re-synthesising, version 1, unpublished: it removed
    versions up to 1, the one just moved into place, and the publish then committed a
    ``published_version`` whose files were gone (downloads 404)."""
    services = services_of(client)
    release_id = _deleted_by_a_process_that_died(client, curator, monkeypatch)
    url = f"/v1/releases/{release_id}/resynthesize"
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202

    publish = ArtifactStore.publish
    swept: list[int] = []

    def publish_then_sweep(store: ArtifactStore, key: uuid.UUID, version: int, work: Path) -> Path:
        final = publish(store, key, version, work)
        # the publish has yet to commit: the sweeper reads the release as it was
        with services.db.transaction(read_only=True) as session:
            swept.append(stages.remove_stale_work(session, services, legacy=True))
        return final

    monkeypatch.setattr(ArtifactStore, "publish", publish_then_sweep)
    stages.run_synthesize(services, uuid.UUID(release_id))
    assert swept == [1]  # v0, which the deletion left
    shown = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert (shown["status"], shown["published_version"]) == ("succeeded", 1)
    assert _versions(client, release_id) == ["v1"]
    assert client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers).is_success


def test_a_resynthesis_of_a_deleted_release_that_fails_or_is_cancelled_leaves_it_deleted(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release stays as the deletion left it: succeeded, its files deleted (410), the
    parameters of the version it last published; it turned failed, or cancelled "after
    measuring", with the failed run's parameters as its own."""
    services = services_of(client)
    dataset_id = dataset(client, curator, epsilon=10.0)
    release_id = finished_release(client, curator, dataset_id, REQUEST)["id"]
    published = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    deleted = _delete(client, curator, release_id).json()
    url = f"/v1/releases/{release_id}/resynthesize"

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("synthesis failed")

    with monkeypatch.context() as patched:
        patched.setattr(tests.releases.fake_mechanism.TestMeans, "synthesize", broken)
        started = client.post(url, headers=curator.headers, json={"params": {"rows": 5}})
        assert started.status_code == 202, started.text
        stages.run_synthesize(services, uuid.UUID(release_id))
    failed = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert failed["status"] == "succeeded", failed["message"]
    assert failed["message"].startswith("re-synthesis (version 1) failed: ")
    assert failed["message"].endswith("its files stay deleted until a re-synthesis publishes it")
    assert failed["synthesis_params"] == published["synthesis_params"] != {"rows": 5}
    assert (failed["published_version"], failed["synthesis_version"]) == (None, 1)
    assert failed["files_deleted_at"] == deleted["files_deleted_at"]
    download = client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers)
    assert download.status_code == 410, download.text
    assert _versions(client, release_id) == []

    started = client.post(url, headers=curator.headers, json={"params": {"rows": 5}})
    assert started.status_code == 202, started.text
    cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert cancelled["status"] == "succeeded", cancelled["message"]
    assert cancelled["message"] == (
        "re-synthesis (version 2) cancelled: cancelled by the curator; its files stay "
        "deleted until a re-synthesis publishes it"
    )
    assert cancelled["synthesis_params"] == published["synthesis_params"]
    assert cancelled["files_deleted_at"] == deleted["files_deleted_at"]
    stages.run_synthesize(services, uuid.UUID(release_id))  # its job finds it ended
    assert _versions(client, release_id) == []
    # deleted still: a deletion answers as the first did; a re-synthesis publishes again
    assert (
        _delete(client, curator, release_id).json()["files_deleted_at"]
        == (deleted["files_deleted_at"])
    )
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    stages.run_synthesize(services, uuid.UUID(release_id))
    again = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert (again["status"], again["published_version"], again["message"]) == (
        "succeeded",
        3,
        None,
    )
    assert again["files_deleted_at"] is None


def test_a_download_whose_files_are_deleted_before_it_opens_them_is_a_410(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download reads the published version, then opens its file. A deletion committed
    in between removed the file: the download answered 404 "missing on disk", as for a
    file lost by accident. It reads the release again and answers as a request after the
    deletion: 410 ``files_deleted``."""
    from app.releases import downloads

    dataset_id = dataset(client, curator, epsilon=10.0)
    release_id = str(finished_release(client, curator, dataset_id, REQUEST)["id"])
    path_of = downloads.ArtifactStore.path

    def deleted_meanwhile(self: Any, *args: Any) -> Path:
        monkeypatch.setattr(downloads.ArtifactStore, "path", path_of)
        assert _delete(client, curator, release_id).status_code == 200
        assert _versions(client, release_id) == []
        return path_of(self, *args)

    monkeypatch.setattr(downloads.ArtifactStore, "path", deleted_meanwhile)
    response = client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers)
    assert response.status_code == 410, response.text
    assert response.json()["error"]["code"] == "files_deleted"
