"""Release use cases: request (reserve + enqueue after commit), read, cancel, re-synthesise,
preview. Nothing here reads raw data; the worker stages in :mod:`app.releases.stages` do."""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from sqlalchemy import ColumnElement, and_, case, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.config import Settings
from app.core import pagination
from app.core.audit import record
from app.core.db import (
    advisory_lock_key,
    db_now,
    on_commit,
    take_advisory_lock,
    uses_row_locks,
)
from app.core.disk import ensure_free_space
from app.core.errors import (
    Conflict,
    FilesDeleted,
    IdempotencyConflict,
    InvalidRequest,
    NotFound,
    StorageQuotaExceeded,
    TooManyActiveReleases,
    check_idempotency_key,
)
from app.core.pagination import Page
from app.core.security import ensure_key_active
from app.core.services import Services
from app.core.threads import ThreadLimit
from app.datasets.service import delta_warnings, owned_dataset, visible_dataset, visible_to
from app.ledger import service as ledger
from app.ledger.units import (
    DELTA_SCALE,
    EPSILON_SCALE,
    MAX_EPSILON,
    delta_units,
    delta_value,
    epsilon_units,
    epsilon_value,
)
from app.mechanisms.errors import MechanismError, bytes_text
from app.mechanisms.privacy import check_budget
from app.models import Dataset, Release, ReleaseMeasurement, User
from app.models.base import utcnow
from app.models.release import ACTIVE_STATUSES
from app.releases import adapters as _adapters  # noqa: F401 - registers the release types
from app.releases import registry
from app.releases.registry import ColumnInfo, DatasetInfo, Mechanism
from app.releases.schemas import ArtifactOut, PreviewOut, ReleaseCreate, ReleaseOut
from app.storage.artifacts import ArtifactStore

MEASURE_TASK = "release.measure"
SYNTHESIZE_TASK = "release.synthesize"
#: Release requests' checks and previews (:func:`validate_release`, :func:`preview`) run at
#: once in a process, on threads counted apart from the request threadpool
#: (:mod:`app.core.threads`): at the index-set limit one takes 1-2.5 s and about 240 MB
#: (six at once took the API from 390 MB to 1.8 GB), and the threadpool's 40 threads
#: would have let one curator's concurrent previews take about 10 GB. Requests beyond it
#: wait, holding their parsed body and no thread.
MAX_CONCURRENT_RELEASE_CHECKS = 4
#: Each reads in a short transaction of its own, which the API's pool counts
#: (``connections=1``; :func:`app.core.deps.request_connections`).
release_checks = ThreadLimit("curator_release_checks", MAX_CONCURRENT_RELEASE_CHECKS, connections=1)

#: ``lease_owner`` of a stage that is enqueued but not yet claimed by a worker.
QUEUED = "queued"
#: The status message of a release cancelled once its measurements were stored.
CANCELLED_AFTER_MEASURING = "cancelled after measuring; the budget stays spent"


def hand_lease(release: Release, owner: str, now: datetime, period: timedelta) -> None:
    """Give the release's stage to ``owner`` (a worker's claim, or :data:`QUEUED`) until
    ``now + period``, ``now`` read off the database's clock (:func:`app.core.db.db_now`),
    which every process that compares the lease reads too. ``updated_at`` is set to the same
    ``now``: the sweeper reads a queued release's last wait as ``lease_expires_at -
    updated_at``, and ``updated_at``'s own default is the host's clock."""
    release.lease_owner = owner
    release.lease_expires_at = now + period
    release.updated_at = now


def end_synthesis_run(release: Release, status: str, message: str) -> None:
    """End the synthesis run of a release (locked by the caller) as ``status``
    (``"failed"`` or ``"cancelled"``). A re-synthesis of a release that has a published
    version leaves that version served: the release is ``succeeded`` again, with that
    version's parameters, and the message says what became of the run. The worker of a
    run that is still going loses its lease (its work is discarded). A re-synthesis of a
    release whose files its curator deleted (:func:`delete_files`) leaves it as it was
    too: ``succeeded``, its files deleted, its last published version's parameters; it
    turned the release ``failed`` or ``cancelled`` ("cancelled after measuring", of a
    release that had published), the failed run's parameters shown as its own."""
    now = utcnow()
    if release.has_published:
        served = (
            f"version {release.published_version} is still served"
            if release.published_version is not None
            else "its files stay deleted until a re-synthesis publishes it"
        )
        release.status = "succeeded"
        release.synthesis_params = dict(release.published_synthesis_params or {})
        release.message = (
            f"re-synthesis (version {release.synthesis_version}) {status}: {message}; {served}"
        )
        release.cancel_requested = False
        release.progress = 1.0
    else:
        release.status = status
        release.message = message
    release.finished_at = now
    release.lease_owner = None
    release.lease_expires_at = None


#: The stored columns of a graph dataset (see :mod:`app.datasets.graphs`).
GRAPH_COLUMNS = (ColumnInfo("u", "vertex"), ColumnInfo("v", "vertex"))


