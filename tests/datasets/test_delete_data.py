"""Deleting a dataset's data: DELETE /v1/datasets/{id}/data removes the stored rows and
keeps the declaration, the ledger, the releases and their measurements."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.datasets.service import remove_stray_files
from app.models import AuditEvent, Dataset
from app.models.base import utcnow
from app.storage import tables
from tests.conftest import Caller, make_user
from tests.releases.helpers import (
    REQUEST,
    budget,
    dataset,
    request_release,
    run_all,
    services_of,
)


def _delete(client: TestClient, caller: Caller, dataset_id: str) -> object:
    return client.delete(f"/v1/datasets/{dataset_id}/data", headers=caller.headers)


def _file(client: TestClient, dataset_id: str) -> object:
    return services_of(client).settings.datasets_dir / f"{dataset_id}.parquet"


def test_deleting_the_data_keeps_ledger_and_releases_and_refuses_new_releases(
    client: TestClient, curator: Caller
) -> None:
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_all(client, release_id)
    before = budget(client, curator, dataset_id)
    path = _file(client, dataset_id)
    assert path.exists()

    response = _delete(client, curator, dataset_id)
    assert response.status_code == 200, response.text
    deleted_at = response.json()["data_deleted_at"]
    assert deleted_at is not None
    assert not path.exists()
    assert budget(client, curator, dataset_id) == before  # the ledger is untouched
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json()
    assert shown["data_deleted_at"] == deleted_at

    # the release stays: downloads and re-synthesis read no row
    assert client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers).is_success
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize", headers=curator.headers, json={"params": {}}
    )
    assert again.status_code == 202, again.text
    run_all(client, release_id)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done

    # no new release, nor its preview; nothing reserved
    for url in (f"/v1/datasets/{dataset_id}/releases", f"/v1/datasets/{dataset_id}/preview"):
        refused = client.post(url, headers=curator.headers, json=REQUEST)
        assert refused.status_code == 409, refused.text
        assert "data were deleted" in refused.json()["error"]["message"]
    assert budget(client, curator, dataset_id) == before

    # asked again: the same answer, recorded once
    assert _delete(client, curator, dataset_id).json()["data_deleted_at"] == deleted_at
    with services_of(client).db.transaction(read_only=True) as session:
        actions = session.scalars(
            select(AuditEvent.action).where(AuditEvent.object_id == dataset_id)
        ).all()
    assert actions.count("dataset.delete_data") == 1


def test_deleting_the_data_forgets_the_files_key(
    client: TestClient, curator: Caller, tmp_path: Path
) -> None:
    """Crypto-shredding: a copy of the file taken before the deletion (a backup, the
    blocks an unlink leaves on the disk) opened with the dataset's file key, which the
    service key unseals; the deletion forgets that key, so the copy opens no more, with
    the service key or any other the service has."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    copy = tmp_path / "copy.parquet"
    shutil.copyfile(_file(client, dataset_id), copy)

    def sealed() -> str | None:
        with services.db.transaction(read_only=True) as session:
            found = session.get(Dataset, uuid.UUID(dataset_id))
            assert found is not None
            return found.file_keys

    before = sealed()
    assert tables.opens_with(copy, tables.file_ring(services.data_key, before))
    assert _delete(client, curator, dataset_id).status_code == 200
    assert sealed() is None
    assert not tables.opens_with(copy, tables.file_ring(services.data_key, None))
    assert not tables.opens_with(copy, services.data_key)


