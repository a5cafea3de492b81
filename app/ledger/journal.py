"""The spend journal: a copy, outside the database, of every spend the ledger committed.

The ledger lives in the database, and a database restored from a backup forgets every
spend committed after the backup was taken, although those releases' outputs were
published (downloaded, answered from) meanwhile: the budget they spent would be spent
again (DESIGN §2 rule 6, across a restore). So each spend (a ``commit``, or a ``non_dp``
record: the data were read for an output) is also appended, once its transaction has
committed, as one JSON line to ``<DATA_DIR>/spends.jsonl``; the journal only grows. At
start (``curator serve``, ``curator worker``) :func:`lost_spends` compares it with the
ledger: a spend the journal holds and the ledger does not is a spend the database lost,
and the service refuses to start (:class:`LostSpends`) until the operator re-charges it
(:func:`recharge`, ``curator reconcile-ledger --recharge``), which appends the spend to
the ledger again, recorded in the audit log, whatever the budget left (it was spent).

A line is written after the commit: a process killed between the two leaves a spend out
of the journal (which then cannot tell that spend's loss). Never before it: a spend that
did not commit would read as lost. A journal missing altogether (a deployment older than
it, or a new ``DATA_DIR``) is written from the ledger as it is (:func:`ensure_journal`):
it then knows what the database knows, so a database and a ``DATA_DIR`` both restored from
one old backup lose spends that nothing here can tell; the README's "Backups" says what
to keep. A line cut short is skipped (its spend, which the ledger holds, is appended again
at the next start); a whole line that is not a record written here refuses the start
(:class:`JournalCorrupt`): it may record a spend.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core import audit
from app.core.db import Database, in_chunks, on_commit
from app.ledger.units import delta_value, epsilon_value
from app.models import Dataset, LedgerEntry, Release
from app.models.base import utcnow

log = logging.getLogger("curator.ledger")

#: Where a session finds the journal its spends are appended to (``Session.info``).
SESSION_KEY = "curator_spend_journal"
#: The ledger kinds that are spends: the data were read for an output.
SPEND_KINDS = ("commit", "non_dp")
#: The message of a release that the re-charge ends (it was measured, published, then
#: forgotten by a restored database).
RECHARGED_MESSAGE = (
    "measured before the database was restored from an older backup, which lost its "
    "measurement; its spend was charged again (curator reconcile-ledger --recharge)"
)


class SpendJournal:
    """The append-only journal file (``Settings.spend_journal_path``: ``DATA_DIR/spends.jsonl``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, *records: dict[str, Any]) -> None:
        """Append ``records``, one JSON line each, in one write (``O_APPEND``: lines of
        concurrent processes never interleave on a local filesystem), synced to disk.
        After a line cut short (a write a full disk refused in part), the records start
        on a line of their own: glued to its fragment, the first would be unreadable."""
        if not records:
            return
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        # 0660 less the umask, as the service's other files: an API and workers running as
        # two users of one group (README, CURATOR_DATA_DIR) both append to it
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o660)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # every whole line ends so: two processes that both see the fragment
                # leave an empty line, which reading skips
                data = b"\n" + data
            # a write a full disk refuses in part returns its count, not an error: the
            # rest is written on (a line whole if room was made meanwhile), or that next
            # write raises, and the caller logs the spend as not written
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> JournalContents:
        """The spends by release id, the ids of releases whose loss an operator accepted,
        and the numbers of lines cut short (a write a full disk or a kill interrupted:
        skipped). Raises :class:`JournalCorrupt` for a whole JSON line that is not a
        record this module writes (the journal edited by hand): it could be a spend."""
        contents = JournalContents(spends={}, accepted=set(), cut_short=[])
        with self.path.open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    # a fragment is never valid JSON: an object's text ends with its "}"
                    contents.cut_short.append(number)
                    continue
                problem = _record_problem(record)
                if problem is not None:
                    raise JournalCorrupt(self, number, problem)
                if "accepted" in record:
                    contents.accepted.add(record["accepted"])
                else:
                    contents.spends[record["release"]] = record
        return contents


@dataclass(frozen=True)
class JournalContents:
    """What :meth:`SpendJournal.read` found."""

    #: the spend records by release id
    spends: dict[str, dict[str, Any]]
    #: release ids whose loss an operator accepted (a dataset the database does not know)
    accepted: set[str]
    #: line numbers of lines cut short, skipped
    cut_short: list[int]


