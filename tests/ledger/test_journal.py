"""The spend journal in DATA_DIR: a database restored from an older backup forgets spends
of releases already published; the service notices, refuses to start, and the operator's
re-charge puts them back in the ledger (app.ledger.journal)."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select, text

from app.config import Settings
from app.core import db
from app.core.errors import BudgetExhausted
from app.core.services import Services
from app.ledger import journal
from app.ledger import service as ledger
from app.ledger.units import epsilon_units
from app.models import AuditEvent, Release
from tests.ledger.test_ledger import _balance, _dataset, _releases

WORKER = ledger.Actor.worker()


def _journal(services: Services) -> journal.SpendJournal:
    return journal.SpendJournal(services.settings.spend_journal_path)


def _lines(services: Services) -> list[dict[str, object]]:
    path = services.settings.spend_journal_path
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _spend(services: Services, dataset_id: uuid.UUID, release_id: uuid.UUID, eps: float) -> None:
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_id, epsilon_units(eps, charge=True), 0, WORKER)
    with services.db.transaction() as session:
        ledger.commit(session, release_id, WORKER)


def _check(services: Services) -> None:
    journal.check(services.db, _journal(services))


def test_a_spend_is_journalled_once_it_committed(services: Services) -> None:
    dataset_id = _dataset(services, 5.0, 0.0)
    spent, refunded, rolled_back, non_dp = _releases(services, dataset_id, 4)
    _spend(services, dataset_id, spent, 1.0)
    assert [(line["release"], line["kind"]) for line in _lines(services)] == [
        (str(spent), "commit")
    ]
    assert _lines(services)[0]["epsilon"] == epsilon_units(1.0, charge=True)
    assert _lines(services)[0]["dataset"] == str(dataset_id)
    assert _lines(services)[0]["mechanism"] == "test"

    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, refunded, 1, 0, WORKER)
        ledger.refund(session, refunded, WORKER)  # a refund spends nothing
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, rolled_back, 1, 0, WORKER)
    with pytest.raises(RuntimeError), services.db.transaction() as session:
        ledger.commit(session, rolled_back, WORKER)
        raise RuntimeError("the transaction fails after the commit entry")
    with services.db.transaction() as session:
        ledger.record_non_dp(session, dataset_id, non_dp, WORKER)
    assert [(line["release"], line["kind"]) for line in _lines(services)] == [
        (str(spent), "commit"),
        (str(non_dp), "non_dp"),
    ]
    _check(services)  # the ledger holds all it records


def test_a_missing_journal_is_written_from_the_ledger(services: Services) -> None:
    """A deployment older than the journal (or a new DATA_DIR) starts with the ledger's
    spends journalled, not refused, and not with an empty journal."""
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    _spend(services, dataset_id, release_id, 1.0)
    services.settings.spend_journal_path.unlink()
    _check(services)
    assert [line["release"] for line in _lines(services)] == [str(release_id)]
    _check(services)  # written once
    assert len(_lines(services)) == 1


def test_a_new_deployment_creates_its_journal_without_a_warning(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """The first start of a new deployment (an empty ledger) creates an empty journal and
    says so at INFO; a missing journal beside a ledger that holds spends (a database
    restored onto a new DATA_DIR, an upgrade) is the WARNING."""
    with caplog.at_level(logging.INFO, logger="curator"):
        _check(services)
    assert services.settings.spend_journal_path.read_text() == ""
    created = [r for r in caplog.records if "spend journal" in r.getMessage()]
    assert [r.levelno for r in created] == [logging.INFO]

    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    _spend(services, dataset_id, release_id, 1.0)
    services.settings.spend_journal_path.unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="curator"):
        _check(services)
    written = [r for r in caplog.records if "spend journal" in r.getMessage()]
    assert [r.levelno for r in written] == [logging.WARNING]
    assert "(1 spends)" in written[0].getMessage()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_database_restored_from_before_a_spend_is_refused_until_recharged(
    settings: Settings, tmp_path: Path
) -> None:
    """The real thing on SQLite: an online backup (the sqlite3 backup API) before a
    release spends, the spend, the old database put back. Without the journal the budget
    came back whole and was spent again."""
    services = Services.build(settings)
    dataset_id = _dataset(services, 5.0, 0.0)
    published, second = _releases(services, dataset_id, 2)
    database = Path(settings.resolved_database_url.removeprefix("sqlite:///"))
    backup = tmp_path / "backup.db"
    with sqlite3.connect(database) as source, sqlite3.connect(backup) as copy:
        source.backup(copy)
    _spend(services, dataset_id, published, 4.0)
    services.close()
    for leftover in database.parent.glob(database.name + "-*"):
        leftover.unlink()
    backup.replace(database)

    services = Services.build(settings)
    try:
        assert _balance(services, dataset_id).epsilon_spent == 0  # the ledger forgot it
        with pytest.raises(journal.LostSpends) as refused:
            _check(services)
        message = str(refused.value)
        assert f"dataset {dataset_id}: epsilon 4, delta 0" in message
        assert "curator reconcile-ledger --recharge" in message

        with services.db.transaction() as session:
            lost = journal.lost_spends(session, _journal(services))
            done = journal.recharge(session, _journal(services), lost)
        assert done.settled == [str(published)]  # its row predates the backup, its spend not
        _check(services)
        balance = _balance(services, dataset_id)
        assert balance.epsilon_spent == epsilon_units(4.0, charge=True)
        with pytest.raises(BudgetExhausted), services.db.transaction() as session:
            ledger.reserve(session, dataset_id, second, epsilon_units(4.0, charge=True), 0, WORKER)
        with services.db.transaction(read_only=True) as session:
            release = session.get(Release, published)
            assert release is not None
            assert release.status == "failed"
            assert release.message == journal.RECHARGED_MESSAGE
            events = session.scalars(
                select(AuditEvent).where(AuditEvent.action == "ledger.recharge_lost_spend")
            ).all()
            assert [e.object_id for e in events] == [str(published)]
    finally:
        services.close()


def test_a_release_the_backup_caught_measuring_is_settled_and_ended(services: Services) -> None:
    """A backup taken while a release was measuring: the restored database holds its
    reservation only. Re-measured, it would draw fresh noise on the same data for one
    charge; the re-charge commits the reservation and ends the release instead."""
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_id, epsilon_units(2.0, charge=True), 0, WORKER)
        release = session.get(Release, release_id)
        assert release is not None
        release.status = "measuring"
    _check(services)  # writes the (empty) journal
    # what the journal held when the database was restored: the commit that followed
    _journal(services).append(
        {
            "release": str(release_id),
            "dataset": str(dataset_id),
            "kind": "commit",
            "epsilon": epsilon_units(2.0, charge=True),
            "delta": 0,
            "mechanism": "test",
        }
    )
    with pytest.raises(journal.LostSpends) as refused:
        _check(services)
    assert "not in the database at all" not in str(refused.value)  # it knows the dataset
    with services.db.transaction() as session:
        done = journal.recharge(
            session, _journal(services), journal.lost_spends(session, _journal(services))
        )
    assert done.settled == [str(release_id)]
    _check(services)
    assert ledger_state(services, release_id) == ("committed", "failed")
    assert _balance(services, dataset_id).epsilon_reserved == 0
    assert _balance(services, dataset_id).epsilon_spent == epsilon_units(2.0, charge=True)


def ledger_state(services: Services, release_id: uuid.UUID) -> tuple[str, str]:
    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, release_id)
        assert release is not None
        return ledger.reservation_state(session, release_id), release.status


def test_a_lost_spend_of_a_dataset_the_database_does_not_know_is_accepted(
    services: Services,
) -> None:
    _check(services)
    _journal(services).append(
        {
            "release": str(uuid.uuid4()),
            "dataset": str(uuid.uuid4()),
            "kind": "commit",
            "epsilon": 5,
            "delta": 0,
            "mechanism": "test",
        }
    )
    with pytest.raises(
        journal.LostSpends, match=r"1 of these dataset\(s\) are not in the database"
    ):
        _check(services)
    with services.db.transaction() as session:
        done = journal.recharge(
            session, _journal(services), journal.lost_spends(session, _journal(services))
        )
    assert len(done.unknown_dataset) == 1
    _check(services)


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURATOR_")}
    env["CURATOR_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-c", "from app.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_serve_and_worker_refuse_to_start_on_lost_spends_and_reconcile_recharges(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    assert _cli(data_dir, "migrate").returncode == 0
    settings = Settings(data_dir=data_dir, min_free_bytes=0)
    services = Services.build(settings)
    try:
        dataset_id = _dataset(services, 5.0, 0.0)
        _check(services)
        _journal(services).append(
            {
                "release": str(uuid.uuid4()),
                "dataset": str(dataset_id),
                "kind": "commit",
                "epsilon": epsilon_units(1.5, charge=True),
                "delta": 0,
                "mechanism": "test",
            }
        )
    finally:
        services.close()
    for command in (["serve", "--port", "0"], ["worker"], ["reconcile-ledger"]):
        refused = _cli(data_dir, *command)
        assert refused.returncode == 1, (command, refused.stderr)
        assert f"dataset {dataset_id}: epsilon 1.5, delta 0" in refused.stderr
        assert "not in the database at all" not in refused.stderr  # it knows the dataset
    recharged = _cli(data_dir, "reconcile-ledger", "--recharge")
    assert recharged.returncode == 0, recharged.stderr
    assert "charged 1 lost spend(s)" in recharged.stdout
    assert "1 of releases it had lost, recorded again" in recharged.stdout
    assert _cli(data_dir, "reconcile-ledger").returncode == 0


def test_a_journal_that_cannot_be_written_is_logged_and_the_spend_stands(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    services.settings.spend_journal_path.mkdir()  # a directory: no line can be appended
    with caplog.at_level(logging.ERROR, logger="curator"):
        _spend(services, dataset_id, release_id, 1.0)
    assert _balance(services, dataset_id).epsilon_spent == epsilon_units(1.0, charge=True)
    assert f"release {release_id}: its spend is committed but could not be written" in caplog.text


def test_the_journal_is_group_writable_as_the_umask_allows(services: Services) -> None:
    """An API and workers running as two users of one group share DATA_DIR (umask 007,
    README): a journal the API wrote at its start (0640) took no line of a worker's spend."""
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    mask = os.umask(0o007)
    try:
        _check(services)  # the API's start writes the journal
        assert services.settings.spend_journal_path.stat().st_mode & 0o777 == 0o660
        services.settings.spend_journal_path.unlink()
        _spend(services, dataset_id, release_id, 1.0)  # a worker's spend writes it
        assert services.settings.spend_journal_path.stat().st_mode & 0o777 == 0o660
    finally:
        os.umask(mask)