def test_on_sqlite_the_forgotten_key_leaves_neither_the_database_file_nor_its_log(
    client: TestClient, curator: Caller
) -> None:
    """The row's old value stayed in SQLite's write-ahead log (and, where the build does
    not default to secure_delete, in the database file's free pages): an image of the data
    directory taken after the deletion still held the sealed key (review). The service
    sets secure_delete, and checkpoints the log once a deletion commits."""
    services = services_of(client)
    if not services.db.is_sqlite:
        pytest.skip("SQLite only: PostgreSQL's dead rows and WAL are its server's")
    dataset_id = dataset(client, curator)
    with services.db.transaction(read_only=True) as session:
        found = session.get(Dataset, uuid.UUID(dataset_id))
        assert found is not None
        sealed = found.file_keys
    assert sealed is not None
    database = Path(services.db.engine.url.database or "")
    files = [database, database.with_name(database.name + "-wal")]
    token = sealed.encode()
    assert any(token in f.read_bytes() for f in files if f.exists())
    with services.db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA secure_delete").scalar() == 1
    assert _delete(client, curator, dataset_id).status_code == 200
    deadline = time.monotonic() + 30
    while any(token in f.read_bytes() for f in files if f.exists()):
        assert time.monotonic() < deadline, "the sealed key is still in the database's files"
        time.sleep(0.05)


def _pages_holding(connection: Any, relation: str, token: bytes) -> int:
    """How many pages of ``relation`` hold ``token`` anywhere in their bytes, free space
    included (pageinspect's ``get_raw_page``: the page as PostgreSQL holds it)."""
    blocks = connection.exec_driver_sql(
        f"SELECT pg_relation_size('{relation}') / current_setting('block_size')::int"
    ).scalar()
    return sum(
        1
        for block in range(int(blocks))
        if connection.exec_driver_sql(
            "SELECT position(%(t)s::bytea in get_raw_page(%(r)s, %(b)s)) > 0",
            {"t": token, "r": relation, "b": block},
        ).scalar()
    )


def test_on_postgresql_the_forgotten_key_leaves_no_page_of_the_table_or_its_indexes(
    client: TestClient, curator: Caller
) -> None:
    """An UPDATE leaves the row's old version in its page until a VACUUM prunes it, and
    autovacuum waits for a fifth of the table to change: a canary audit found a deleted
    dataset's sealed file key and its fingerprint, in the datasets table's heap file and
    the fingerprint's index, minutes after the deletion (``bench/canary_audit.py``). The
    service vacuums the table once a deletion commits (its WAL and archives are the
    server's: README)."""
    services = services_of(client)
    if services.db.is_sqlite:
        pytest.skip("PostgreSQL only (SQLite: the test above)")
    with services.db.engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        try:
            connection.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pageinspect")
        except Exception as exc:  # not a superuser, or no contrib package
            pytest.skip(f"pageinspect is not available: {type(exc).__name__}")
    dataset_id = dataset(client, curator)
    with services.db.transaction(read_only=True) as session:
        found = session.get(Dataset, uuid.UUID(dataset_id))
        assert found is not None
        assert found.file_keys is not None
        assert found.fingerprint
        sealed, fingerprint = found.file_keys.encode(), found.fingerprint.encode()
    with services.db.engine.connect() as connection:
        relations = ["datasets"] + [
            name
            for (name,) in connection.execute(
                text(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'datasets' "
                    "AND strpos(indexdef, 'fingerprint') > 0"
                )
            )
        ]
    assert len(relations) > 1, relations
    with services.db.engine.connect() as connection:
        assert _pages_holding(connection, "datasets", sealed) == 1
    assert _delete(client, curator, dataset_id).status_code == 200
    deadline = time.monotonic() + 30
    while True:
        with services.db.engine.connect() as connection:
            left = {
                (relation, name): _pages_holding(connection, relation, token)
                for relation in relations
                for name, token in (("sealed key", sealed), ("fingerprint", fingerprint))
            }
        if not any(left.values()):
            break
        assert time.monotonic() < deadline, f"still in the database's pages: {left}"
        time.sleep(0.2)


def test_deleting_the_data_waits_for_releases_that_have_yet_to_read_them(
    client: TestClient, curator: Caller
) -> None:
    dataset_id = dataset(client, curator)
    queued = request_release(client, curator, dataset_id).json()["id"]
    refused = _delete(client, curator, dataset_id)
    assert refused.status_code == 409, refused.text
    assert queued in refused.json()["error"]["message"]
    assert _file(client, dataset_id).exists()
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json()
    assert shown["data_deleted_at"] is None
    cancelled = client.delete(f"/v1/releases/{queued}", headers=curator.headers)
    assert cancelled.status_code == 200, cancelled.text
    assert _delete(client, curator, dataset_id).status_code == 200
    assert not _file(client, dataset_id).exists()