def dataset_info(dataset: Dataset, mechanism: Mechanism, columns: list[str] | None) -> DatasetInfo:
    """The release's columns (declared order), checked against the mechanism's column kinds;
    for a graph, its public vertex count (a graph release has no columns: ``[]``)."""
    if dataset.kind not in mechanism.dataset_kinds:
        raise InvalidRequest(
            f"{mechanism.name} releases {' or '.join(sorted(mechanism.dataset_kinds))} "
            f"datasets; this one is a {dataset.kind}"
        )
    if dataset.kind == "graph":
        if columns:
            raise InvalidRequest("a graph release takes no columns")
        return DatasetInfo(n_rows=0, columns=GRAPH_COLUMNS, n_vertices=dataset.n_vertices)
    declared = {str(c["name"]): c for c in dataset.columns}
    if columns is None:
        chosen = [name for name, c in declared.items() if c["kind"] in mechanism.column_kinds]
        if not chosen:
            raise InvalidRequest(
                f"{mechanism.name} releases columns of kind "
                f"{sorted(mechanism.column_kinds)}; the dataset has none"
            )
    else:
        if len(set(columns)) != len(columns):
            raise InvalidRequest("columns must be distinct")
        unknown = [c for c in columns if c not in declared]
        if unknown:
            raise InvalidRequest(f"columns not in the dataset: {unknown}")
        wrong = [c for c in columns if declared[c]["kind"] not in mechanism.column_kinds]
        if wrong:
            raise InvalidRequest(
                f"{mechanism.name} releases columns of kind {sorted(mechanism.column_kinds)}; "
                f"not: {wrong}"
            )
        chosen = columns
    return DatasetInfo(
        n_rows=dataset.n_rows,
        columns=tuple(ColumnInfo.from_declared(declared[name]) for name in chosen),
    )


@dataclass(frozen=True)
class Validated:
    mechanism: Mechanism
    info: DatasetInfo
    params: BaseModel
    params_json: dict[str, Any]
    epsilon: float
    delta: float
    #: :meth:`Mechanism.preview` of the request (resolved parameters, predicted accuracy),
    #: from public values only; a request records its ``accuracy`` with the release.
    predicted: dict[str, Any]
    #: True for a retry that today's checks refuse but that matches the release recorded
    #: under its Idempotency-Key (a check added since it was recorded): only replayed.
    replay_only: bool = False
    #: :meth:`Mechanism.artifact_bytes` of the request: an upper bound on its files' size.
    artifact_bytes: int = 0


def _check_opt_in(dataset: Dataset, mechanism: Mechanism) -> None:
    """A release that is not differentially private needs the curator's opt-in (409)."""
    if mechanism.privacy_kind == "non_dp" and not dataset.allow_non_dp_releases:
        raise Conflict(
            f"{mechanism.name} is not differentially private; the curator must first "
            "allow non-DP releases on this dataset (PATCH allow_non_dp_releases)"
        )


def _check_data_kept(dataset: Dataset) -> None:
    """A dataset whose stored rows were deleted takes no new release (409)."""
    if dataset.data_deleted_at is not None:
        raise Conflict(
            "this dataset's data were deleted "
            f"({dataset.data_deleted_at.isoformat(timespec='seconds')}): no new release can "
            "read them; its releases can still be downloaded, answered and re-synthesised"
        )


def check_release_bytes(settings: Settings, predicted: int, advice: str) -> None:
    """Refuse (422) a release, or a re-synthesis, whose files could take more than
    ``CURATOR_MAX_RELEASE_BYTES`` (0: no limit): ``predicted`` is its mechanism's upper
    bound (:meth:`Mechanism.artifact_bytes`), from public values, so nothing is reserved
    or changed. Without it one curator's default ``smooth_synthetic`` releases of a
    2000-column table wrote about 711 MB each (the memory bound on the synthesis allowed
    about 20 GB), and the data directory filled for every user."""
    limit = settings.max_release_bytes
    if limit and predicted > limit:
        raise InvalidRequest(
            f"this release's files could take up to {bytes_text(predicted)} ({predicted} "
            f"bytes), more than one release may store: CURATOR_MAX_RELEASE_BYTES = "
            f"{bytes_text(limit)} ({limit} bytes); {advice}"
        )


#: What a request refused by :func:`check_release_bytes` can change.
SMALLER_RELEASE = (
    "ask for fewer columns or rows (smooth_synthetic: a smaller sample_size or grid_size)"
)