def _lost_commit(services: Services, dataset_id: uuid.UUID, release_id: uuid.UUID) -> None:
    """The journal holds a commit of ``release_id`` that the ledger lacks."""
    _check(services)
    _journal(services).append(
        {
            "release": str(release_id),
            "dataset": str(dataset_id),
            "kind": "commit",
            "epsilon": epsilon_units(2.0, charge=True),
            "delta": 0,
            "mechanism": "test",
        }
    )


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_recharge_locks_the_release_then_the_dataset_as_a_worker_does(
    services: Services,
) -> None:
    """A worker's settle locks its release, then its dataset. The re-charge took the
    dataset (FOR UPDATE), then the release: against a worker holding the release it was a
    deadlock, PostgreSQL aborting one of the two (seen: DeadlockDetected)."""
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_id, epsilon_units(2.0, charge=True), 0, WORKER)
    _lost_commit(services, dataset_id, release_id)
    errors: list[BaseException] = []
    worker_holds_release = threading.Event()

    def worker() -> None:
        try:
            with services.db.transaction() as session:
                session.execute(
                    select(Release).where(Release.id == release_id).with_for_update()
                ).one()
                worker_holds_release.set()
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:  # until the re-charge waits for a lock
                    with services.db.transaction(read_only=True) as probe:
                        waiting = probe.scalar(
                            text(
                                "SELECT count(*) FROM pg_stat_activity WHERE "
                                "datname = current_database() AND wait_event_type = 'Lock'"
                            )
                        )
                    if waiting:
                        break
                    time.sleep(0.05)
                ledger.lock_dataset(session, dataset_id)
        except BaseException as exc:  # pragma: no cover - the failure reported below
            errors.append(exc)

    def recharge() -> None:
        worker_holds_release.wait(20)
        try:
            with services.db.transaction() as session:
                journal.recharge(
                    session, _journal(services), journal.lost_spends(session, _journal(services))
                )
        except BaseException as exc:  # pragma: no cover - the failure reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker), threading.Thread(target=recharge)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [f"{type(e).__name__}: {str(e)[:60]}" for e in errors] == []
    _check(services)
    assert ledger_state(services, release_id) == ("committed", "failed")