def test_only_the_curator_deletes_the_data(
    client: TestClient, curator: Caller, analyst: Caller
) -> None:
    dataset_id = dataset(client, curator)
    other = make_user(client, "curator")
    granted = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    assert granted.status_code == 201, granted.text
    assert _delete(client, analyst, dataset_id).status_code == 403
    assert _delete(client, other, dataset_id).status_code == 404
    assert _file(client, dataset_id).exists()


def test_the_sweeper_removes_a_deleted_datasets_file_left_behind(
    client: TestClient, curator: Caller
) -> None:
    """A process that died between the deletion's commit and the file's removal left the
    file: the sweeper removes it, young as it is; other datasets' files stay."""
    kept = dataset(client, curator)
    dataset_id = dataset(client, curator)
    services = services_of(client)
    with services.db.transaction() as session:
        session.execute(
            update(Dataset)
            .where(Dataset.id == uuid.UUID(dataset_id))
            .values(data_deleted_at=utcnow())
        )
    assert _file(client, dataset_id).exists()
    with services.db.transaction(read_only=True) as session:
        assert remove_stray_files(session, services) == 1
    assert not _file(client, dataset_id).exists()
    assert _file(client, kept).exists()


def test_the_sweeper_reads_the_rows_of_the_files_on_disk_only(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweeper pass costs the files that exist, not the history: it read every dataset's
    storage name, and looked on disk for the file of every dataset whose data were ever
    deleted, every 30 s (10^4 datasets: 0.7 s a pass on SQLite,
    bench/results/sweeper_history_*). Here 40 datasets whose data were deleted long ago
    (files gone) and one live one: the pass reads one dataset row and looks at one file;
    a stray file is still removed and the live one kept."""
    kept = dataset(client, curator)
    services = services_of(client)
    owner = services.db
    with owner.transaction() as session:
        template = session.get(Dataset, uuid.UUID(kept))
        assert template is not None
        for _ in range(40):
            gone = uuid.uuid4()
            session.add(
                Dataset(
                    id=gone,
                    owner_id=template.owner_id,
                    name="gone",
                    columns=template.columns,
                    n_rows=template.n_rows,
                    out_of_bounds=template.out_of_bounds,
                    epsilon_total=template.epsilon_total,
                    delta_total=template.delta_total,
                    storage_name=f"{gone}.parquet",
                    validation={},
                    data_deleted_at=utcnow(),
                )
            )
    stray = services.settings.datasets_dir / f"{uuid.uuid4()}.parquet"
    stray.write_bytes(b"PAR1")
    long_ago = time.time() - 7 * 86_400
    os.utime(stray, (long_ago, long_ago))
    looked_at: list[str] = []
    rows_read: list[int] = []
    real_is_file, real_execute = Path.is_file, Session.execute

    def is_file(path: Path) -> bool:
        if path.parent == services.settings.datasets_dir:
            looked_at.append(path.name)
        return real_is_file(path)

    def execute(session: Session, statement: Any, *args: Any, **kwargs: Any) -> Any:
        result = real_execute(session, statement, *args, **kwargs)
        if "datasets" in str(statement):
            rows = result.all()
            rows_read.append(len(rows))
            return iter(rows)
        return result

    monkeypatch.setattr(Path, "is_file", is_file)
    monkeypatch.setattr(Session, "execute", execute)
    monkeypatch.setattr(
        Session,
        "scalars",
        lambda session, statement, *a, **k: iter(
            row[0] for row in execute(session, statement, *a, **k)
        ),
    )
    with services.db.transaction(read_only=True) as session:
        assert remove_stray_files(session, services) == 1
    assert sorted(looked_at) == sorted([f"{kept}.parquet", stray.name])
    assert sum(rows_read) == 1
    assert not stray.exists()
    assert _file(client, kept).exists()


def test_the_sweeper_keeps_an_old_file_a_row_names_otherwise_than_by_its_id(
    client: TestClient, curator: Caller
) -> None:
    """The sweeper looks files up by dataset id (``<id>.parquet``, how every file is
    named); an old file that no id matches is looked up by its name before it is removed
    as a stray, so a row naming its file otherwise never loses it."""
    dataset_id = dataset(client, curator)
    services = services_of(client)
    renamed = services.settings.datasets_dir / f"{uuid.uuid4()}.parquet"
    _file(client, dataset_id).rename(renamed)
    long_ago = time.time() - 7 * 86_400
    os.utime(renamed, (long_ago, long_ago))
    with services.db.transaction() as session:
        session.execute(
            update(Dataset)
            .where(Dataset.id == uuid.UUID(dataset_id))
            .values(storage_name=renamed.name)
        )
    with services.db.transaction(read_only=True) as session:
        assert remove_stray_files(session, services) == 0
    assert renamed.exists()


def test_deleting_the_data_waits_for_a_release_that_is_measuring(
    client: TestClient, curator: Caller
) -> None:
    """A release being measured reads the rows as the deletion is asked: refused (409,
    naming it), the file and the dataset left as they were."""
    from app.models import Release

    dataset_id = dataset(client, curator)
    measuring = request_release(client, curator, dataset_id).json()["id"]
    with services_of(client).db.transaction() as session:
        session.execute(
            update(Release).where(Release.id == uuid.UUID(measuring)).values(status="measuring")
        )
    refused = _delete(client, curator, dataset_id)
    assert refused.status_code == 409, refused.text
    assert measuring in refused.json()["error"]["message"]
    assert _file(client, dataset_id).exists()
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json()
    assert shown["data_deleted_at"] is None


def test_a_deletion_rolled_back_leaves_the_file(client: TestClient, curator: Caller) -> None:
    """The file goes once the deletion commits: a transaction that rolls back after it
    leaves the rows stored, as the dataset still says they are."""
    from app.datasets.service import delete_data
    from app.models import User

    dataset_id = dataset(client, curator)
    services = services_of(client)

    class Abort(Exception):
        pass

    try:
        with services.db.transaction() as session:
            user = session.get(User, curator.id)
            assert user is not None
            out = delete_data(session, services, user, uuid.UUID(dataset_id))
            assert out.data_deleted_at is not None
            raise Abort
    except Abort:
        pass
    assert _file(client, dataset_id).exists()
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json()
    assert shown["data_deleted_at"] is None


def test_a_deletion_waits_for_a_release_request_that_holds_the_dataset_lock(
    client: TestClient, curator: Caller
) -> None:
    """A release request recorded but not yet committed holds the dataset's lock: the
    deletion asked meanwhile waits for it, then sees the queued release and is refused,
    so no release is left to read rows that are gone."""
    import threading

    from app.models import User
    from app.releases import service as releases
    from app.releases.schemas import ReleaseCreate

    dataset_id = dataset(client, curator)
    services = services_of(client)
    body = ReleaseCreate.model_validate(REQUEST)
    with services.db.transaction(read_only=True) as session:
        user = session.get(User, curator.id)
        assert user is not None
        session.expunge(user)
    checked = releases.validate_release(services, user, uuid.UUID(dataset_id), body, None)
    recorded, commit = threading.Event(), threading.Event()

    def request() -> None:
        with services.db.transaction() as session:
            releases.create_release(
                session, services, user, uuid.UUID(dataset_id), body, checked, None
            )
            recorded.set()
            assert commit.wait(timeout=60)

    requester = threading.Thread(target=request)
    requester.start()
    try:
        assert recorded.wait(timeout=60)
        result: list[object] = []
        deleter = threading.Thread(
            target=lambda: result.append(_delete(client, curator, dataset_id))
        )
        deleter.start()
        deleter.join(timeout=1.0)
        assert deleter.is_alive()  # waiting for the lock
    finally:
        commit.set()
        requester.join(timeout=60)
    deleter.join(timeout=60)
    (response,) = result
    assert response.status_code == 409, response.text  # type: ignore[attr-defined]
    assert _file(client, dataset_id).exists()
