"""Rotating the data key: `curator rotate-data-key` re-encrypts every stored dataset under
a fresh key of its own, sealed with CURATOR_DATA_KEY, the old key(s) given in
CURATOR_PREVIOUS_DATA_KEYS; the service then runs with the new key alone."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select, update

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.cli import main
from app.config import KEY_FILE_NAME, Settings
from app.main import create_app
from app.models import AuditEvent, Dataset
from app.storage import tables
from tests.conftest import Caller
from tests.datasets.test_graphs import upload_graph
from tests.releases.helpers import dataset, request_release, run_all, services_of


def _rotate(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    new: bytes,
    previous: list[bytes],
    text: bool = False,
) -> tuple[int, str, str]:
    monkeypatch.setenv("CURATOR_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("CURATOR_DATABASE_URL", str(settings.database_url))
    monkeypatch.delenv("CURATOR_REDIS_URL", raising=False)
    monkeypatch.setenv("CURATOR_DATA_KEY", new.decode())
    if previous:
        monkeypatch.setenv("CURATOR_PREVIOUS_DATA_KEYS", ",".join(k.decode() for k in previous))
    else:
        monkeypatch.delenv("CURATOR_PREVIOUS_DATA_KEYS", raising=False)
    with pytest.raises(SystemExit) as info:
        main(["rotate-data-key"] if text else ["rotate-data-key", "--json"])
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


Rotate = Callable[..., tuple[int, str, str]]


@pytest.fixture
def rotate(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Rotate:
    """``curator rotate-data-key --json`` (without ``--json`` if ``text``) on the test's
    service, with keys ``new`` and ``previous``: (exit code, stdout, stderr)."""
    return lambda *, new, previous, text=False: _rotate(
        settings, monkeypatch, capsys, new=new, previous=previous, text=text
    )


@pytest.fixture
def new_key() -> bytes:
    return Fernet.generate_key()


def _sealed(client: TestClient) -> dict[str, str | None]:
    """Every dataset's sealed file keys, by storage file name."""
    with services_of(client).db.transaction(read_only=True) as session:
        return dict(session.execute(select(Dataset.storage_name, Dataset.file_keys)).all())


def _opens(path: Path, ring: bytes, sealed: str | None) -> bool:
    """Whether the file opens as the measure stage opens it under the service ``ring``."""
    try:
        return tables.opens_with(path, tables.file_ring(ring, sealed))
    except PermissionError:  # the ring does not unseal the file keys
        return False


def _measures(client: TestClient, curator: Caller, dataset_id: str) -> None:
    """A release of the dataset, run through, succeeds: its file opened."""
    response = request_release(client, curator, dataset_id)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    run_all(client, release_id)
    shown = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert shown["status"] == "succeeded", shown


@pytest.fixture
def rotated_client(settings: Settings, new_key: bytes) -> Iterator[TestClient]:
    """The service after the rotation: the new key alone."""
    after = settings.model_copy(update={"data_key": SecretStr(new_key.decode())})
    with TestClient(create_app(after)) as test_client:
        yield test_client


