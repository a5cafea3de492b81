"""Dataset use cases: upload, visibility, budget, grants.

Visibility: a dataset is visible to its curator and to analysts it is granted to; to
anyone else it does not exist (404, never 403). A granted analyst who attempts a
curator's action gets 403 (they already know it exists).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
from pydantic import ValidationError
from sqlalchemy import ColumnElement, exists, false, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.config import KEY_FILE_NAME
from app.core import pagination
from app.core.audit import record
from app.core.db import in_chunks, on_commit
from app.core.errors import (
    Conflict,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    NotFound,
    describe_errors,
)
from app.core.pagination import DEFAULT_LIMIT, Page
from app.core.security import ensure_key_active
from app.core.services import Services
from app.datasets.graphs import validate_graph_and_store
from app.datasets.schemas import (
    BudgetOut,
    BudgetSummary,
    DatasetDeclaration,
    DatasetOut,
    GraphDeclaration,
    LedgerEntryOut,
    ValidationReport,
)
from app.datasets.upload import ReceivedUpload
from app.datasets.validation import max_cells, validate_and_store
from app.ledger import service as ledger
from app.ledger.units import delta_units, delta_value, epsilon_units, epsilon_value
from app.models import Dataset, Grant, Release, Role, User
from app.models.base import utcnow
from app.storage import tables
from app.storage.held import create_held, unheld

log = logging.getLogger("curator.datasets")

Declaration = DatasetDeclaration | GraphDeclaration


#: Earlier datasets of the same file named in a new dataset's warnings, at most.
MAX_SAME_FILE_WARNINGS = 5


def parse_declaration(raw: str | None) -> Declaration:
    """Parse the ``schema`` form field (a table by default, ``"kind": "graph"`` for an
    edge list); 422 with every problem named."""
    if raw is None:
        raise InvalidRequest("the 'schema' form field is missing")
    try:
        kind = json.loads(raw).get("kind", "table") if raw.lstrip().startswith("{") else "table"
    except RecursionError:  # nesting deeper than the parser's stack: no schema is like that
        raise InvalidRequest("invalid schema: JSON nested too deeply") from None
    except ValueError:
        kind = "table"
    model: type[Declaration] = GraphDeclaration if kind == "graph" else DatasetDeclaration
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        problems = describe_errors(exc.errors(include_input=False), "schema")
        raise InvalidRequest(f"invalid schema: {problems}") from None


@dataclass
class StoredDataset:
    """An upload validated and stored encrypted, not yet recorded (:func:`record_dataset`)."""

    dataset: Dataset  # transient: added to a session by record_dataset
    report: ValidationReport
    path: Path
    declaration: Declaration
    #: the file's fingerprints (:attr:`ReceivedUpload.fingerprints`), the current key's first
    fingerprints: list[str] = field(default_factory=list)
    recorded: bool = False  # set once the transaction that recorded it has committed
    #: holds the file (:mod:`app.storage.held`) until it is recorded or removed: the
    #: sweeper does not take it for a leftover, whatever its age
    held: BinaryIO | None = None

    def discard(self) -> None:
        """Remove the stored file of an upload whose dataset was not recorded; a no-op once
        it was (an error or a cancellation that reaches the caller after the commit must
        not leave a recorded dataset without its file)."""
        if not self.recorded:
            self.path.unlink(missing_ok=True)
        self._release()

    def _mark_recorded(self) -> None:
        self.recorded = True
        self._release()  # its dataset's row, committed, keeps it from the sweeper now

    def _release(self) -> None:
        if self.held is not None:
            self.held.close()


def store_dataset(
    services: Services, curator: User, declaration: Declaration, upload: ReceivedUpload
) -> StoredDataset:
    """Validate the uploaded file against the declaration and store it encrypted, without
    a transaction: this takes minutes for a large file. Nothing is left behind if it fails.

    Until :func:`record_dataset` has committed, the stored file is the caller's: it must
    :meth:`~StoredDataset.discard` it if the dataset is not recorded. Until then it is
    held (:mod:`app.storage.held`) from its creation, before a byte is validated, so that
    :func:`remove_stray_files` leaves it alone however long this takes and whatever the
    clocks say.
    """
    if upload.file is None:
        raise InvalidRequest("the 'file' part is missing")
    dataset_id = uuid.uuid4()
    storage_name = f"{dataset_id}.parquet"
    destination = services.settings.datasets_dir / storage_name
    file_key = tables.new_file_key()  # the file's own: forgotten when its data are deleted
    common = {
        "id": dataset_id,
        "owner_id": curator.id,
        "name": declaration.name,
        "epsilon_total": epsilon_units(declaration.budget.epsilon, charge=False),
        "delta_total": delta_units(declaration.budget.delta, charge=False),
        "storage_name": storage_name,
        "file_keys": tables.seal_file_keys(services.data_key, [file_key]),
        "fingerprint": upload.fingerprints[0] if upload.fingerprints else None,
    }
    destination.parent.mkdir(parents=True, exist_ok=True)
    held = create_held(destination)
    try:
        with upload.file.open() as reader:
            if isinstance(declaration, GraphDeclaration):
                graph = validate_graph_and_store(
                    reader, upload.file.size, declaration.vertices, destination, file_key
                )
                report = ValidationReport(format="edge_list", n_rows=None)
                dataset = Dataset(
                    **common,
                    kind="graph",
                    columns=[],
                    n_rows=graph.n_edges,  # private under edge-level DP: never returned
                    n_vertices=declaration.vertices,
                    out_of_bounds="reject",
                    allow_non_dp_releases=False,
                    validation=report.model_dump(),
                )
            else:
                stored = validate_and_store(
                    reader,
                    upload.file.size,
                    declaration.columns,
                    declaration.out_of_bounds,
                    destination,
                    file_key,
                    filename=upload.filename,
                    max_cells=max_cells(services.settings.max_upload_bytes),
                )
                report = ValidationReport(
                    format=stored.format, n_rows=stored.n_rows, clipped=stored.clipped
                )
                dataset = Dataset(
                    **common,
                    kind="table",
                    columns=[c.model_dump() for c in declaration.columns],
                    n_rows=stored.n_rows,
                    out_of_bounds=declaration.out_of_bounds,
                    allow_non_dp_releases=declaration.allow_non_dp_releases,
                    validation=report.model_copy(update={"clipped": None}).model_dump(),
                )
    except BaseException:
        destination.unlink(missing_ok=True)
        held.close()
        raise
    return StoredDataset(
        dataset, report, destination, declaration, list(upload.fingerprints), held=held
    )


def declaration_hash(declaration: Declaration) -> str:
    """SHA-256 of the declaration's canonical JSON (public parameters only): the fields
    the upload set, as read, so that a field added since with its default (a release's
    hash covered its defaults, and a retry after such an upgrade got 409) leaves the hash
    of the very same upload as it was."""
    fields = declaration.model_dump(mode="json", exclude_unset=True)
    canonical = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _existing(
    session: Session,
    curator: User,
    key: str,
    declaration: Declaration,
    fingerprints: list[str],
) -> Dataset | None:
    """The curator's dataset uploaded with ``key``, if any; 409 if it was uploaded with
    another declaration or another file (its fingerprint, under the current data key or a
    previous one of the ring, is none of ``fingerprints``)."""
    dataset = session.scalars(
        select(Dataset).where(Dataset.owner_id == curator.id, Dataset.idempotency_key == key)
    ).one_or_none()
    if dataset is not None and (
        dataset.request_hash != declaration_hash(declaration)
        # once its data are deleted, the fingerprint is forgotten with them: the key and
        # the declaration identify the upload
        or (dataset.data_deleted_at is None and dataset.fingerprint not in fingerprints)
    ):
        raise IdempotencyConflict(
            "this Idempotency-Key was used for a different upload (another declaration or "
            "another file); use a new key"
        )
    return dataset


def replayed_upload(
    services: Services,
    curator: User,
    key: str | None,
    declaration: Declaration,
    fingerprints: list[str],
    key_id: uuid.UUID | None = None,
) -> DatasetOut | None:
    """The dataset an earlier upload with this ``Idempotency-Key``, declaration and file
    created (read in a short read-only transaction), before this one is validated and
    stored: a retry then costs its transfer only. None without a key or such a dataset;
    409 if the key was used for another upload. :func:`record_dataset` looks again, for a
    copy that was still running then. With ``key_id`` (the request's API key), the key is
    checked again first, as :func:`record_dataset` does: the file streamed for minutes, and
    a key revoked meanwhile must get neither the dataset nor a 409 (401)."""
    if key is None or not fingerprints:  # no file part: store_dataset says so (422)
        return None
    with services.db.transaction(
        read_only=True, lock_timeout=services.settings.lock_timeout
    ) as session:
        if key_id is not None:
            ensure_key_active(session, key_id)
        existing = _existing(session, curator, key, declaration, fingerprints)
        return None if existing is None else to_out(session, existing, curator)


def _same_file_warnings(session: Session, curator: User, stored: StoredDataset) -> list[str]:
    """Warnings naming the curator's earlier datasets of the very same file (their data
    kept): each has a budget of its own. Advice only: such an upload is not refused."""
    if not stored.fingerprints:
        return []
    earlier = session.scalars(
        select(Dataset)
        .where(
            Dataset.owner_id == curator.id,
            Dataset.fingerprint.in_(stored.fingerprints),
            Dataset.data_deleted_at.is_(None),
            Dataset.id != stored.dataset.id,
        )
        .order_by(Dataset.created_at, Dataset.id)
        .limit(MAX_SAME_FILE_WARNINGS)
    )
    return [
        f"this file is the very file of your dataset {other.id}: the two datasets have "
        "separate budgets, so releases of both can spend the same individuals' privacy "
        "twice over; to retry an upload, send an Idempotency-Key"
        for other in earlier
    ]


def record_dataset(
    session: Session,
    curator: User,
    stored: StoredDataset,
    key_id: uuid.UUID | None = None,
    idempotency_key: str | None = None,
) -> tuple[DatasetOut, bool]:
    """Record a stored upload: the dataset row and its audit event. Returns
    (dataset, created).

    With ``key_id`` (the request's API key), the key is checked again first: an upload
    streams and validates for minutes, and a key revoked meanwhile must not create a
    dataset. With an ``idempotency_key`` that an earlier upload of the same declaration
    and file used, nothing is recorded and that dataset is returned (not created); the
    same key with another upload is a 409 (:class:`IdempotencyConflict`). Two copies
    racing insert one row (the unique index on the curator and key): the other returns
    it. Leaves the stored file to the caller if it raises, the transaction rolls back, or
    the dataset was not created (:func:`store_dataset`).
    """
    if key_id is not None:
        ensure_key_active(session, key_id)
    dataset = stored.dataset
    if idempotency_key is not None:
        existing = _existing(
            session, curator, idempotency_key, stored.declaration, stored.fingerprints
        )
        if existing is not None:
            return to_out(session, existing, curator), False
        dataset.idempotency_key = idempotency_key
        dataset.request_hash = declaration_hash(stored.declaration)
    try:
        with session.begin_nested():
            session.add(dataset)
            session.flush()
    except IntegrityError:
        # a concurrent copy with the same key won the race (PostgreSQL: this insert waited
        # for its commit)
        if idempotency_key is None:
            raise
        existing = _existing(
            session, curator, idempotency_key, stored.declaration, stored.fingerprints
        )
        if existing is None:
            raise
        return to_out(session, existing, curator), False
    on_commit(session, stored._mark_recorded)
    record(
        session,
        curator.id,
        "dataset.create",
        "dataset",
        dataset.id,
        kind=dataset.kind,
        n_columns=len(dataset.columns),
        format=stored.report.format,
        epsilon_total=stored.declaration.budget.epsilon,
        delta_total=stored.declaration.budget.delta,
    )
    out = to_out(session, dataset, curator)
    if dataset.kind == "table":  # the clip counts go back with this response only
        out = out.model_copy(update={"validation": stored.report})
    same_file = _same_file_warnings(session, curator, stored)
    if same_file:  # with this response only
        out = out.model_copy(update={"warnings": [*out.warnings, *same_file]})
    return out, True


def update_dataset(
    session: Session, user: User, dataset_id: uuid.UUID, allow_non_dp_releases: bool
) -> DatasetOut:
    """The curator's opt-in (or opt-out) for releases that are not differentially private."""
    dataset = owned_dataset(session, user, dataset_id)
    if dataset.kind != "table" and allow_non_dp_releases:
        raise InvalidRequest("non-DP releases exist for tables only")
    dataset.allow_non_dp_releases = allow_non_dp_releases
    session.flush()
    record(
        session,
        user.id,
        "dataset.update",
        "dataset",
        dataset.id,
        allow_non_dp_releases=allow_non_dp_releases,
    )
    return to_out(session, dataset, user)


def visible_to(user: User) -> ColumnElement[bool]:
    """The SQL condition on :class:`Dataset` that ``user`` may see it: its curator, or an
    analyst it is granted to."""
    if user.role == Role.curator:
        return Dataset.owner_id == user.id
    if user.role == Role.analyst:
        return exists().where(Grant.dataset_id == Dataset.id, Grant.user_id == user.id)
    return false()


def visible_dataset(session: Session, user: User, dataset_id: uuid.UUID) -> Dataset:
    """The dataset, if ``user`` may see it; else 404, the very answer for an id that does
    not exist. One statement either way (the visibility is part of the lookup), so that the
    response time does not tell a hidden dataset from a missing one."""
    dataset = session.scalars(
        select(Dataset).where(Dataset.id == dataset_id, visible_to(user))
    ).one_or_none()
    if dataset is None:
        raise NotFound("dataset not found")
    return dataset


def owned_dataset(session: Session, user: User, dataset_id: uuid.UUID) -> Dataset:
    """The dataset, if ``user`` is its curator (404 if invisible, 403 if only granted)."""
    dataset = visible_dataset(session, user, dataset_id)
    if dataset.owner_id != user.id:
        raise Forbidden("only the dataset's curator may do this")
    return dataset


def budget_summary(balance: ledger.Balance) -> BudgetSummary:
    return BudgetSummary(
        epsilon_total=epsilon_value(balance.epsilon_total),
        delta_total=delta_value(balance.delta_total),
        epsilon_spent=epsilon_value(balance.epsilon_spent),
        delta_spent=delta_value(balance.delta_spent),
        epsilon_reserved=epsilon_value(balance.epsilon_reserved),
        delta_reserved=delta_value(balance.delta_reserved),
        epsilon_remaining=epsilon_value(balance.epsilon_remaining),
        delta_remaining=delta_value(balance.delta_remaining),
    )


def delta_warnings(delta: float, dataset: Dataset, what: str) -> list[str]:
    """A warning when ``delta >= 1 / n``: an (epsilon, delta)-DP mechanism may then publish
    whole rows, each with probability delta, so about ``n delta >= 1`` of them ("values of
    delta on the order of 1/n are very dangerous", Dwork and Roth 2014, section 2.3).
    A table's ``n`` is public (its row count), so the warning reveals nothing; a graph's
    stored count is its number of edges, private under edge-level DP, so a graph gets no
    warning. Advice only: a curator may have reasons, and the request is not refused."""
    n_rows = dataset.n_rows if dataset.kind == "table" else None
    if not n_rows or delta * n_rows < 1.0:
        return []
    return [
        f"{what} ({delta:g}) is not below 1/n = {1.0 / n_rows:.3g} (n = {n_rows} rows): an "
        "(epsilon, delta)-DP release may then publish whole rows, each with probability "
        "delta; keep delta well below 1/n (1e-9, say)"
    ]


def to_out(
    session: Session, dataset: Dataset, viewer: User, balance: ledger.Balance | None = None
) -> DatasetOut:
    """The dataset as ``viewer`` sees it; ``balance``: its ledger's, if already read."""
    is_owner = dataset.owner_id == viewer.id
    if balance is None:
        balance = ledger.balance(session, dataset)
    data: dict[str, Any] = {
        "id": dataset.id,
        "name": dataset.name,
        "kind": dataset.kind,
        "owner_id": dataset.owner_id,
        "columns": dataset.columns,
        "n_rows": dataset.n_rows if dataset.kind == "table" else None,
        "n_vertices": dataset.n_vertices,
        "out_of_bounds": dataset.out_of_bounds,
        "allow_non_dp_releases": dataset.allow_non_dp_releases,
        "budget": budget_summary(balance),
        "created_at": dataset.created_at,
        "data_deleted_at": dataset.data_deleted_at,
        # stored without clip counts (migration 0005 removed the ones stored before)
        "validation": dataset.validation if is_owner and dataset.kind == "table" else None,
        "warnings": delta_warnings(
            delta_value(balance.delta_total), dataset, "the budget's delta total"
        ),
    }
    return DatasetOut.model_validate(data)


def list_datasets(
    session: Session, user: User, limit: int, after_id: uuid.UUID | None
) -> Page[DatasetOut]:
    """A page of the datasets ``user`` may see (a curator's own, an analyst's granted;
    none for an admin), oldest first; ``after_id`` must be one of them."""
    stmt = select(Dataset).where(visible_to(user))
    page: Page[Dataset] = pagination.by_time(
        session,
        stmt,
        Dataset.created_at,
        Dataset.id,
        limit,
        after_id,
        lambda d: d.id,
        weigh=lambda d: pagination.json_size(d.columns),
    )
    balances = ledger.balances(session, page.items)  # one query for the page
    return page.map(lambda d: to_out(session, d, user, balances[d.id]))


def get_dataset(session: Session, user: User, dataset_id: uuid.UUID) -> DatasetOut:
    return to_out(session, visible_dataset(session, user, dataset_id), user)


def get_budget(
    session: Session,
    user: User,
    dataset_id: uuid.UUID,
    limit: int = DEFAULT_LIMIT,
    after_id: int | None = None,
) -> tuple[BudgetOut, Page[LedgerEntryOut]]:
    """The budget: totals over *every* ledger entry, and one page of the entries (oldest
    first, past ``after_id``). Returns the body (its ``entries`` are the page) and the
    page, whose cursor the route announces."""
    dataset = visible_dataset(session, user, dataset_id)
    summary = budget_summary(ledger.balance(session, dataset))
    page = ledger.entries(session, dataset.id, limit, after_id).map(
        lambda e: LedgerEntryOut(
            id=e.id,
            kind=e.kind,
            release_id=e.release_id,
            epsilon=epsilon_value(e.epsilon),
            delta=delta_value(e.delta),
            actor=e.actor,
            created_at=e.created_at,
        )
    )
    return BudgetOut(**summary.model_dump(), entries=page.items), page


def update_budget(
    session: Session,
    user: User,
    dataset_id: uuid.UUID,
    epsilon: float | None,
    delta: float | None,
) -> tuple[BudgetOut, Page[LedgerEntryOut]]:
    owned_dataset(session, user, dataset_id)
    ledger.set_totals(
        session,
        dataset_id,
        epsilon_units(epsilon, charge=False) if epsilon is not None else None,
        delta_units(delta, charge=False) if delta is not None else None,
    )
    record(
        session,
        user.id,
        "dataset.budget_update",
        "dataset",
        dataset_id,
        epsilon_total=epsilon,
        delta_total=delta,
    )
    return get_budget(session, user, dataset_id)


def list_grants(
    session: Session, user: User, dataset_id: uuid.UUID, limit: int, after_id: uuid.UUID | None
) -> Page[Grant]:
    """A page of the dataset's grants (its curator only), oldest first; a grant is named
    by its analyst's id, so ``after_id`` is the ``user_id`` of the previous page's last
    grant (a grant revoked since is no longer in the list: 422, list again)."""
    owned_dataset(session, user, dataset_id)
    return pagination.by_time(
        session,
        select(Grant).where(Grant.dataset_id == dataset_id),
        Grant.created_at,
        Grant.user_id,
        limit,
        after_id,
        lambda g: g.user_id,
    )


def grant(
    session: Session, user: User, dataset_id: uuid.UUID, analyst_id: uuid.UUID
) -> tuple[Grant, bool]:
    """Grant an analyst read access; returns the grant and whether it is new.

    Grant changes on one dataset are serialised by the dataset's lock (the ledger's, taken
    first in the same order), so two concurrent grants of one analyst give one 201 and one
    200, and of two concurrent revokes one succeeds and one finds nothing (404)."""
    owned_dataset(session, user, dataset_id)
    ledger.lock_dataset(session, dataset_id)
    analyst = session.get(User, analyst_id)
    if analyst is None or analyst.role != Role.analyst:
        # one answer for both: a curator learns neither that an id is a user's nor its role
        raise InvalidRequest(f"no analyst has the id {analyst_id}; grants go to analysts only")
    existing = session.get(Grant, (dataset_id, analyst_id))
    if existing is not None:
        return existing, False
    new = Grant(dataset_id=dataset_id, user_id=analyst_id, granted_by=user.id)
    session.add(new)
    session.flush()
    record(session, user.id, "grant.create", "dataset", dataset_id, user_id=str(analyst_id))
    return new, True


def revoke_grant(
    session: Session, user: User, dataset_id: uuid.UUID, analyst_id: uuid.UUID
) -> None:
    owned_dataset(session, user, dataset_id)
    ledger.lock_dataset(session, dataset_id)  # serialised as in grant()
    existing = session.get(Grant, (dataset_id, analyst_id))
    if existing is None:
        raise NotFound("grant not found")
    session.delete(existing)
    session.flush()
    record(session, user.id, "grant.delete", "dataset", dataset_id, user_id=str(analyst_id))


def delete_data(
    session: Session, services: Services, user: User, dataset_id: uuid.UUID
) -> DatasetOut:
    """Delete the dataset's stored rows: forget the key of its encrypted file (its
    ``file_keys``, in this transaction), so that no copy of the file, nor its blocks left
    on the disk, can be opened again, then remove the file. Keep its declaration, its
    append-only ledger, its releases and their measurements, which are post-processing
    of the rows and need them no more (downloads, answers and re-synthesis go on). The
    dataset then takes no new release (:func:`app.releases.service.create_release`).

    Refused (409) while a release is still to read the rows (queued or measuring: cancel
    it or wait for it), under the dataset lock that a release request takes too, so no
    request can slip in between. The file is removed once the transaction commits; if
    the process dies first, the sweeper removes it (:func:`remove_stray_files`). Asking
    again is answered as the first time, with nothing new recorded. (A file stored before
    datasets had keys of their own opens with the service key: removing it is all there
    is; ``curator rotate-data-key`` gives such files keys of their own.)"""
    owned_dataset(session, user, dataset_id)
    dataset = ledger.lock_dataset(session, dataset_id)
    if dataset.data_deleted_at is None:
        pending = list(
            session.scalars(
                select(Release.id)
                .where(
                    Release.dataset_id == dataset.id,
                    Release.status.in_(("queued", "measuring")),
                )
                .order_by(Release.created_at)
            )
        )
        if pending:
            listed = ", ".join(str(p) for p in pending[:5]) + (", ..." if len(pending) > 5 else "")
            raise Conflict(
                f"{len(pending)} release(s) of this dataset have yet to read its data "
                f"({listed}): cancel them (DELETE /v1/releases/{{id}}) or wait until they "
                "are measured"
            )
        dataset.data_deleted_at = utcnow()
        dataset.file_keys = None  # no copy of the file, or block of it, opens again
        # the file's keyed fingerprint would still confirm a guessed file to whoever holds
        # the database and the data key: forgotten with the file
        dataset.fingerprint = None
        session.flush()
        record(session, user.id, "dataset.delete_data", "dataset", dataset.id)
        path = services.settings.datasets_dir / dataset.storage_name
        on_commit(session, lambda: path.unlink(missing_ok=True))
        # the sealed keys this overwrote stay in SQLite's write-ahead log until a
        # checkpoint copies it over them, and in PostgreSQL's pages (the row's old version
        # and the fingerprint's index entry) until a VACUUM prunes them; one is run now, in
        # the background (it may wait for readers of the log)
        on_commit(session, services.db.request_checkpoint)
    return to_out(session, dataset, user)


#: How old an unrecorded dataset file or an upload spool must be before
#: :func:`remove_stray_files` takes it for a leftover. A live upload holds its files
#: (:mod:`app.storage.held`), which are never removed, whatever their age; this age guards
#: them where the filesystem does not honour that lock (a network filesystem).
STRAY_FILE_AGE = timedelta(hours=24)


def remove_stray_files(session: Session, services: Services, now: datetime | None = None) -> int:
    """Remove what a killed process left of its uploads: stored dataset files that no
    dataset row names, upload spools (encrypted with a key that died with the process) and
    the files of a killed key rotation (:func:`app.storage.tables.rotate`) and the
    temporary copy of a generated data key (:meth:`app.config.Settings.prepare`), each once older
    than :data:`STRAY_FILE_AGE` by its modification time and held by no process
    (:mod:`app.storage.held`). A failing upload
    cleans up after itself (:func:`store_dataset`, the endpoint); this catches the uploads
    that could not. A live upload holds its spool and its stored file until its dataset's
    row is committed (or the file removed), so neither goes, however old its modification
    time looks (a clock stepped forward by days, a validation longer than a day). A stored
    file is found not held before the dataset rows are read: a file recorded before then is
    among the rows read, even on SQLite, whose transaction reads the database as it was at
    its first read; so this must be the transaction's first read. Each file is removed
    while this holds it. The files of datasets whose data were deleted
    (:func:`delete_data`) go at once. Returns how many files were removed.

    Its cost follows the files that exist, not the datasets ever recorded: the rows read
    are those the listed files name (by primary key: a dataset's file is
    ``<dataset id>.parquet``, :func:`store_dataset`; an old file not found so is looked up
    by its name too before it is removed), where every dataset's storage name was read,
    and every deleted dataset's file looked for on disk, at each pass. Each stored file
    older than :data:`STRAY_FILE_AGE` is opened and its lock tried, at each pass: 10^4 such
    files take 0.30 s a pass on SQLite, 0.17 s without the lock
    (``bench/results/sweeper_history_held_*sqlite.md``)."""
    cutoff = (now or utcnow()).timestamp() - STRAY_FILE_AGE.total_seconds()

    def aged(path: Path) -> bool:
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            return path.stat().st_mtime < cutoff
        return False

    def old(directory: Path, pattern: str) -> list[Path]:
        return [p for p in directory.glob(pattern) if p.is_file() and aged(p)]

    spools = old(services.settings.tmp_dir, "upload-*.spool")
    # a key rotation killed before its rename (tables.rotate)
    spools += old(services.settings.datasets_dir, "*" + tables.ROTATING_SUFFIX)
    # every stored file, whatever its age: a deleted dataset's goes at once
    files = [p for p in services.settings.datasets_dir.glob("*.parquet") if p.is_file()]
    # before the first read of a row: an upload releases its file once its row is committed
    unheld_old = [path for path in files if aged(path) and not _held(path)]
    # the temporary copy of a generated data key, left by a process killed while it
    # published it (Settings.load_key): a key never used, or a second name of data.key
    keys = old(services.settings.data_dir, f".{KEY_FILE_NAME}.*")
    recorded = _recorded_files(session, [p.name for p in files], Dataset.id)
    unmatched = [path for path in unheld_old if path.name not in recorded]
    # a candidate is looked up by its name too before it goes: no row's file is ever
    # removed, even one named otherwise than by its id (none is)
    recorded |= _recorded_files(session, [p.name for p in unmatched], Dataset.storage_name)
    stored = [path for path in unmatched if path.name not in recorded]
    # the files of datasets whose data were deleted, whatever their age: a process that
    # died between the deletion's commit and the file's removal left them
    deleted = [path for path in files if recorded.get(path.name)]
    removed = 0
    for path in spools + stored:
        with unheld(path) as free:
            if free:
                path.unlink(missing_ok=True)
                log.warning("removed a stray upload file %s (no dataset records it)", path.name)
                removed += 1
    for path in deleted:
        path.unlink(missing_ok=True)
        log.warning("removed the file %s of a dataset whose data were deleted", path.name)
    for path in keys:
        path.unlink(missing_ok=True)
        log.warning("removed %s, a copy of a generated data key left by a killed start", path.name)
    return removed + len(deleted) + len(keys)


def _held(path: Path) -> bool:
    """Whether a live upload holds ``path`` (:mod:`app.storage.held`)."""
    with unheld(path) as free:
        return not free


#: Names looked up per statement by :func:`_recorded_files` (below every backend's limit
#: of bound parameters).
RECORDED_CHUNK = 1000


def _recorded_files(session: Session, names: list[str], key: Any) -> dict[str, bool]:
    """Which of the stored files ``names`` a dataset row records, each with whether that
    dataset's data were deleted, looked up by ``key``: ``Dataset.id`` (every row's
    storage name is ``<dataset id>.parquet``; a name that is not is not looked up) or
    ``Dataset.storage_name`` (for the few files not found so: strays). The rows read are
    at most the files named."""
    if key is Dataset.id:
        wanted: list[Any] = []
        for name in names:
            with contextlib.suppress(ValueError):
                if name.endswith(".parquet"):
                    wanted.append(uuid.UUID(name.removesuffix(".parquet")))
    else:
        wanted = list(names)
    found: dict[str, bool] = {}
    for start in range(0, len(wanted), RECORDED_CHUNK):
        rows = session.execute(
            select(Dataset.storage_name, Dataset.data_deleted_at).where(
                key.in_(wanted[start : start + RECORDED_CHUNK])
            )
        )
        for storage_name, deleted_at in rows:
            found[storage_name] = deleted_at is not None
    return found


def sealed_with_another_key(session: Session, ring: bytes) -> int:
    """How many datasets with stored data hold file keys that no key of ``ring`` (the
    service's data key and its previous keys) opens: their files cannot be read, and
    every release of them fails. The usual cause: a data directory restored, or the
    service started, without its data key, which then generated a new one."""
    sealed = session.scalars(
        select(Dataset.file_keys).where(
            Dataset.data_deleted_at.is_(None), Dataset.file_keys.is_not(None)
        )
    )
    unopened = 0
    for file_keys in sealed:
        if file_keys is None:  # pragma: no cover - excluded by the query
            continue
        try:
            tables.unseal_file_keys(ring, file_keys)
        except PermissionError:
            unopened += 1
    return unopened


@dataclass(frozen=True)
class KeyRotation:
    """What :func:`rotate_data_key` did, by storage file name (never a dataset's content)."""

    rotated: list[str]
    current: list[str]
    missing: list[str]
    unreadable: list[str]
    #: files that could not be re-encrypted for another reason (a corrupt file, a copy
    #: that came out short): left as they were
    failed: list[str]
    #: datasets changed while the run went: re-encrypted by another run, or their data
    #: deleted (nothing left to re-encrypt); left to that change
    superseded: list[str] = field(default_factory=list)


def rotate_data_key(services: Services) -> KeyRotation:
    """Give every stored dataset a fresh file key sealed with the current data key
    (``CURATOR_DATA_KEY``): its file is re-encrypted under the new file key, opened with
    its old one, itself unsealed with any key of the ring (:func:`app.storage.tables.rotate`).
    A file stored before datasets had keys of their own (opened with the service key)
    gets one the same way. A dataset whose file key is sealed with the current key alone
    and opens its file is left as it is, so a run that stopped half-way can be run again.

    A reader must open the file whichever of the two it finds, so the new key is
    recorded before the rename, beside the old one, and the old one is dropped in the
    transaction that holds the dataset's row lock over the rename (:func:`_record_keys`);
    a reader that read the key before the first record and opens the file after the
    rename reads the key again (:class:`app.storage.source.EncryptedTableSource`). Each
    record, and the rename, is conditional on the dataset's keys being as this run read
    (or recorded) them and its data not deleted, so two runs at once re-encrypt a file
    once, and a deletion that commits meanwhile keeps its keys forgotten (the new file is
    removed at the end).

    The dataset rows are read in one short transaction and the files re-encrypted after
    it (minutes for large tables; no session held). A dataset whose file key no key of
    the ring opens, or whose file it does not open, is reported as ``unreadable`` and
    left untouched; one whose file is not on disk, as ``missing``; one that fails
    otherwise (corrupt), as ``failed``, and the run goes on with the others. Uploads
    recorded after the list was read are not visited: run it once the API and the
    workers use the new key (README, "Rotating the data key"). The run is recorded in
    the audit log (counts and file names, no key)."""
    with services.db.transaction(read_only=True) as session:
        rows = list(
            session.execute(
                select(Dataset.id, Dataset.storage_name, Dataset.file_keys)
                .where(Dataset.data_deleted_at.is_(None))  # nothing left to re-encrypt
                .order_by(Dataset.created_at)
            )
        )
    ring = services.data_key
    rotated: list[str] = []
    current: list[str] = []
    missing: list[str] = []
    unreadable: list[str] = []
    failed: list[str] = []
    superseded: list[str] = []
    for dataset_id, name, sealed in rows:
        path = services.settings.datasets_dir / name
        try:
            if _keyed_under_current(ring, path, sealed):
                current.append(name)
                log.info("data key rotation: %s current", name)
                continue
            old = [] if sealed is None else tables.unseal_file_keys(ring, sealed)
            fresh = tables.new_file_key()
            during = tables.seal_file_keys(ring, [fresh, *old])
            # once the file is renamed the old key opens nothing: forgotten
            after = tables.seal_file_keys(ring, [fresh])
            tables.rotate(
                path,
                tables.file_ring(ring, sealed),
                fresh,
                before_replace=partial(_record_keys, services, dataset_id, sealed, during),
                replace=partial(_record_keys, services, dataset_id, during, after),
            )
        except _Superseded:
            superseded.append(name)
            log.info("data key rotation: %s changed meanwhile; left to that change", name)
        except FileNotFoundError:
            # a deletion after the list was read removed it: not missing
            (superseded if _data_deleted(services, dataset_id) else missing).append(name)
        except PermissionError:
            unreadable.append(name)
        except (OSError, pa.ArrowException) as exc:  # type only: no message in the log
            failed.append(name)
            log.warning("data key rotation: %s failed (%s)", name, type(exc).__name__)
        else:
            rotated.append(name)
            log.info("data key rotation: %s re-encrypted", name)
    with services.db.transaction() as session:
        deleted = {
            name
            for chunk in in_chunks(rotated + superseded)
            for name in session.scalars(
                select(Dataset.storage_name).where(
                    Dataset.storage_name.in_(chunk), Dataset.data_deleted_at.is_not(None)
                )
            )
        }
        for name in deleted:  # deleted while re-encrypted: the rename put a file back
            (services.settings.datasets_dir / name).unlink(missing_ok=True)
        record(
            session,
            None,
            "data_key.rotate",
            "data_key",
            "datasets",
            rotated=len(rotated),
            current=len(current),
            missing=missing,
            unreadable=unreadable,
            failed=failed,
            superseded=len(superseded),
        )
    return KeyRotation(
        rotated=rotated,
        current=current,
        missing=missing,
        unreadable=unreadable,
        failed=failed,
        superseded=superseded,
    )


def _data_deleted(services: Services, dataset_id: uuid.UUID) -> bool:
    """Whether the dataset's data have been deleted (read now, in a transaction of its
    own)."""
    with services.db.transaction(read_only=True) as session:
        deleted = session.scalar(select(Dataset.data_deleted_at).where(Dataset.id == dataset_id))
    return deleted is not None


class _Superseded(Exception):
    """A dataset's keys changed, or its data were deleted, while a rotation re-encrypted
    its file (:func:`_record_keys`)."""


def _keyed_under_current(ring: bytes, path: Path, sealed: str | None) -> bool:
    """Whether a dataset's file key is its only one, sealed with the ring's current key
    alone, and opens its file: what :func:`rotate_data_key` leaves as it is.
    :class:`FileNotFoundError` if the file is not there."""
    if not path.is_file():
        raise FileNotFoundError(path.name)
    if sealed is None or not tables.sealed_with(tables.current_key(ring), sealed):
        return False
    keys = tables.unseal_file_keys(ring, sealed)
    return len(keys) == 1 and tables.opens_with(path, keys[0])


def _record_keys(
    services: Services,
    dataset_id: uuid.UUID,
    expected: str | None,
    sealed: str | None,
    rename: Callable[[], None] | None = None,
) -> None:
    """Record ``sealed`` as the dataset's file keys if they are still ``expected`` and its
    data not deleted, in a transaction of its own holding the dataset's row lock (the
    one :func:`delete_data` takes); :class:`_Superseded` otherwise, nothing changed. With
    ``rename`` (the rename of a rotation's re-encrypted copy over the file), it is done
    under that lock too, before the record: unlocked, another rotation that read the keys
    this run recorded could re-encrypt the file, rename its copy and record its own key
    alone before this run's rename, which then put back a file under a key recorded
    nowhere (``test_a_rotation_run_whole_between_anothers_record_and_rename_loses_nothing``).
    If the commit fails after the rename, the keys recorded before it open the file."""
    with services.db.transaction() as session:
        dataset = ledger.lock_dataset(session, dataset_id)
        if dataset.file_keys != expected or dataset.data_deleted_at is not None:
            raise _Superseded
        if rename is not None:
            rename()
        dataset.file_keys = sealed