def _validated(
    dataset: Dataset, body: ReleaseCreate, settings: Settings, *, check: bool = True
) -> Validated:
    """Everything about a request that can be checked without data, or 422/409; with
    ``check=False`` the request read and resolved but not checked by its mechanism (a
    ``replay_only`` one: see :func:`validate_release`). Checked last: the predicted size
    of its files (:func:`check_release_bytes`)."""
    mechanism = registry.get(body.mechanism)
    if mechanism.privacy_kind == "non_dp":
        if body.epsilon is not None or body.delta:
            raise InvalidRequest(
                f"{mechanism.name} is not differentially private "
                f"({mechanism.guarantee_for(body.params)}); "
                "omit epsilon and delta"
            )
        _check_opt_in(dataset, mechanism)
        epsilon, delta = 0.0, 0.0
    else:
        if body.epsilon is None:
            raise InvalidRequest(f"{mechanism.name} needs epsilon")
        try:
            check_budget(body.epsilon, body.delta)
        except MechanismError as exc:
            raise InvalidRequest(str(exc)) from None
        if body.epsilon > MAX_EPSILON:  # the ledger's range: no dataset budget is larger
            raise InvalidRequest(
                f"epsilon ({body.epsilon}) must be at most 1e6, the largest budget a dataset holds"
            )
        # The ledger's resolution: a smaller request would be charged this much anyway, and
        # below it the noise calibrations leave double precision (a subnormal delta hung).
        if body.epsilon < 1 / EPSILON_SCALE:
            raise InvalidRequest(f"epsilon ({body.epsilon}) must be at least 1e-12")
        if 0 < body.delta < 1 / DELTA_SCALE:
            raise InvalidRequest(f"delta ({body.delta}) must be 0 or at least 1e-18")
        epsilon, delta = body.epsilon, body.delta
    info = dataset_info(dataset, mechanism, body.columns)
    params = mechanism.resolve_params(info, epsilon, delta, mechanism.parse_params(body.params))
    if not check:
        return Validated(
            mechanism, info, params, params.model_dump(mode="json"), epsilon, delta, {}, True
        )
    try:
        predicted = mechanism.checked_preview(info, epsilon, delta, params)
        artifact_bytes = mechanism.artifact_bytes(
            info, epsilon, delta, params, predicted.get("resolved", {})
        )
    except MechanismError as exc:
        raise InvalidRequest(str(exc)) from None
    check_release_bytes(settings, artifact_bytes, SMALLER_RELEASE)
    return Validated(
        mechanism,
        info,
        params,
        params.model_dump(mode="json"),
        epsilon,
        delta,
        predicted,
        artifact_bytes=artifact_bytes,
    )