def test_rotation_re_encrypts_every_dataset_and_the_service_runs_on_the_new_key(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    new_key: bytes,
    rotate: Rotate,
) -> None:
    dataset(client, curator)
    graph = upload_graph(
        client,
        curator,
        b"0 1\n1 2\n",
        {"name": "g", "kind": "graph", "vertices": 4, "budget": {"epsilon": 1.0}},
    )
    assert graph.status_code == 201, graph.text
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    files = sorted(settings.datasets_dir.iterdir())
    assert len(files) == 2
    sealed = _sealed(client)
    before = {
        path.name: tables.open_table(path, tables.file_ring(old, sealed[path.name])).read()
        for path in files
    }

    # without the previous key nothing can be opened: refused before anything is touched
    code, _, err = rotate(new=new_key, previous=[])
    assert code == 2
    assert "CURATOR_PREVIOUS_DATA_KEYS is not set" in err
    assert _sealed(client) == sealed

    code, out, err = rotate(new=new_key, previous=[old])
    assert code == 0, err
    assert json.loads(out) == {
        "rotated": 2,
        "current": 0,
        "missing": [],
        "unreadable": [],
        "failed": [],
        "superseded": 0,
    }
    assert "retire the old key" in err
    after = _sealed(client)
    for path in files:
        # a fresh file key, sealed with the new key alone: the old one opens neither
        (file_key,) = tables.unseal_file_keys(new_key, after[path.name])
        assert tables.sealed_with(new_key, after[path.name])
        assert not _opens(path, old, after[path.name])
        assert not _opens(path, old, sealed[path.name])  # nor the old file key
        assert tables.open_table(path, file_key).read().equals(before[path.name])
    with services_of(client).db.transaction(read_only=True) as session:
        events = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "data_key.rotate")
        ).all()
    assert [e.details["rotated"] for e in events] == [2]
    # a second run finds nothing to do
    code, out, _ = rotate(new=new_key, previous=[old])
    assert code == 0
    assert json.loads(out) == {
        "rotated": 0,
        "current": 2,
        "missing": [],
        "unreadable": [],
        "failed": [],
        "superseded": 0,
    }

    # a key that opens nothing: every file reported, none touched, exit 1
    stranger = Fernet.generate_key()
    contents = {path.name: path.read_bytes() for path in files}
    code, out, _ = rotate(new=stranger, previous=[old])
    assert code == 1
    assert sorted(json.loads(out)["unreadable"]) == sorted(contents)
    assert {path.name: path.read_bytes() for path in files} == contents
    assert _sealed(client) == after
    with services_of(client).db.transaction(read_only=True) as session:
        last = session.scalars(
            select(AuditEvent)
            .where(AuditEvent.action == "data_key.rotate")
            .order_by(AuditEvent.id.desc())
        ).first()
    assert last is not None
    assert sorted(last.details["unreadable"]) == sorted(contents)  # the audit names them
    assert last.details["rotated"] == 0


def test_a_release_measures_a_rotated_dataset_with_the_new_key_alone(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    new_key: bytes,
    rotate: Rotate,
    rotated_client: TestClient,
) -> None:
    table_id = dataset(client, curator)
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    code, _, err = rotate(new=new_key, previous=[old])
    assert code == 0, err
    _measures(rotated_client, curator, table_id)


def test_a_missing_file_is_reported(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    new_key: bytes,
    rotate: Rotate,
) -> None:
    dataset(client, curator)
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    (path,) = list(settings.datasets_dir.iterdir())
    path.unlink()
    code, out, _ = rotate(new=new_key, previous=[old])
    assert code == 1
    assert json.loads(out)["missing"] == [path.name]
    assert not path.exists()


def test_a_corrupt_file_is_reported_and_the_others_rotated(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    new_key: bytes,
    rotate: Rotate,
) -> None:
    """A file that is not a readable table is reported as failed and left as it was; the
    run goes on with the others, exits 1 and is audited (it used to stop at the first such
    file with a traceback, no audit event and the rest not visited)."""
    first = dataset(client, curator)
    second = dataset(client, curator)
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    broken = settings.datasets_dir / f"{first}.parquet"
    broken.write_bytes(b"PAR1 not a table")
    code, out, _ = rotate(new=new_key, previous=[old])
    assert code == 1
    report = json.loads(out)
    assert (report["failed"], report["rotated"]) == ([broken.name], 1)
    assert broken.read_bytes() == b"PAR1 not a table"
    kept = f"{second}.parquet"
    assert _opens(settings.datasets_dir / kept, new_key, _sealed(client)[kept])
    with services_of(client).db.transaction(read_only=True) as session:
        (event,) = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "data_key.rotate")
        ).all()
    assert event.details["failed"] == [broken.name]


