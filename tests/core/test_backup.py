"""curator backup: a consistent copy of an embedded deployment while it runs, restorable
into a fresh DATA_DIR (app.core.backup)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.cli import main
from app.config import KEY_FILE_NAME, Settings
from app.core import backup as backup_module
from app.core.backup import MANIFEST_NAME, BackupError, backup
from app.main import create_app
from tests.conftest import Caller
from tests.releases.helpers import dataset, finished_release, request_release, run_all, services_of

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def _published(client: TestClient, curator: Caller) -> tuple[str, str]:
    dataset_id = dataset(client, curator, epsilon=5.0)
    release = finished_release(
        client, curator, dataset_id, {"mechanism": "smooth_synopsis", "epsilon": 1.0}
    )
    return dataset_id, release["id"]


def _command(settings: Settings, monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    """``curator <argv>`` against the test service's data directory and database (without
    a ``CURATOR_DATA_KEY``: the key is ``data.key``'s); its exit code."""
    monkeypatch.setenv("CURATOR_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("CURATOR_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.delenv("CURATOR_DATA_KEY", raising=False)
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return int(done.value.code or 0)


def test_a_backup_of_a_running_service_restores_into_a_fresh_data_dir(
    client: TestClient, curator: Caller, settings: Settings, tmp_path: Path
) -> None:
    dataset_id, release_id = _published(client, curator)
    services = services_of(client)
    # the service's database is open, its recent commits in the write-ahead log: a plain
    # copy of the database file is not a backup
    plain = tmp_path / "plain.db"
    shutil.copy(Path(settings.resolved_database_url.removeprefix("sqlite:///")), plain)
    with sqlite3.connect(plain) as copied:
        assert copied.execute("SELECT count(*) FROM ledger_entries").fetchone() == (0,)

    target = tmp_path / "backup"
    report = backup(settings, services.data_key, target, with_key=False)
    assert report.problems == []
    assert (report.datasets, report.releases, report.key_included) == (1, 1, False)
    assert sorted(p.name for p in target.iterdir()) == [
        "curator.db",
        "datasets",
        MANIFEST_NAME,
        "releases",
    ]  # no key, no spend journal, no queue
    assert json.loads((target / MANIFEST_NAME).read_text())["releases"] == 1
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    with sqlite3.connect(target / "curator.db") as copied:
        assert copied.execute("SELECT count(*) FROM ledger_entries").fetchone() == (2,)
        assert copied.execute("PRAGMA journal_mode").fetchone() == ("delete",)

    restored = tmp_path / "restored"
    shutil.copytree(target, restored)
    shutil.copy2(settings.data_dir / KEY_FILE_NAME, restored / KEY_FILE_NAME)
    fresh = Settings(
        data_dir=restored,
        database_url=f"sqlite:///{restored / 'curator.db'}",
        redis_url=None,
        min_free_bytes=0,
        queue_name=settings.queue_name + "-restored",
    )
    with TestClient(create_app(fresh)) as again:
        synopsis = again.get(f"/v1/releases/{release_id}/synopsis", headers=curator.headers)
        assert synopsis.status_code == 200, synopsis.text
        budget = again.get(f"/v1/datasets/{dataset_id}/budget", headers=curator.headers).json()
        assert budget["epsilon_spent"] == 1.0
        # the dataset file opens with the restored key: a new release measures it
        response = request_release(
            again, curator, dataset_id, {"mechanism": "smooth_synopsis", "epsilon": 1.0}
        )
        assert response.status_code == 202, response.text
        run_all(again, response.json()["id"])
        status = again.get(f"/v1/releases/{response.json()['id']}", headers=curator.headers)
        assert status.json()["status"] == "succeeded", status.json()


def test_the_key_is_included_only_when_asked(
    client: TestClient, curator: Caller, settings: Settings, tmp_path: Path
) -> None:
    _published(client, curator)
    report = backup(settings, services_of(client).data_key, tmp_path / "b", with_key=True)
    assert report.key_included
    key = tmp_path / "b" / KEY_FILE_NAME
    assert key.read_bytes() == (settings.data_dir / KEY_FILE_NAME).read_bytes()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_a_copy_that_does_not_match_its_database_is_reported_without_a_manifest(
    client: TestClient, curator: Caller, settings: Settings, tmp_path: Path
) -> None:
    """What a backup taken during a key rotation or a re-synthesis would hold: a dataset
    file the copied row's keys do not open, a published version that is gone."""
    dataset_id, release_id = _published(client, curator)
    services = services_of(client)
    (stored,) = settings.datasets_dir.glob("*.parquet")
    other = dataset(client, curator)
    (replacement,) = (p for p in settings.datasets_dir.glob("*.parquet") if p != stored)
    shutil.copy2(replacement, stored)  # another dataset's file, under another file key
    shutil.rmtree(settings.releases_dir / release_id)
    report = backup(settings, services.data_key, tmp_path / "b", with_key=False)
    assert len(report.problems) == 2, report.problems
    assert f"dataset file {stored.name}: does not open" in report.problems[0]
    assert f"release {release_id}: its published version v0 is missing" in report.problems[1]
    assert not (tmp_path / "b" / MANIFEST_NAME).exists()
    assert dataset_id != other


def test_a_deletion_of_a_releases_files_during_a_backup_is_reported(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The snapshot names the version published; its curator deletes its files before
    they are copied: the backup says so (it blamed only a re-synthesis)."""
    _, release_id = _published(client, curator)
    snapshot = backup_module._snapshot

    def then_delete(source: Path, target: Path) -> None:
        snapshot(source, target)
        deleted = client.delete(f"/v1/releases/{release_id}/artifacts", headers=curator.headers)
        assert deleted.status_code == 200, deleted.text

    monkeypatch.setattr(backup_module, "_snapshot", then_delete)
    report = backup(settings, services_of(client).data_key, tmp_path / "b", with_key=False)
    assert report.problems == [
        f"release {release_id}: its published version v0 is missing (replaced by a "
        "re-synthesis, or its files deleted by its curator, during the backup?)"
    ]
    assert not (tmp_path / "b" / MANIFEST_NAME).exists()


def test_a_backup_refuses_a_used_directory_and_postgresql(
    settings: Settings, tmp_path: Path
) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("x")
    settings.prepare()
    with pytest.raises(BackupError, match="not an empty directory"):
        backup(settings, b"", used, with_key=False)
    elsewhere = settings.model_copy(update={"database_url": "postgresql+psycopg://u@h/db"})
    with pytest.raises(BackupError, match="pg_dump"):
        backup(elsewhere, b"", tmp_path / "pg", with_key=False)


def test_a_backup_refuses_a_directory_that_is_not_utf8_before_writing(
    client: TestClient, curator: Caller, settings: Settings, tmp_path: Path
) -> None:
    """pyarrow opens each copied dataset file and names files in UTF-8 only: a target of
    Latin-1 bytes raised UnicodeDecodeError halfway, the database and files copied."""
    dataset(client, curator)
    target = Path(os.fsdecode(os.fsencode(tmp_path) + b"/b\xe0ckup"))
    with pytest.raises(BackupError, match="not a UTF-8 path"):
        backup(settings, services_of(client).data_key, target, with_key=False)
    assert not target.exists()


def test_the_command_backs_up_and_says_where_the_key_is(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _published(client, curator)
    assert _command(settings, monkeypatch, "backup", str(tmp_path / "b")) == 0
    out = capsys.readouterr()
    assert "1 dataset file(s) and 1 published release(s)" in out.out
    assert "the data key is not in the backup" in out.err
    with pytest.raises(SystemExit) as again:
        main(["backup", str(tmp_path / "b")])
    assert again.value.code == 2


def test_a_start_without_the_data_key_says_so(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A DATA_DIR restored without data.key gets a new key at start, and every release
    of its datasets failed 'internal error (PermissionError)' with nothing said at start."""
    from cryptography.fernet import Fernet

    from app.cli import _check_spends
    from app.core.services import Services

    dataset(client, curator)
    with_its_key = Services.build(settings)
    try:
        with caplog.at_level(logging.ERROR, logger="curator"):
            assert _check_spends(with_its_key) is None
        assert "file keys" not in caplog.text
    finally:
        with_its_key.close()
    other_key = settings.model_copy(update={"data_key": SecretStr(Fernet.generate_key().decode())})
    without = Services.build(other_key)
    try:
        with caplog.at_level(logging.ERROR, logger="curator"):
            assert _check_spends(without) is None  # downloads and answers go on
    finally:
        without.close()
    assert "1 dataset(s) hold file keys that CURATOR_DATA_KEY" in caplog.text
    assert "put the key back" in caplog.text


def test_no_key_is_generated_for_a_database_holding_stored_datasets(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A DATA_DIR restored without data.key (or a command run without CURATOR_DATA_KEY)
    got a new key generated into data.key by whichever command ran first (curator
    migrate, create-user, serve), which opens none of the stored files; files uploaded
    under it were then lost to a later start with the real key."""
    from cryptography.fernet import Fernet

    from app.config import ConfigError
    from app.core.services import Services

    dataset_id = dataset(client, curator)
    key_file = settings.data_dir / KEY_FILE_NAME
    key = key_file.read_bytes()
    key_file.unlink()
    with pytest.raises(ConfigError, match=r"holds 1 dataset\(s\) whose files were sealed"):
        Services.build(settings)
    assert not key_file.exists()
    for argv in (["create-user", "--name", "a", "--role", "admin"], ["migrate"]):
        code = _command(settings, monkeypatch, *argv)
        assert not key_file.exists(), argv
    assert code == 0  # migrate needs no key
    assert "no new key was generated" in capsys.readouterr().err
    # a key set explicitly, even another one, is the operator's choice
    other = settings.model_copy(update={"data_key": SecretStr(Fernet.generate_key().decode())})
    Services.build(other).close()
    # with the stored data deleted, a new key seals nothing that exists
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    deleted = client.delete(f"/v1/datasets/{dataset_id}/data", headers=curator.headers)
    assert deleted.status_code == 200
    key_file.unlink()
    Services.build(settings).close()
    assert key_file.exists()


def test_no_key_is_generated_for_a_database_holding_files_stored_before_file_keys(
    client: TestClient, curator: Caller, settings: Settings
) -> None:
    """A file stored before revision 0012 has its data keys wrapped with the service key
    directly (``file_keys`` null): the refusal counted only datasets with file keys of
    their own, so a deployment upgraded from before 0012 and started without its key got
    a new one generated, which opens none of those files."""
    from sqlalchemy import text

    from app.config import ConfigError
    from app.core.services import Services

    dataset(client, curator)
    with services_of(client).db.engine.begin() as connection:
        connection.execute(text("UPDATE datasets SET file_keys = NULL"))  # as stored before 0012
    key_file = settings.data_dir / KEY_FILE_NAME
    key_file.unlink()
    with pytest.raises(ConfigError, match=r"holds 1 dataset\(s\) whose files were sealed"):
        Services.build(settings)
    assert not key_file.exists()
    # a database not yet migrated past 0008 (create_app checks no schema: it failed on the
    # missing column) has no data_deleted_at, as no data were ever deleted: all count
    with services_of(client).db.engine.begin() as connection:
        for column in ("file_keys", "data_deleted_at"):
            connection.execute(text(f"ALTER TABLE datasets DROP COLUMN {column}"))
    with pytest.raises(ConfigError, match=r"holds 1 dataset\(s\) whose files were sealed"):
        Services.build(settings)
    assert not key_file.exists()


def test_a_version_removed_while_it_is_copied_is_reported(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A re-synthesis prunes the published version's files while the backup copies them:
    copytree collects the vanished files into one shutil.Error, which ended the command
    with a traceback instead of the report (exit 1, no manifest)."""
    _, release_id = _published(client, curator)
    services = services_of(client)
    copytree = shutil.copytree

    def pruned_meanwhile(src: Path, dst: Path) -> object:
        def vanished(source: str, target: str) -> object:
            Path(source).unlink()  # the prune, between copytree's listing and this copy
            return shutil.copy2(source, target)

        return copytree(src, dst, copy_function=vanished)

    monkeypatch.setattr("app.core.backup.shutil.copytree", pruned_meanwhile)
    report = backup(settings, services.data_key, tmp_path / "b", with_key=False)
    assert [p.split(":")[0] for p in report.problems] == [f"release {release_id}"]
    assert not (tmp_path / "b" / MANIFEST_NAME).exists()


def test_the_command_warns_when_the_key_is_in_the_backup(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _published(client, curator)
    assert _command(settings, monkeypatch, "backup", "--with-key", str(tmp_path / "b")) == 0
    err = capsys.readouterr().err
    assert "the data key is in the backup" in err
    assert "opens every dataset file" in err


def test_a_backup_with_the_key_checks_its_files_open_with_that_key_alone(
    client: TestClient, curator: Caller, settings: Settings, tmp_path: Path
) -> None:
    """A new data key set, the old one in CURATOR_PREVIOUS_DATA_KEYS, the rotation not yet
    run: the files open with the service's ring, and the check passed, but --with-key
    holds the new key alone, with which the restored files did not open."""
    from cryptography.fernet import Fernet

    from app.storage.tables import key_ring

    dataset(client, curator)
    old = (settings.data_dir / KEY_FILE_NAME).read_bytes().strip()
    new = Fernet.generate_key()
    rotating = settings.model_copy(
        update={"data_key": SecretStr(new.decode()), "previous_data_keys": SecretStr(old.decode())}
    )
    ring = key_ring(new, [old])
    assert backup(rotating, ring, tmp_path / "apart", with_key=False).problems == []
    report = backup(rotating, ring, tmp_path / "b", with_key=True)
    assert len(report.problems) == 1
    assert "opens only with a previous data key" in report.problems[0]
    assert not (tmp_path / "b" / MANIFEST_NAME).exists()


def test_the_command_without_the_service_s_key_refuses_and_writes_no_key(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run from a shell without the service's CURATOR_DATA_KEY (and no data.key): the
    command generated a new data.key in DATA_DIR, and every file then failed the check as
    'a key rotation ran during the backup?'."""
    _published(client, curator)
    (settings.data_dir / KEY_FILE_NAME).unlink()  # the service's key is in its environment
    assert _command(settings, monkeypatch, "backup", str(tmp_path / "b")) == 2
    assert "no data key" in capsys.readouterr().err
    assert not (settings.data_dir / KEY_FILE_NAME).exists()