def _request_hash(dataset_id: uuid.UUID, body: ReleaseCreate, checked: Validated) -> str:
    canonical = json.dumps(
        {
            "dataset": str(dataset_id),
            "mechanism": body.mechanism,
            "epsilon": repr(float(checked.epsilon)),
            "delta": repr(float(checked.delta)),
            "columns": checked.info.names,
            "params": checked.params_json,
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _existing(
    session: Session,
    user: User,
    key: str,
    dataset_id: uuid.UUID,
    body: ReleaseCreate,
    checked: Validated,
) -> Release | None:
    release = session.scalars(
        select(Release).where(Release.created_by == user.id, Release.idempotency_key == key)
    ).one_or_none()
    if release is not None and not _same_request(release, dataset_id, body, checked):
        raise IdempotencyConflict(
            "this Idempotency-Key was used for a different request; use a new key"
        )
    return release


def _same_request(
    release: Release, dataset_id: uuid.UUID, body: ReleaseCreate, checked: Validated
) -> bool:
    """Whether ``release`` was recorded for this request. Its ``request_hash`` covers its
    parameters as the code of its day dumped them, defaults included, so a parameter added
    since (``smooth_synopsis``'s ``co_spread``, say) changed the hash of the very same body
    and its retry after an upgrade got 409. A release whose hash is this request's with its
    own stored parameters (so the same dataset, mechanism, budget and columns) matches when
    those parameters, read and resolved by today's model, are this request's, or when
    every parameter the body sets resolves to the recorded value: the others are defaults,
    and a default resolved by an older rule (``smooth_synthetic``'s method, which falls
    back from ``tree`` to ``marginals`` above a work bound since 0e66f97) is still this
    request's."""
    if release.request_hash == _request_hash(dataset_id, body, checked):
        return True
    if checked.delta == 0.0 and release.request_hash == _request_hash(
        dataset_id, body, replace(checked, delta=-0.0)
    ):
        # recorded before a body's -0.0 was read as 0.0: its hash kept the sign
        return True
    recorded = replace(checked, params_json=dict(release.params))
    if release.request_hash != _request_hash(dataset_id, body, recorded):
        return False
    mechanism = checked.mechanism
    try:
        params = mechanism.parse_params(release.params)
    except InvalidRequest:  # a parameter since removed or narrowed: not this request
        return False
    resolved = mechanism.resolve_params(checked.info, checked.epsilon, checked.delta, params)
    if resolved.model_dump(mode="json") == checked.params_json:
        return True
    explicit = mechanism.parse_params(body.params).model_dump(mode="json", exclude_unset=True)
    return all(
        name in release.params and checked.params_json.get(name) == release.params[name]
        for name in explicit
    )


def validate_release(
    services: Services,
    user: User,
    dataset_id: uuid.UUID,
    body: ReleaseCreate,
    idempotency_key: str | None,
) -> Validated:
    """The checks of a release request (:func:`_validated`), with the dataset read in a
    short read-only transaction of its own and the checks run after it: some take seconds
    (a tree's noise calibration at extreme budgets, ~12 s), and inside the write
    transaction they held SQLite's write lock from every other writer meanwhile.
    :func:`create_release` then records what was checked."""
    check_idempotency_key(idempotency_key)
    with services.db.transaction(read_only=True) as session:
        dataset = owned_dataset(session, user, dataset_id)
    try:
        return _validated(dataset, body, services.settings)
    except InvalidRequest:
        # A retry of a request recorded before a check that now refuses it (a release
        # that may already have spent its budget) is replayed, as any retry is: the
        # recorded release, not a 422.
        if idempotency_key is None:
            raise
        unchecked = _validated(dataset, body, services.settings, check=False)
        with services.db.transaction(read_only=True) as session:
            recorded = session.scalars(
                select(Release).where(
                    Release.created_by == user.id, Release.idempotency_key == idempotency_key
                )
            ).one_or_none()
            if recorded is None or not _same_request(recorded, dataset.id, body, unchecked):
                raise
        return unchecked


def _check_single_release(session: Session, dataset_id: uuid.UUID, mechanism: Mechanism) -> None:
    """Refuse (409) a second release of a :attr:`Mechanism.single_release` mechanism on the
    dataset: one still running, or one whose worker read the data (measured, or ended after
    reading), counts; one that ended before reading does not. Runs under the dataset lock
    for a request; a preview runs it too, so that it says what the request would meet."""
    if not mechanism.single_release:
        return
    earlier = session.scalars(
        select(Release)
        .where(Release.dataset_id == dataset_id, Release.mechanism == mechanism.name)
        .order_by(Release.created_at)
    )
    for release in earlier:
        if (
            release.status in ACTIVE_STATUSES
            or release.measured_at is not None
            or ledger.has_read_data(session, release.id)
        ):
            if release.status != "succeeded":
                advice = "re-synthesise it if it was measured; a dataset gets one"
            elif release.files_deleted_at is not None:
                advice = "its curator deleted its files: re-synthesise it (no budget)"
            else:
                advice = "use that release"
            raise Conflict(
                f"this dataset already has its {mechanism.name} release ({release.id}, "
                f"{release.status}): its guarantee covers one output, and independent repeats "
                f"average towards the data's exact statistics; {advice}"
            )


def lock_curator_limits(session: Session, services: Services, user_id: uuid.UUID) -> None:
    """On PostgreSQL, take the curator's advisory lock (:func:`advisory_lock_key` of
    their id) until the transaction ends, before :func:`check_active_releases` and
    :func:`check_curator_bytes` count their releases: requests on several datasets of one
    curator hold different dataset locks, and each counted the others' uncommitted
    releases as absent (all passed a limit of 1 at once). Under READ COMMITTED the count
    after the lock sees what the previous holder committed. It is the last lock these
    paths take (a request holds its dataset's, a re-synthesis its release's; neither waits
    for another row lock after it), so it closes no cycle. Nothing when both limits are off
    and nothing on SQLite, whose write transactions are serial."""
    settings = services.settings
    if not uses_row_locks(session) or not (
        settings.max_active_releases or settings.max_curator_bytes
    ):
        return
    take_advisory_lock(session, advisory_lock_key(b"curator release limits ", user_id))


def _stopping() -> ColumnElement[bool]:
    """Releases being measured whose curator cancelled them (``cancel_requested``): none
    will publish a version or write a file. The measure stage writes no file (its output
    is the stored measurements); the only way on to a synthesis is
    :func:`app.releases.stages._persist_measurement`, which ends a release cancelled
    instead, under the release's lock, as :func:`cancel_release` sets the flag; and
    nothing clears the flag before the release ends (:func:`resynthesize` takes only an
    ended release, :func:`end_synthesis_run` only a synthesis run). Not a synthesis run:
    a cancel ends one at once (:func:`end_synthesis_run`), and a re-synthesis's published
    version stays counted (``stored_bytes``)."""
    return and_(Release.status == "measuring", Release.cancel_requested.is_(True))


def _held(now: datetime) -> ColumnElement[bool]:
    """Releases whose stage a worker holds under a lease that has not run out at ``now``
    (the database's clock), as :func:`app.releases.stages._held` reads one."""
    return and_(
        Release.lease_owner.is_not(None),
        Release.lease_owner != QUEUED,
        Release.lease_expires_at > now,
    )


def check_active_releases(session: Session, services: Services, user: User) -> None:
    """Refuse (429) a release request or a re-synthesis from a curator who already has
    ``CURATOR_MAX_ACTIVE_RELEASES`` releases queued or running (0: no limit), before
    anything is reserved or changed. Workers take jobs first come, first served: 300
    requests at epsilon 1e-12 (a minute of requests, no budget to speak of) held the
    worker for over an hour while another curator's release stayed queued, and requests
    that each measure for the 10-27 minutes the work bounds allow would hold it for days.
    Counted under the curator's lock (:func:`lock_curator_limits`).

    A release being measured whose curator cancelled it (:func:`_stopping`) counts only
    while a worker holds its lease (:func:`_held`): that worker is busy with it until its
    stage reaches its next progress call, which raises the cancel its heartbeat read
    (every ``lease_seconds / 4``, 15 s by default). A stage that gets to none keeps
    renewing the lease for ``CANCEL_GRACE_LEASES`` (4) leases and lets it run out, at
    most a lease later: about 5.25 leases (5 min 15 s by default; 2.54 to 2.64 s measured
    at a 0.5 s lease, ``tests/releases/test_active_releases.py``). Counting it while held keeps
    a curator who requests and cancels from holding more workers than the limit. Once
    its lease is gone (its worker died, or no worker runs, or its heartbeat let the lease
    go) the next claim ends it without reading the data
    (:func:`app.releases.stages.run_measure`); counted, it kept a curator who cancelled
    to make room at 429 for as long as no worker ran. A stage whose heartbeat let the
    lease go may still run on its thread until its mechanism returns (storing nothing:
    :class:`app.releases.stages.LeaseLost`) and is not counted meanwhile, as it was not
    once the next claim had ended the release before this: a thread cannot be stopped
    from outside, so the limit holds such a thread for those 5.25 leases only."""
    limit = services.settings.max_active_releases
    if limit == 0:
        return
    active = session.scalar(
        select(func.count())
        .select_from(Release)
        .where(
            Release.created_by == user.id,
            Release.status.in_(ACTIVE_STATUSES),
            or_(~_stopping(), _held(db_now(session))),
        )
    )
    if active is not None and active >= limit:
        raise TooManyActiveReleases(
            f"you have {active} releases queued or running, the limit "
            f"(CURATOR_MAX_ACTIVE_RELEASES = {limit}); wait for one to finish, or cancel one, "
            "and send this again"
        )


def curator_bytes(session: Session, user_id: uuid.UUID) -> int:
    """What the curator's releases store or may store: their published versions' bytes
    (``stored_bytes``) and the predicted bytes of their queued or running runs
    (``predicted_bytes``), but those of releases being measured that their curator
    cancelled (:func:`_stopping`), which will never write them: counted, they kept a
    curator who cancelled to make room at the quota until a worker ended the release.
    Releases published before ``stored_bytes`` was recorded (migration 0014) count once
    the worker's sweeper has filled it in (:func:`app.releases.stages.fill_stored_bytes`)."""
    stored = func.coalesce(func.sum(Release.stored_bytes), 0)
    will_store = and_(Release.status.in_(ACTIVE_STATUSES), ~_stopping())
    running = func.coalesce(
        func.sum(case((will_store, Release.predicted_bytes), else_=0)),
        0,
    )
    total = session.execute(select(stored, running).where(Release.created_by == user_id)).one()
    return int(total[0]) + int(total[1])


def check_curator_bytes(
    session: Session, services: Services, user_id: uuid.UUID, adding: int
) -> None:
    """Refuse (422 ``storage_quota_exceeded``) a request or re-synthesis whose predicted
    bytes (``adding``) would take its curator's releases past ``CURATOR_MAX_CURATOR_BYTES``
    (0: no limit), before anything is reserved or changed: :func:`check_release_bytes`
    bounds one release, not what releases add up to (61 default ``smooth_synthetic``
    releases of a 2000-column table left 41 GB, and every user then got 503s). Counted
    under the curator's lock (:func:`lock_curator_limits`)."""
    limit = services.settings.max_curator_bytes
    if limit == 0:
        return
    used = curator_bytes(session, user_id)
    if used + adding > limit:
        raise StorageQuotaExceeded(
            f"your releases store or may store {bytes_text(used)} ({used} bytes), and this "
            f"one could add up to {bytes_text(adding)} ({adding} bytes): more than the "
            f"limit, CURATOR_MAX_CURATOR_BYTES = {bytes_text(limit)} ({limit} bytes); ask "
            "for a smaller release, delete the files of releases you no longer serve "
            "(DELETE /v1/releases/{id}/artifacts), or ask an administrator to raise the limit"
        )


def create_release(
    session: Session,
    services: Services,
    user: User,
    dataset_id: uuid.UUID,
    body: ReleaseCreate,
    checked: Validated,
    idempotency_key: str | None,
    key_id: uuid.UUID | None = None,
) -> tuple[ReleaseOut, bool]:
    """Reserve the budget and record the release checked by :func:`validate_release`, in
    the caller's (write) transaction; the measure job is enqueued once it commits.
    Returns (release, created).

    What may have changed since the checks is checked again here: the caller's API key
    (``key_id``, revoked meanwhile: nothing is recorded), the dataset's ownership and
    non-DP opt-in, and its columns (a dataset's schema is fixed at upload, so a mismatch
    is a 409, not a silent release of other columns)."""
    if key_id is not None:
        ensure_key_active(session, key_id)
    dataset = owned_dataset(session, user, dataset_id)
    if dataset_info(dataset, checked.mechanism, body.columns) != checked.info:
        raise Conflict("the dataset changed while the request was checked; send it again")
    request_hash = _request_hash(dataset.id, body, checked)
    if idempotency_key is not None:
        existing = _existing(session, user, idempotency_key, dataset.id, body, checked)
        if existing is not None:
            return to_out(session, existing), False
    if checked.replay_only:  # validate_release saw its release: it cannot have gone
        raise RuntimeError("a replay-only request found no release to replay")
    # Lock the budget before inserting. It inserts a new release (no one waits on it) and
    # ledger rows under the dataset lock; paths that hold an existing release lock it
    # first and the dataset second (app.ledger.service), never the other way round.
    locked = ledger.lock_dataset(session, dataset.id)
    if idempotency_key is not None:
        # again under the lock: a concurrent copy of this request may have committed while
        # this one waited (on PostgreSQL), and the checks below would refuse its replay
        existing = _existing(session, user, idempotency_key, dataset.id, body, checked)
        if existing is not None:
            return to_out(session, existing), False
    # a replay above is answered whatever the disk (also one of a concurrent copy); a new
    # release, measured and spent, would fail at synthesis on a full disk, and its curator
    # would ask (and pay) again
    ensure_free_space(services.settings, "release request")
    _check_data_kept(locked)  # under the lock that a deletion of the data takes too
    # under the lock too: read before it, an opt-out that another process committed while
    # this request waited for the lock was not seen (PostgreSQL; tests/test_two_processes.py)
    _check_opt_in(locked, checked.mechanism)
    _check_single_release(session, dataset.id, checked.mechanism)
    lock_curator_limits(session, services, user.id)
    check_active_releases(session, services, user)
    check_curator_bytes(session, services, user.id, checked.artifact_bytes)
    release = Release(
        dataset_id=dataset.id,
        mechanism=body.mechanism,
        status="queued",
        epsilon=epsilon_units(checked.epsilon, charge=True),
        delta=delta_units(checked.delta, charge=True),
        params=checked.params_json,
        accuracy=checked.predicted.get("accuracy", {}),
        columns=[] if dataset.kind == "graph" else checked.info.names,
        created_by=user.id,
        seed=secrets.randbits(62),
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        predicted_bytes=checked.artifact_bytes,
    )
    hand_lease(release, QUEUED, db_now(session), timedelta(seconds=services.settings.lease_seconds))
    try:
        with session.begin_nested():
            session.add(release)
            session.flush()
    except IntegrityError:
        # A concurrent request with the same key won the race.
        if idempotency_key is None:
            raise
        existing = _existing(session, user, idempotency_key, dataset.id, body, checked)
        if existing is None:
            raise
        return to_out(session, existing), False
    if checked.mechanism.privacy_kind == "dp":
        ledger.reserve(
            session,
            dataset.id,
            release.id,
            release.epsilon,
            release.delta,
            ledger.Actor.user(user.id),
        )
    record(
        session,
        user.id,
        "release.create",
        "release",
        release.id,
        dataset_id=str(dataset.id),
        mechanism=body.mechanism,
        epsilon=checked.epsilon,
        delta=checked.delta,
        guarantee=checked.mechanism.guarantee_for(checked.params_json),
    )
    release_id = str(release.id)
    on_commit(session, lambda: services.queue.enqueue(MEASURE_TASK, release_id))
    return to_out(session, release), True


def to_out(session: Session, release: Release) -> ReleaseOut:
    mechanism = registry.REGISTRY.get(release.mechanism)
    dataset = session.get(Dataset, release.dataset_id)
    assert dataset is not None
    artifacts = (
        [
            ArtifactOut(
                name=name,
                media_type=str(meta["media_type"]),
                description=str(meta["description"]),
                url=f"/v1/releases/{release.id}/artifacts/{name}",
            )
            for name, meta in sorted(release.artifacts.items())
        ]
        if release.published_version is not None
        else []
    )
    params, synthesis_params = release.params, release.synthesis_params
    guarantee, resolved = "unknown", release.resolved
    if mechanism is not None:
        applies = mechanism.post_processing_for(release.params)
        params = mechanism.shown_params(release.params)
        synthesis_params = {k: v for k, v in synthesis_params.items() if k in applies}
        guarantee = mechanism.guarantee_for(release.params)
        stored = resolved.get("guarantee")
        if isinstance(stored, str) and stored != guarantee:
            # recorded at measure time under an older label (a compressed release with the
            # data as reference claimed paper 002's guarantee): shown as it applies now,
            # in resolved and in the artifacts' descriptions alike
            resolved = {**resolved, "guarantee": guarantee}
            artifacts = [
                a.model_copy(update={"description": a.description.replace(stored, guarantee)})
                for a in artifacts
            ]
    return ReleaseOut(
        id=release.id,
        dataset_id=release.dataset_id,
        mechanism=release.mechanism,
        guarantee=guarantee,
        status=release.status,
        progress=release.progress,
        message=release.message,
        cancel_requested=release.cancel_requested,
        epsilon=epsilon_value(release.epsilon),
        delta=delta_value(release.delta),
        columns=list(release.columns),
        params=params,
        synthesis_params=synthesis_params,
        synthesis_version=release.synthesis_version,
        published_version=release.published_version,
        resolved=resolved,
        accuracy=release.accuracy,
        privacy_cost=release.privacy_cost,
        artifacts=artifacts,
        created_at=release.created_at,
        updated_at=release.updated_at,
        measured_at=release.measured_at,
        finished_at=release.finished_at,
        files_deleted_at=release.files_deleted_at,
        warnings=delta_warnings(delta_value(release.delta), dataset, "the release's delta"),
    )


def visible_release(session: Session, user: User, release_id: uuid.UUID) -> Release:
    """The release, if its dataset is visible to ``user``; else 404, the very answer for an
    id that does not exist, in one statement either way (:func:`visible_dataset`)."""
    release = session.scalars(
        select(Release)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(Release.id == release_id, visible_to(user))
    ).one_or_none()
    if release is None:
        raise NotFound("release not found")
    return release


def owned_release(session: Session, user: User, release_id: uuid.UUID) -> Release:
    release = visible_release(session, user, release_id)
    owned_dataset(session, user, release.dataset_id)
    return release


def served_version(release: Release, what: str) -> int:
    """The synthesis version whose files serve ``what`` (``"artifacts"``, ``"answers"``):
    409 while none was published, 410 ``files_deleted`` once its curator deleted them
    (:func:`delete_files`), until a re-synthesis publishes again."""
    if release.published_version is not None:
        return release.published_version
    if release.files_deleted_at is not None:
        raise FilesDeleted(
            f"the release's files were deleted by its curator "
            f"({release.files_deleted_at.isoformat(timespec='seconds')}); {what} exist again "
            "once the curator re-synthesises it (no budget)"
        )
    raise Conflict(f"the release is {release.status}; {what} exist once it succeeded")


def delete_files(
    session: Session, services: Services, user: User, release_id: uuid.UUID
) -> ReleaseOut:
    """Delete the release's published files, to free the storage they take (counted
    against ``CURATOR_MAX_CURATOR_BYTES``): downloads and answers are 410 from then on.
    The measurements stay, and so does the spend (post-processing freed no privacy): a
    re-synthesis, at no budget, publishes the release again. A second call answers as the
    first did.

    Refused (409) while a stage runs, a re-synthesis of a published release included (its
    worker would publish; cancel it first), and for a release that published nothing. The
    row is updated here and the files removed once it commits, versions ``v0`` to the
    current ``synthesis_version`` only (:meth:`ArtifactStore.remove_versions`): a later
    re-synthesis writes a higher one, which a removal still under way never touches. A
    process that dies between the commit and the removal leaves the files unserved; the
    sweeper's first pass after a start removes them
    (:func:`app.releases.stages.remove_stale_work`)."""
    owned_release(session, user, release_id)
    release = lock_release(session, release_id)
    assert release is not None
    if release.status in ACTIVE_STATUSES:
        raise Conflict(
            f"the release is {release.status}; cancel it (DELETE /v1/releases/{release.id}) "
            "or wait for it to end, then delete its files"
        )
    if release.published_version is None:
        if release.files_deleted_at is not None:
            return to_out(session, release)  # deleted before: the same answer
        raise Conflict(f"the release ended {release.status} and published no files to delete")
    freed = release.stored_bytes
    release.published_version = None
    release.artifacts = {}
    release.stored_bytes = 0
    release.files_deleted_at = utcnow()
    session.flush()
    record(
        session,
        user.id,
        "release.delete_files",
        "release",
        release.id,
        synthesis_version=release.synthesis_version,
        stored_bytes=freed,
    )
    store = ArtifactStore(services.settings.releases_dir)
    release_key, through = release.id, release.synthesis_version
    on_commit(session, lambda: store.remove_versions(release_key, through))
    return to_out(session, release)


def lock_release(session: Session, release_id: uuid.UUID) -> Release | None:
    stmt = select(Release).where(Release.id == release_id).execution_options(populate_existing=True)
    if uses_row_locks(session):
        stmt = stmt.with_for_update()
    return session.scalars(stmt).one_or_none()


def list_releases(
    session: Session, user: User, dataset_id: uuid.UUID, limit: int, after_id: uuid.UUID | None
) -> Page[ReleaseOut]:
    """A page of the dataset's releases (404 if the dataset is invisible), oldest first;
    ``after_id`` must be one of them."""
    visible_dataset(session, user, dataset_id)
    page: Page[Release] = pagination.by_time(
        session,
        select(Release).where(Release.dataset_id == dataset_id),
        Release.created_at,
        Release.id,
        limit,
        after_id,
        lambda r: r.id,
        weigh=_weight,
    )
    return page.map(lambda r: to_out(session, r))


def _weight(release: Release) -> int:
    """A release's weight in a page of the list (``pagination.MAX_PAGE_BYTES``): its
    stored JSON (columns, up to 2000 declared names, and parameters, a ``reference``
    matrix among them)."""
    return pagination.json_size(
        release.columns,
        release.params,
        release.synthesis_params,
        release.resolved,
        release.accuracy,
        release.privacy_cost,
        release.artifacts,
    )


def cancel_release(session: Session, user: User, release_id: uuid.UUID) -> ReleaseOut:
    """Cancel: refund if nothing was measured; once measured the spend stays.

    A queued release is cancelled at once and refunded. A release being measured is
    marked; its worker stops at its next heartbeat and refunds only if it has read no row
    of the data yet (DESIGN rule 6), otherwise the reservation is spent; a measurement it
    completes is persisted and spent, and stays reachable by re-synthesis. A synthesis run
    is ended at once (:func:`end_synthesis_run`): a re-synthesis's published version stays
    served.
    """
    owned_release(session, user, release_id)
    release = lock_release(session, release_id)
    assert release is not None
    if release.status in ("succeeded", "failed", "cancelled"):
        raise Conflict(f"the release already ended ({release.status})")
    if release.status == "measuring" and release.cancel_requested:
        return to_out(session, release)  # asked before: the same answer, nothing new to record
    release.cancel_requested = True
    now = utcnow()
    if release.status == "queued":
        if ledger.reservation_state(session, release.id) == "reserved":
            ledger.refund(session, release.id, ledger.Actor.user(user.id))
        release.status = "cancelled"
        release.message = "cancelled before measuring; the budget was refunded"
        release.finished_at = now
    elif release.status == "synthesizing":
        end_synthesis_run(
            release,
            "cancelled",
            "cancelled by the curator" if release.has_published else CANCELLED_AFTER_MEASURING,
        )
    else:
        release.message = (
            "cancellation requested; the reservation is refunded only if no attempt has "
            "read the data yet"
        )
    session.flush()
    record(session, user.id, "release.cancel", "release", release.id, status=release.status)
    return to_out(session, release)


def resynthesize(
    session: Session,
    services: Services,
    user: User,
    release_id: uuid.UUID,
    raw_params: dict[str, Any],
) -> ReleaseOut:
    """Run the post-processing again on the stored measurements: no budget is spent.

    Any release that has measurements and has ended can be re-synthesised: succeeded,
    failed, or cancelled after measuring (its epsilon stays spent, so its output must stay
    reachable; the cancellation flag is cleared for the new run). A published version stays
    served while the run goes, and after it if it fails or is cancelled."""
    owned_release(session, user, release_id)
    release = lock_release(session, release_id)
    assert release is not None
    mechanism = registry.get(release.mechanism)
    mechanism.check_post_processing(release.params, raw_params)
    allowed = mechanism.post_processing_for(release.params)
    not_allowed = sorted(set(raw_params) - allowed)
    if not_allowed:
        raise InvalidRequest(
            f"only post-processing parameters can change without spending budget "
            f"({sorted(allowed)}); not: {not_allowed}"
        )
    if session.get(ReleaseMeasurement, release.id) is None:
        if release.status in ("failed", "cancelled"):  # it never will have any
            raise Conflict(
                f"the release ended ({release.status}) before it was measured; it has no "
                "measurements to re-synthesise: request a new release"
            )
        raise Conflict("the release has no measurements yet; nothing to re-synthesise")
    if release.status not in ("succeeded", "failed", "cancelled"):
        raise Conflict(f"the release is {release.status}; wait for it to finish")
    lock_curator_limits(session, services, release.created_by)
    check_active_releases(session, services, user)
    merged = {**release.params, **release.synthesis_params, **raw_params}
    params = mechanism.parse_params(merged)
    # the checks a new request gets (e.g. a synthetic sample that cannot fit in memory):
    # a refused run must not turn a succeeded release into a failed one
    dataset = session.get(Dataset, release.dataset_id)
    assert dataset is not None
    info = dataset_info(dataset, mechanism, release.columns or None)
    epsilon, delta = epsilon_value(release.epsilon), delta_value(release.delta)
    try:
        mechanism.check_synthesis(info, epsilon, delta, params)
        artifact_bytes = mechanism.artifact_bytes(info, epsilon, delta, params, release.resolved)
    except MechanismError as exc:
        raise InvalidRequest(str(exc)) from None
    check_release_bytes(
        services.settings, artifact_bytes, "re-synthesise with a smaller sample_size or grid_size"
    )
    check_curator_bytes(session, services, release.created_by, artifact_bytes)
    checked = params.model_dump(mode="json")
    release.synthesis_params = {k: checked[k] for k in mechanism.post_processing if k in checked}
    release.synthesis_version += 1
    release.predicted_bytes = artifact_bytes
    release.status = "synthesizing"
    release.attempts = 0
    release.cancel_requested = False
    release.progress = 0.0
    release.message = None
    release.finished_at = None
    hand_lease(release, QUEUED, db_now(session), timedelta(seconds=services.settings.lease_seconds))
    session.flush()
    record(session, user.id, "release.resynthesize", "release", release.id, params=raw_params)
    release_key = str(release.id)
    on_commit(session, lambda: services.queue.enqueue(SYNTHESIZE_TASK, release_key))
    return to_out(session, release)


def preview(
    services: Services, user: User, dataset_id: uuid.UUID, body: ReleaseCreate
) -> PreviewOut:
    """Resolved parameters, privacy cost and predicted accuracy; no data read, no budget.
    The dataset and its balance are read in a short read-only transaction; the checks and
    the prediction (seconds at extreme budgets) run after it, holding no session."""
    with services.db.transaction(read_only=True) as session:
        dataset = owned_dataset(session, user, dataset_id)
        balance = ledger.balance(session, dataset)
        _check_data_kept(dataset)
        _check_single_release(session, dataset.id, registry.get(body.mechanism))
    checked = _validated(dataset, body, services.settings)
    predicted = checked.predicted
    fits = (
        epsilon_units(checked.epsilon, charge=True) <= balance.epsilon_remaining
        and delta_units(checked.delta, charge=True) <= balance.delta_remaining
    )
    return PreviewOut(
        mechanism=checked.mechanism.name,
        guarantee=checked.mechanism.guarantee_for(checked.params_json),
        epsilon=body.epsilon,
        delta=checked.delta,
        columns=checked.info.names,
        params=checked.mechanism.shown_params(checked.params_json),
        resolved=predicted.get("resolved", {}),
        accuracy=predicted.get("accuracy", {}),
        fits_budget=fits,
        artifact_bytes=checked.artifact_bytes,
        remaining=balance.remaining(),
        warnings=delta_warnings(checked.delta, dataset, "the request's delta"),
    )


def release_info(session: Session, release: Release) -> DatasetInfo:
    dataset = session.get(Dataset, release.dataset_id)
    assert dataset is not None
    return dataset_info(dataset, registry.get(release.mechanism), list(release.columns))