def test_a_recharge_skips_a_release_spent_since_the_list_was_read(services: Services) -> None:
    """A worker that committed the spend between the listing and the re-charge (the
    service was not stopped): charging it again would spend it twice."""
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_id, epsilon_units(2.0, charge=True), 0, WORKER)
    _lost_commit(services, dataset_id, release_id)
    with services.db.transaction() as session:
        lost = journal.lost_spends(session, _journal(services))
    with services.db.transaction() as session:
        ledger.commit(session, release_id, WORKER)  # the worker, meanwhile
    with services.db.transaction() as session:
        done = journal.recharge(session, _journal(services), lost)
    assert done.settled == []
    assert _balance(services, dataset_id).epsilon_spent == epsilon_units(2.0, charge=True)


def test_a_start_that_writes_the_journal_is_not_refused_for_a_spend_committed_meanwhile(
    services: Services,
) -> None:
    """A worker started beside a running service, on a deployment without a journal yet:
    a spend the service committed and journalled while the start wrote the journal from
    the ledger. On SQLite the start's one read transaction compared the journal with the
    ledger of its snapshot, taken before that spend: refused, for a spend the ledger
    holds."""
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    spent_meanwhile: list[bool] = []

    class Journal(journal.SpendJournal):
        def append(self, *records: dict[str, object]) -> None:
            super().append(*records)
            if not spent_meanwhile:  # the running service's spend, once the start wrote
                spent_meanwhile.append(True)
                _spend(services, dataset_id, release_id, 1.0)

    assert not services.settings.spend_journal_path.exists()
    journal.check(services.db, Journal(services.settings.spend_journal_path))
    assert spent_meanwhile
    assert [line["release"] for line in _lines(services)] == [str(release_id)]