class JournalCorrupt(Exception):
    """A line of the journal is whole JSON but not a record the service writes."""

    def __init__(self, journal: SpendJournal, line: int, problem: str) -> None:
        self.line = line
        super().__init__(
            f"line {line} of {journal.path} is not a record the service writes ({problem}); "
            "the journal is never edited by hand: put the line back as it was written, or "
            "remove it if it records no spend (a spend removed from the journal is not "
            "protected against a restored database)"
        )


def _is_id(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _is_amount(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _record_problem(record: object) -> str | None:
    """Why ``record`` is not a line :func:`spend_record` or :func:`recharge` writes, or
    ``None`` (the problem names fields, never a value)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if "accepted" in record:
        return None if _is_id(record["accepted"]) else "'accepted' is not a release id"
    if "release" not in record:
        return "neither 'release' nor 'accepted'"
    for field in ("release", "dataset"):
        if not _is_id(record.get(field)):
            return f"'{field}' is not an id"
    if record.get("kind") not in SPEND_KINDS:
        return f"'kind' is not one of {', '.join(SPEND_KINDS)}"
    for field in ("epsilon", "delta"):
        if not _is_amount(record.get(field)):
            return f"'{field}' is not a whole number of ledger units"
    if not isinstance(record.get("mechanism", ""), str):
        return "'mechanism' is not a string"
    return None


def spend_record(entry: LedgerEntry, mechanism: str) -> dict[str, Any]:
    """The journal's line for a spend ``entry`` of a release of ``mechanism`` (ids,
    kind and amounts: no data value)."""
    return {
        "release": str(entry.release_id),
        "dataset": str(entry.dataset_id),
        "kind": entry.kind,
        "epsilon": entry.epsilon,
        "delta": entry.delta,
        "mechanism": mechanism,
        "at": utcnow().isoformat(),
    }


def journal_after_commit(session: Session, entry: LedgerEntry) -> None:
    """Append the spend ``entry`` to the session's journal once its transaction has
    committed (nothing when the session has no journal: a test's bare database)."""
    journal: SpendJournal | None = session.info.get(SESSION_KEY)
    if journal is None:
        return
    mechanism = session.scalar(select(Release.mechanism).where(Release.id == entry.release_id))
    on_commit(session, partial(_journal_spend, journal, spend_record(entry, mechanism or "")))


def _journal_spend(journal: SpendJournal, record: dict[str, Any]) -> None:
    try:
        journal.append(record)
    except OSError as exc:
        # the spend is in the ledger; only a later restore's loss of it goes unseen
        log.error(
            "release %s: its spend is committed but could not be written to %s (%s): a "
            "database restored from before it would not be refused for it",
            record["release"],
            journal.path,
            exc.strerror or type(exc).__name__,
        )


def _ledger_spends(session: Session) -> set[str]:
    return {
        str(release_id)
        for release_id in session.scalars(
            select(LedgerEntry.release_id).where(LedgerEntry.kind.in_(SPEND_KINDS))
        )
    }


def ensure_journal(session: Session, journal: SpendJournal) -> int:
    """Append to the journal the ledger's spends it lacks, and write it from the ledger
    if there is none (a deployment older than it, a new ``DATA_DIR``). A spend the ledger
    holds is committed, so its line is true whenever it is written: one missing (its
    process killed between the commit and the line, a commit whose outcome its worker
    never learnt, a line a full disk refused) is caught up here, at the next start,
    before a restore can lose the spend unseen. Returns how many spends it wrote."""
    existed = journal.path.exists()
    read = journal.read() if existed else None  # before the ledger
    journalled = set() if read is None else set(read.spends)
    if read is not None and read.cut_short:
        log.warning(
            "%s: line(s) %s cut short (a write a full disk or a kill interrupted), skipped; "
            "a spend of them that the ledger holds is appended again",
            journal.path,
            ", ".join(map(str, read.cut_short[:20])) + (", ..." * (len(read.cut_short) > 20)),
        )
    entries = session.execute(
        select(LedgerEntry, Release.mechanism)
        .join(Release, Release.id == LedgerEntry.release_id)
        .where(LedgerEntry.kind.in_(SPEND_KINDS))
        .order_by(LedgerEntry.id)
    ).all()
    records = [
        spend_record(entry, mechanism)
        for entry, mechanism in entries
        if str(entry.release_id) not in journalled
    ]
    try:
        journal.append(*records)
    except OSError as exc:
        # a full or read-only disk: the start goes on (as a spend does when its line
        # fails); the lines are appended at a later start
        log.error(
            "%d spend(s) of the ledger could not be written to %s (%s): a database restored "
            "from before them would not be refused for them",
            len(records),
            journal.path,
            exc.strerror or type(exc).__name__,
        )
        return 0
    if not existed:
        if not journal.path.exists():
            journal.path.touch(mode=0o660)
        if not records:  # a new deployment: nothing spent, nothing to warn of
            log.info("created the spend journal %s (README, Backups)", journal.path)
            return 0
        log.warning(
            "no spend journal in the data directory: wrote %s from the database's ledger "
            "(%d spends); it must never be restored from a backup nor removed (README, "
            "Backups)",
            journal.path,
            len(records),
        )
    elif records:
        log.warning(
            "%s lacked %d spend(s) that the ledger holds (a process stopped between a "
            "spend's commit and its line, or a line that could not be written): appended",
            journal.path,
            len(records),
        )
    return len(records)


@dataclass(frozen=True)
class LostSpend:
    """A spend the journal holds and the ledger does not."""

    release_id: str
    dataset_id: str
    kind: str
    epsilon: int
    delta: int
    mechanism: str
    #: whether the database knows the spend's dataset (a database older than the dataset's
    #: upload, or another deployment's database, does not)
    dataset_known: bool = True


def lost_spends(session: Session, journal: SpendJournal) -> list[LostSpend]:
    """The spends the journal holds that the ledger lost (a restored database), but for
    those whose loss an operator accepted."""
    read = journal.read()
    known = _ledger_spends(session)
    lost = {
        release_id: record
        for release_id, record in read.spends.items()
        if release_id not in known and release_id not in read.accepted
    }
    datasets = sorted({uuid.UUID(record["dataset"]) for record in lost.values()})
    known_datasets: set[str] = set()
    for chunk in in_chunks(datasets):
        known_datasets.update(
            str(d) for d in session.scalars(select(Dataset.id).where(Dataset.id.in_(chunk)))
        )
    return [
        LostSpend(
            release_id=release_id,
            dataset_id=record["dataset"],
            kind=record["kind"],
            epsilon=record["epsilon"],
            delta=record["delta"],
            mechanism=record.get("mechanism", ""),
            dataset_known=str(uuid.UUID(record["dataset"])) in known_datasets,
        )
        for release_id, record in lost.items()
    ]


class LostSpends(Exception):
    """The database lost spends the journal holds: the service must not start."""

    def __init__(self, journal: SpendJournal, lost: list[LostSpend]) -> None:
        self.lost = lost
        per_dataset: dict[str, list[float]] = {}
        for spend in lost:
            totals = per_dataset.setdefault(spend.dataset_id, [0.0, 0.0])
            totals[0] += epsilon_value(spend.epsilon)
            totals[1] += delta_value(spend.delta)
        datasets = "; ".join(
            f"dataset {dataset}: epsilon {eps:g}, delta {dlt:g}"
            for dataset, (eps, dlt) in sorted(per_dataset.items())
        )
        unknown = sorted({spend.dataset_id for spend in lost if not spend.dataset_known})
        cause = (
            "the database was restored from a backup older than releases already published, "
            "and their budget would be spent again"
        )
        if unknown:
            cause += (
                f"; {len(unknown)} of these dataset(s) are not in the database at all: it is "
                "older than their upload, or it is not the database this data directory was "
                "used with (a CURATOR_DATA_DIR reused with a new database: give each "
                "deployment its own)"
            )
        super().__init__(
            f"the database's ledger lacks {len(lost)} spend(s) that {journal.path} records "
            f"({datasets}): {cause}. Restore a newer backup, or run: curator "
            "reconcile-ledger --recharge (charges them to the ledger again and records it in "
            "the audit log; the loss of spends of datasets the database does not know is "
            "accepted, since no budget of its holds them)"
        )


def check(db: Database, journal: SpendJournal) -> None:
    """Write the journal if it is missing, then raise :class:`LostSpends` if the ledger
    lost spends it holds. Two transactions, the comparison's reading the journal before
    the ledger: on SQLite a read transaction's snapshot is taken at its first query, and
    one taken to write a missing journal, before a running process committed a spend and
    journalled it, then missed that spend in the ledger and refused the start for it."""
    with db.transaction(read_only=True) as session:
        ensure_journal(session, journal)
    with db.transaction(read_only=True) as session:
        lost = lost_spends(session, journal)  # the journal, then the ledger
    if lost:
        raise LostSpends(journal, lost)


@dataclass(frozen=True)
class Recharge:
    """What :func:`recharge` did, by release id."""

    #: releases the database still has (reserved, never settled): their spend committed
    settled: list[str]
    #: releases the database lost altogether: recorded again, ``failed``, with the spend
    recreated: list[str]
    #: releases of datasets the database does not know (uploaded after the backup): no
    #: budget to charge; their loss accepted in the journal
    unknown_dataset: list[str]


def recharge(session: Session, journal: SpendJournal, lost: list[LostSpend]) -> Recharge:
    """Charge each of the ``lost`` spends to the ledger again, in the caller's
    transaction: whatever budget is left (the outputs exist; a budget overspent by the
    restore shows as such, and takes no new release). A release the database still has
    (it was reserved or measuring when the backup was taken) gets its settlement and ends
    ``failed`` (never measured again: fresh noise on the same data would be a second
    spend); a lost release is recorded again as ``failed`` with its reservation and
    spend. Each is an audit event. Releases of datasets the database does not know are
    accepted in the journal once the transaction has committed."""
    from app.ledger.service import lock_dataset  # it imports this module

    done = Recharge(settled=[], recreated=[], unknown_dataset=[])
    accept: list[dict[str, Any]] = []
    for spend in lost:
        release_id = uuid.UUID(spend.release_id)
        dataset_id = uuid.UUID(spend.dataset_id)
        if session.get(Dataset, dataset_id) is None:  # dataset rows are never deleted
            accept.append({"accepted": spend.release_id, "at": utcnow().isoformat()})
            done.unknown_dataset.append(spend.release_id)
            continue
        # the project's lock order: the release's row, then its dataset's (a worker's
        # settle holds its release and then takes its dataset: the other order could
        # deadlock against it on PostgreSQL)
        stmt = select(Release).where(Release.id == release_id)
        release = session.scalars(
            stmt.with_for_update().execution_options(populate_existing=True)
        ).one_or_none()
        dataset = lock_dataset(session, dataset_id)
        kinds = set(
            session.scalars(select(LedgerEntry.kind).where(LedgerEntry.release_id == release_id))
        )
        if kinds & set(SPEND_KINDS):
            continue  # spent since the list was read (a worker still running): not lost
        if release is None:
            release = Release(
                id=release_id,
                dataset_id=dataset.id,
                mechanism=spend.mechanism or "unknown",
                status="failed",
                epsilon=spend.epsilon,
                delta=spend.delta,
                params={},
                created_by=dataset.owner_id,
                message=RECHARGED_MESSAGE,
                finished_at=utcnow(),
            )
            session.add(release)
            session.flush()
            done.recreated.append(spend.release_id)
        else:
            if "refund" in kinds:
                raise ValueError(
                    f"release {spend.release_id} is refunded in this database and spent in "
                    "the journal: this database is not an earlier state of the journal's"
                )
            if release.status in ("queued", "measuring", "synthesizing"):
                release.status = "failed"
                release.message = RECHARGED_MESSAGE
                release.finished_at = utcnow()
            release.lease_owner = None
            release.lease_expires_at = None
            done.settled.append(spend.release_id)
        entries = []
        if spend.kind == "commit" and "reserve" not in kinds:
            entries.append("reserve")
        entries.append(spend.kind)
        for kind in entries:
            entry = LedgerEntry(
                dataset_id=dataset.id,
                release_id=release_id,
                kind=kind,
                epsilon=spend.epsilon if kind != "non_dp" else 0,
                delta=spend.delta if kind != "non_dp" else 0,
                actor_id=None,
                actor="operator:reconcile-ledger",
            )
            session.add(entry)
        audit.record(
            session,
            None,
            "ledger.recharge_lost_spend",
            "release",
            release_id,
            dataset_id=spend.dataset_id,
            kind=spend.kind,
            epsilon=epsilon_value(spend.epsilon),
            delta=delta_value(spend.delta),
        )
    session.flush()
    if accept:
        on_commit(session, partial(journal.append, *accept))
    return done