@pytest.mark.parametrize("when", ["before its turn", "before the rename", "after the rename"])
def test_a_dataset_deleted_while_its_file_is_re_encrypted_keeps_no_file_and_no_key(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    new_key: bytes,
    rotate: Rotate,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """A deletion that commits while the file is re-encrypted forgets the file's key and
    removes the old file. The rotation records no new key for it (its records are
    conditional on the data not being deleted), and removes what its rename put back."""
    other = dataset(client, curator)  # rotated first (the order of upload)
    dataset_id = dataset(client, curator)
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    rotate_file = tables.rotate

    def delete() -> None:
        url = f"/v1/datasets/{dataset_id}/data"
        assert client.delete(url, headers=curator.headers).status_code == 200

    def deleted_meanwhile(
        path: Path, ring: bytes, file_key: bytes, before_replace: Callable[[], None], **kw: Any
    ) -> None:
        if not path.name.startswith(dataset_id):
            rotate_file(path, ring, file_key, before_replace, **kw)
            if when == "before its turn":  # after the list was read: not missing
                delete()
            return None
        if when == "before the rename":
            return rotate_file(path, ring, file_key, lambda: (delete(), before_replace()), **kw)
        rotate_file(path, ring, file_key, before_replace, **kw)
        delete()

    monkeypatch.setattr(tables, "rotate", deleted_meanwhile)
    code, out, err = rotate(new=new_key, previous=[old])
    assert code == 0, err
    # the other dataset; and this one when deleted once renamed (its old key was dropped
    # with the rename, under the dataset's row lock)
    report = json.loads(out)
    assert report["rotated"] == (2 if when == "after the rename" else 1)
    assert report["superseded"] == (0 if when == "after the rename" else 1)
    assert report["missing"] == []
    assert not (settings.datasets_dir / f"{dataset_id}.parquet").exists()
    assert list(settings.datasets_dir.iterdir()) == [settings.datasets_dir / f"{other}.parquet"]
    assert _sealed(client)[f"{dataset_id}.parquet"] is None


def test_previous_keys_are_checked(tmp_path: Path) -> None:
    from app.config import ConfigError

    bad = Settings(data_dir=tmp_path, previous_data_keys=SecretStr("nope"))
    with pytest.raises(ConfigError, match=r"CURATOR_PREVIOUS_DATA_KEYS \(key 1\)"):
        bad.previous_keys()
    two = [Fernet.generate_key(), Fernet.generate_key()]
    good = Settings(
        data_dir=tmp_path,
        previous_data_keys=SecretStr(f" {two[0].decode()} , {two[1].decode()}"),
    )
    assert good.previous_keys() == two
    assert Settings(data_dir=tmp_path, previous_data_keys=SecretStr(" ")).previous_keys() == []


def test_a_dataset_whose_data_were_deleted_is_not_missing(
    client: TestClient, curator: Caller, settings: Settings, new_key: bytes, rotate: Rotate
) -> None:
    """A dataset whose data were deleted has no file to re-encrypt: it is not reported
    missing (which would exit 1 on every rotation after a deletion)."""
    kept = dataset(client, curator)
    gone = dataset(client, curator)
    assert client.delete(f"/v1/datasets/{gone}/data", headers=curator.headers).status_code == 200
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    code, out, err = rotate(new=new_key, previous=[old])
    assert code == 0, err
    assert json.loads(out) == {
        "rotated": 1,
        "current": 0,
        "missing": [],
        "unreadable": [],
        "failed": [],
        "superseded": 0,
    }
    name = f"{kept}.parquet"
    assert _opens(settings.datasets_dir / name, new_key, _sealed(client)[name])


def test_rotation_refuses_a_database_that_is_not_migrated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the other commands: a database behind the code's revision is refused with a
    message (exit 2), before any file is touched, not read into a traceback."""
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("CURATOR_DATABASE_URL", raising=False)
    monkeypatch.delenv("CURATOR_REDIS_URL", raising=False)
    monkeypatch.setenv("CURATOR_DATA_KEY", Fernet.generate_key().decode())
    monkeypatch.setenv("CURATOR_PREVIOUS_DATA_KEYS", Fernet.generate_key().decode())
    with pytest.raises(SystemExit) as info:
        main(["rotate-data-key", "--json"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "run: curator migrate" in err
    assert "Traceback" not in err


def test_the_text_report_names_missing_and_unreadable_files(
    client: TestClient, curator: Caller, settings: Settings, new_key: bytes, rotate: Rotate
) -> None:
    """Without ``--json`` the report counts the files and names each one that could not
    be re-encrypted, and why (exit 1)."""
    dataset(client, curator)
    dataset(client, curator)
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    gone, kept = sorted(settings.datasets_dir.iterdir())
    gone.unlink()
    code, out, _ = rotate(new=Fernet.generate_key(), previous=[Fernet.generate_key()], text=True)
    assert code == 1
    assert out.splitlines() == [
        "re-encrypted 0 dataset file(s) under new keys of their own, sealed with "
        "CURATOR_DATA_KEY; 0 already were",
        f"missing: {gone.name} (its dataset row names it, the file is not there)",
        f"unreadable: {kept.name} (no key of the ring opens it; left as it was)",
    ]
    code, out, err = rotate(new=new_key, previous=[old], text=True)
    assert code == 1
    assert out.splitlines()[0] == (
        "re-encrypted 1 dataset file(s) under new keys of their own, sealed with "
        "CURATOR_DATA_KEY; 0 already were"
    )
    assert "retire the old key" not in err  # not while a file is missing


def _make_legacy(client: TestClient, dataset_id: str) -> Path:
    """Store a dataset's file as before datasets had keys of their own: its data keys
    wrapped with the service key directly, and no file keys in its row."""
    services = services_of(client)
    path = services.settings.datasets_dir / f"{dataset_id}.parquet"
    sealed = _sealed(client)[path.name]
    service_key = tables.current_key(services.data_key)
    tables.rotate(path, tables.file_ring(services.data_key, sealed), service_key)
    with services.db.transaction() as session:
        session.execute(
            update(Dataset).where(Dataset.storage_name == path.name).values(file_keys=None)
        )
    assert tables.opens_with(path, service_key)
    return path


def test_a_file_stored_before_datasets_had_keys_is_read_and_then_given_its_own(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    new_key: bytes,
    rotate: Rotate,
    rotated_client: TestClient,
) -> None:
    """A file stored before 0012 opens with the service key (no file keys in its row),
    so releases go on measuring it; a rotation re-encrypts it under a key of its own,
    sealed with the new service key, and a deletion can then forget it."""
    table_id = dataset(client, curator)
    path = _make_legacy(client, table_id)
    _measures(client, curator, table_id)

    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    code, out, err = rotate(new=new_key, previous=[old])
    assert code == 0, err
    assert json.loads(out)["rotated"] == 1
    sealed = _sealed(client)[path.name]
    assert sealed is not None
    assert tables.sealed_with(new_key, sealed)
    for service_key in (old, new_key):
        assert not tables.opens_with(path, service_key)
    assert _opens(path, new_key, sealed)
    _measures(rotated_client, curator, table_id)


def test_a_run_cut_short_after_recording_the_new_key_is_finished_by_the_next(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    new_key: bytes,
    rotate: Rotate,
    rotated_client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The new file key is recorded beside the old one before the rename, so a run cut
    short in between (here: the rename fails) leaves a file that opens with the keys
    recorded: releases go on. Those keys are sealed with the new service key already, but
    the file is still under the old file key: the next run does not take the dataset for
    done, and re-encrypts it."""
    table_id = dataset(client, curator)
    path = settings.datasets_dir / f"{table_id}.parquet"
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    before = path.read_bytes()

    def refused(*args: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(tables.os, "replace", refused)
        code, out, _ = rotate(new=new_key, previous=[old])
    assert code == 1
    assert json.loads(out)["failed"] == [path.name]
    assert path.read_bytes() == before
    assert [p.name for p in settings.datasets_dir.iterdir()] == [path.name]  # no staging left
    during = _sealed(client)[path.name]
    assert during is not None
    assert len(tables.unseal_file_keys(new_key, during)) == 2
    _measures(rotated_client, curator, table_id)

    code, out, err = rotate(new=new_key, previous=[old])
    assert code == 0, err
    assert json.loads(out)["rotated"] == 1
    (file_key,) = tables.unseal_file_keys(new_key, _sealed(client)[path.name] or "")
    assert tables.opens_with(path, file_key)
    code, out, _ = rotate(new=new_key, previous=[old])
    assert json.loads(out)["current"] == 1


def test_a_release_measuring_while_a_rotation_replaces_the_file_reads_its_key_again(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The measure stage reads the dataset's file keys, then opens the file. A rotation
    that replaced the file in between left it under a key the stage does not have: the
    stage reads the keys again instead of failing the release."""
    from app.releases import stages
    from app.storage.source import EncryptedTableSource

    table_id = dataset(client, curator)
    services = services_of(client)
    replaced: list[bool] = []

    def rotated_first(path: Path, key: bytes, *args: Any, **kwargs: Any) -> EncryptedTableSource:
        fresh = tables.new_file_key()
        tables.rotate(path, key, fresh)  # as a rotation would, once the stage read the key
        with services.db.transaction() as session:
            session.execute(
                update(Dataset)
                .where(Dataset.storage_name == path.name)
                .values(file_keys=tables.seal_file_keys(services.data_key, [fresh]))
            )
        replaced.append(True)
        return EncryptedTableSource(path, key, *args, **kwargs)

    monkeypatch.setattr(stages, "EncryptedTableSource", rotated_first)
    _measures(client, curator, table_id)
    assert replaced == [True]


def test_a_rotation_run_whole_between_anothers_record_and_rename_loses_nothing(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    new_key: bytes,
    rotate: Rotate,
    rotated_client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs at once. Run A records the new key beside the old one; before its rename,
    run B reads those keys, re-encrypts the file, renames its copy and records its own key
    alone. A's rename then put back a file under A's key, which no row recorded any more:
    the dataset could never be read again. A's rename is conditional, under the dataset's
    row lock, on its keys being still those it recorded: A gives way, B's file stays."""
    table_id = dataset(client, curator)
    path = settings.datasets_dir / f"{table_id}.parquet"
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    rotate_file = tables.rotate
    other_run: list[tuple[int, str, str]] = []

    def other_run_between(
        path: Path, ring: bytes, file_key: bytes, before_replace: Callable[[], None], **kw: Any
    ) -> None:
        def recorded_then_other_run() -> None:
            before_replace()  # A records [its key, the old key]; then B runs, whole
            monkeypatch.setattr(tables, "rotate", rotate_file)
            other_run.append(rotate(new=new_key, previous=[old]))

        rotate_file(path, ring, file_key, recorded_then_other_run, **kw)

    monkeypatch.setattr(tables, "rotate", other_run_between)
    code, _, err = rotate(new=new_key, previous=[old])
    assert code == 0, err
    ((other_code, other_out, _),) = other_run
    assert other_code == 0
    assert json.loads(other_out)["rotated"] == 1
    sealed = _sealed(client)[path.name]
    assert sealed is not None
    assert len(tables.unseal_file_keys(new_key, sealed)) == 1
    assert _opens(path, new_key, sealed)
    assert [p.name for p in settings.datasets_dir.iterdir()] == [path.name]
    _measures(rotated_client, curator, table_id)