def test_a_spend_the_journal_missed_is_caught_up_at_the_next_start(services: Services) -> None:
    """A spend committed whose line was never written (its worker killed after the
    commit, a commit whose outcome the measure stage's retry never learnt, a full disk):
    the next start appends it from the ledger, so a database restored from before it is
    refused afterwards. Without this, that loss went unseen for good."""
    dataset_id = _dataset(services, 5.0, 0.0)
    kept, missed = _releases(services, dataset_id, 2)
    _spend(services, dataset_id, kept, 1.0)
    lines = services.settings.spend_journal_path.read_text()
    _spend(services, dataset_id, missed, 1.0)
    services.settings.spend_journal_path.write_text(lines)  # its line never written
    _check(services)
    assert sorted(line["release"] for line in _lines(services)) == sorted([str(kept), str(missed)])
    _check(services)  # once
    assert len(_lines(services)) == 2


def test_a_start_on_a_full_disk_is_not_refused_for_the_journal(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """The start's catch-up (or a missing journal's first write) on a full or read-only
    DATA_DIR: the OSError ended curator serve and worker with a traceback, although a
    spend whose line fails goes on."""
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    _spend(services, dataset_id, release_id, 1.0)
    services.settings.spend_journal_path.write_text("")  # its line was refused

    class Full(journal.SpendJournal):
        def append(self, *records: dict[str, object]) -> None:
            raise OSError(28, "No space left on device")

    with caplog.at_level(logging.ERROR, logger="curator"):
        journal.check(services.db, Full(services.settings.spend_journal_path))
    assert "1 spend(s) of the ledger could not be written" in caplog.text
    assert "No space left on device" in caplog.text


def test_a_line_cut_short_leaves_the_next_spend_readable(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A write a full disk refused in part leaves a fragment without its newline: the
    next spend's line was glued to it, unreadable, so a restore losing that spend went
    unseen until a start caught it up."""
    dataset_id = _dataset(services, 5.0, 0.0)
    first, second = _releases(services, dataset_id, 2)
    _spend(services, dataset_id, first, 1.0)
    path = services.settings.spend_journal_path
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"release":"' + str(uuid.uuid4())[:9])
    _spend(services, dataset_id, second, 1.0)
    read = _journal(services).read()
    assert set(read.spends) == {str(first), str(second)}
    assert read.cut_short == [2]
    with caplog.at_level(logging.WARNING, logger="curator"):
        _check(services)
    assert "line(s) 2 cut short" in caplog.text


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("epsilon", "1.5", "'epsilon' is not a whole number of ledger units"),
        ("epsilon", -3, "'epsilon' is not a whole number of ledger units"),
        ("delta", True, "'delta' is not a whole number of ledger units"),
        ("release", "r-1", "'release' is not an id"),
        ("kind", "refund", "'kind' is not one of commit, non_dp"),
    ],
)
def test_a_hand_edited_line_refuses_the_start_naming_the_line(
    services: Services, field: str, value: object, problem: str
) -> None:
    """A whole JSON line that is not a record the service writes (an amount edited into a
    string) crashed the start check with a traceback (int('1.5')), or was read as a spend
    of another amount; it may record a spend, so the start is refused, naming the line."""
    from app.cli import _check_spends

    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    _spend(services, dataset_id, release_id, 1.0)
    record = {**_lines(services)[0], "release": str(uuid.uuid4()), field: value}
    path = services.settings.spend_journal_path
    path.write_text(path.read_text() + json.dumps(record) + "\n")
    with pytest.raises(journal.JournalCorrupt, match=f"line 2 of .*{re.escape(problem)}"):
        _check(services)
    assert _check_spends(services) == 1


def test_a_spend_line_a_full_disk_writes_in_part_is_logged_as_not_written(
    services: Services, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write a full disk refuses in part returns the count written, not an error: the
    rest of the line was dropped silently, and the spend, left out of the journal, was
    never logged as not written (README: 'a line a full or read-only disk refused,
    logged as an error naming the release')."""
    dataset_id = _dataset(services, 5.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    path = services.settings.spend_journal_path
    path.touch()
    write = os.write
    calls: list[int] = []

    def is_journal(fd: int) -> bool:
        return os.path.realpath(f"/proc/self/fd/{fd}") == str(path.resolve())

    def full(fd: int, data: bytes) -> int:
        if not is_journal(fd):
            return write(fd, data)
        calls.append(len(data))
        if len(calls) == 1:
            return write(fd, bytes(data)[:10])  # the room left on the disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal.os, "write", full)
    with caplog.at_level(logging.ERROR, logger="curator"):
        _spend(services, dataset_id, release_id, 1.0)
    monkeypatch.undo()
    assert len(calls) == 2
    assert f"release {release_id}: its spend is committed but could not be written" in (caplog.text)
    assert "No space left on device" in caplog.text


def test_lost_spends_tell_known_from_unknown_datasets_in_chunks(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The datasets of lost spends are looked up in chunks (one IN list of every id
    failed past SQLite's 32,766 variables); each chunk's answer counts."""
    monkeypatch.setattr(db, "IN_CHUNK", 2)
    known = [_dataset(services, 5.0, 0.0) for _ in range(3)]
    unknown = [uuid.uuid4() for _ in range(2)]
    _check(services)
    _journal(services).append(
        *(
            {
                "release": str(uuid.uuid4()),
                "dataset": str(dataset_id),
                "kind": "commit",
                "epsilon": 5,
                "delta": 0,
                "mechanism": "test",
            }
            for dataset_id in [*known, *unknown]
        )
    )
    with services.db.transaction(read_only=True) as session:
        lost = journal.lost_spends(session, _journal(services))
    assert {s.dataset_id for s in lost if s.dataset_known} == {str(d) for d in known}
    assert {s.dataset_id for s in lost if not s.dataset_known} == {str(d) for d in unknown}
