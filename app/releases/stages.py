"""The two worker stages of a release and the sweeper that recovers them.

*Measure* (DESIGN §2 rule 4) is the only code that reads raw rows. It claims the release
under a lease, streams the encrypted table into the mechanism, and then, in ONE
transaction, stores the noisy measurements, turns the ledger reservation into a spend and
moves the release on to *synthesise*. If it fails or is cancelled before that
transaction, nothing is stored, and the reservation is refunded only if no row was read
(by this attempt or an earlier one): otherwise it is spent (DESIGN rule 6; a refunded
failure after reading could depend on the data). Before it opens the data file an attempt
records ``read_started_at`` in a transaction of its own, so an earlier attempt whose
worker died counts as having read only if it got that far. If its worker dies, the noise it drew
was never stored or shown to anyone, the lease expires and the sweeper hands the stage to
another worker, which measures afresh. Once measurements exist they are immutable
(database triggers), so no retry ever redraws them.

*Synthesise* reads only the stored measurements, with a generator seeded from the
release, so a retry reproduces the same artifacts; it may run any number of times.

A stage's worker renews its lease from a heartbeat thread, which also publishes progress
(a changed progress within ``PROGRESS_SECONDS``, not only at the next renewal) and notices
cancellation; a worker that lost its lease discards its work. A stage that
ignores a cancel for ``CANCEL_GRACE_LEASES`` lease periods (a mechanism hung after its last
progress call) stops renewing its lease, so the sweeper hands the release to a worker that
ends it. The measure stage is claimed at most ``MAX_MEASURE_ATTEMPTS`` times to read the
data (each attempt may); the claim after that ends the release as failed, budget spent.
A synthesis run is claimed at most ``MAX_SYNTHESIZE_ATTEMPTS`` times; the claim after that
ends the run as failed (the measurements stay, and a re-synthesis's published version
stays served).

While the data directory is low on space (:func:`app.core.disk.space_is_low`) the measure
stage is not claimed: the release stays queued, its reservation kept and nothing read
(:func:`_postpone_measure`), and the sweeper enqueues it again a lease later. A synthesis
is not postponed: it spends nothing, and a write that fails on a full disk ends the run
with its measurements kept, re-synthesised for free once space is freed.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import or_, select
from sqlalchemy.orm import Session, object_session

from app.core import disk
from app.core.db import db_now, on_commit, uses_row_locks
from app.core.errors import (
    InvalidRequest,
    database_unavailable,
    frames_only,
    is_storage_full,
)
from app.core.logs import release_context
from app.core.services import Services
from app.datasets.service import remove_stray_files
from app.ledger import service as ledger
from app.ledger.units import delta_value, epsilon_value
from app.mechanisms.errors import MechanismError, SolverError
from app.models import Dataset, Release, ReleaseMeasurement
from app.models.base import utcnow
from app.models.release import ACTIVE_STATUSES
from app.releases import registry
from app.releases.registry import Measured, Synthesized
from app.releases.service import (
    CANCELLED_AFTER_MEASURING,
    MEASURE_TASK,
    QUEUED,
    SYNTHESIZE_TASK,
    dataset_info,
    end_synthesis_run,
    hand_lease,
    lock_release,
)
from app.storage import tables
from app.storage.artifacts import ArtifactStore
from app.storage.source import EncryptedTableSource

log = logging.getLogger("curator.releases")
WORKER = ledger.Actor.worker()

#: Claims of the measure stage before it gives up (workers died or lost their leases).
MAX_MEASURE_ATTEMPTS = 3
#: Claims of one synthesis run before it gives up (a run that kills its worker, e.g. out
#: of memory, would otherwise be handed to the next worker after every restart).
MAX_SYNTHESIZE_ATTEMPTS = 3
#: Lease periods a stage may ignore a cancel before its heartbeat stops renewing the lease.
CANCEL_GRACE_LEASES = 4
#: a stage's changed progress is published within this many seconds (a renewal, every
#: ``lease_seconds / 4``, publishes it too): a stage of a few seconds shows more than 0 and 1
PROGRESS_SECONDS = 2.0


class LeaseLost(Exception):
    """Another worker took over this stage (our lease expired)."""


class StageCancelled(Exception):
    """The curator cancelled the release while this stage ran."""


def worker_id() -> str:
    """A new lease owner for each claim: host, process and thread for the logs, and a
    random part, so that two workers sharing a hostname and PID (containers given one
    hostname) or a thread re-claiming a release it lost never pass for each other."""
    return (
        f"{socket.gethostname()[:64]}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:12]}"
    )


def describe_failure(exc: BaseException) -> str:
    """A message for the release's status. Mechanism and solver errors never carry data
    values by contract, nor does a request's refusal (an adapter's :class:`InvalidRequest`,
    written for the client: a request recorded before a check was added meets it here);
    anything else is reported by type only (and logged without its message)."""
    if isinstance(exc, MechanismError | SolverError):
        return str(exc)
    if isinstance(exc, InvalidRequest):
        return exc.message
    if is_storage_full(exc):
        return (
            "the service could not write the release's files: its data directory is full "
            "or read-only (the operator's to fix)"
        )
    return f"internal error ({type(exc).__name__}); see the worker log"


#: What a failed synthesis run's message ends with.
KEPT = "the measurements are kept: re-synthesise with other parameters at no privacy cost"


def _log_failure(release_id: uuid.UUID, stage: str, exc: BaseException) -> None:
    failed = type(exc).__name__
    log.error("release %s: %s failed with %s\n%s", release_id, stage, failed, frames_only(exc))


def _log_not_ended(
    release_id: uuid.UUID, stage: str, exc: BaseException, ending: BaseException
) -> None:
    """Log a stage that stopped with ``exc`` and could not be ended (``ending`` raised,
    most often the database being down): the release is not failed. Its claim stays as it
    was until its lease runs out (the heartbeat has stopped); then the sweeper enqueues the
    stage again, and a worker claims it afresh (one of its ``MAX_*_ATTEMPTS``). It was
    logged as an error, "<stage> failed", for a failure that was never recorded."""
    log.warning(
        "release %s: %s stopped with %s and could not be ended (%s); the release is not "
        "failed: the stage is retried once its lease runs out\n%s",
        release_id,
        stage,
        type(exc).__name__,
        type(ending).__name__,
        frames_only(exc),
    )


def _failed(
    release_id: uuid.UUID, stage: str, exc: BaseException, end: Callable[[], bool | None]
) -> bool | None:
    """End a stage that stopped with ``exc`` as failed (``end``), and log it as failed
    when ``end`` did (returned other than False); returns whether it did, or None when
    the database was unavailable to end it: not a failure then, told as a warning
    (:func:`_log_not_ended`), the stage claimed again once its lease runs out. Any other
    error of ``end`` is raised (a bug fails the task)."""
    try:
        ended = end() is not False
    except Exception as ending:
        _log_not_ended(release_id, stage, exc, ending)
        if not database_unavailable(ending):
            raise
        return None
    if ended:
        _log_failure(release_id, stage, exc)
    return ended


@dataclass(frozen=True)
class Claim:
    release_id: uuid.UUID
    owner: str
    mechanism: str
    dataset_id: uuid.UUID
    epsilon: int
    delta: int
    columns: list[str]
    params: dict[str, Any]
    synthesis_params: dict[str, Any]
    synthesis_version: int
    seed: int
    cancel_requested: bool
    #: Earlier claims of this release (for the measure stage: attempts whose worker died
    #: or lost its lease).
    prior_attempts: int = 0
    #: Whether an earlier measure attempt opened the data (``Release.read_started_at``):
    #: only then may a dead attempt have read it.
    read_before: bool = False


def _fail_synthesis(services: Services, claim: Claim, exc: BaseException) -> bool | None:
    """:func:`_failed` for a synthesis run: ended failed, its measurements kept."""
    message = f"{describe_failure(exc)}; {KEPT}"
    end = partial(_end_synthesizing, services, claim, "failed", message)
    return _failed(claim.release_id, "synthesize", exc, end)


def _held(release: Release, now: datetime) -> bool:
    """Whether a worker holds the release's stage under a lease that has not run out."""
    held = release.lease_owner not in (None, QUEUED)
    return held and release.lease_expires_at is not None and release.lease_expires_at > now


#: A release's status message while its measure stage waits for free space.
MEASURE_POSTPONED = (
    "waiting for free space: the service's data directory is low on it; the release keeps "
    "its reservation and is measured once the operator frees some"
)


def _postpone_measure(services: Services, release_id: uuid.UUID) -> bool:
    """Leave a release's measure stage unclaimed while the data directory is low on space
    (:func:`app.core.disk.space_is_low`); returns whether it was left so. A release measured
    then was spent, and failed at synthesis on a full disk. Nothing is read or spent and no
    attempt is counted: the release keeps its reservation, says why it waits (its
    ``message``), and is handed back to the queue for one lease (``lease_owner``
    ``queued``), after which the sweeper enqueues it again (:func:`sweep`). The sweeper, not
    a delayed job, is what retries it: its record is in the database, so neither a lost
    message nor a worker's restart loses it, and a lease apart its jobs cannot busy-loop.

    A release whose curator asked to cancel it is claimed, to be ended (that reads
    nothing); so is one that another worker holds (the claim leaves it alone)."""
    if not disk.space_is_low(services.settings):
        return False
    with services.db.transaction() as session:
        release = lock_release(session, release_id)
        if release is None or release.status not in ("queued", "measuring"):
            return False
        now = db_now(session)
        if _held(release, now) or release.cancel_requested:
            return False
        hand_lease(release, QUEUED, now, timedelta(seconds=services.settings.lease_seconds))
        release.message = MEASURE_POSTPONED
    log.warning(
        "release %s: measure postponed: the data directory has less than %d bytes free "
        "(CURATOR_MIN_FREE_BYTES); nothing read, its reservation kept; the sweeper "
        "enqueues it again once its lease (%g s) runs out",
        release_id,
        services.settings.min_free_bytes,
        services.settings.lease_seconds,
    )
    return True


def _claim(services: Services, release_id: uuid.UUID, stage: str) -> Claim | None:
    """Take the stage's lease if the release is in that stage and nobody alive holds it."""
    allowed = ("queued", "measuring") if stage == "measure" else ("synthesizing",)
    owner = worker_id()
    with services.db.transaction() as session:
        release = lock_release(session, release_id)
        if release is None or release.status not in allowed:
            return None
        now = db_now(session)
        if _held(release, now):
            return None
        release.status = "measuring" if stage == "measure" else "synthesizing"
        hand_lease(release, owner, now, timedelta(seconds=services.settings.lease_seconds))
        prior_attempts = release.attempts
        release.attempts += 1
        release.progress = 0.0
        if release.message == MEASURE_POSTPONED:
            release.message = None  # it waits no longer
        return Claim(
            release_id=release.id,
            owner=owner,
            mechanism=release.mechanism,
            dataset_id=release.dataset_id,
            epsilon=release.epsilon,
            delta=release.delta,
            columns=list(release.columns),
            params=dict(release.params),
            synthesis_params=dict(release.synthesis_params),
            synthesis_version=release.synthesis_version,
            seed=release.seed,
            cancel_requested=release.cancel_requested,
            prior_attempts=prior_attempts,
            read_before=release.read_started_at is not None,
        )


class Heartbeat:
    """Renews a stage's lease every ``lease_seconds / 4`` and publishes its progress, and
    sooner (within :data:`PROGRESS_SECONDS`) when the progress changed; :meth:`check` raises
    if the lease was lost or the release was cancelled."""

    def __init__(self, services: Services, claim: Claim) -> None:
        self.services = services
        self.claim = claim
        self.interval = services.settings.lease_seconds / 4
        self.progress = 0.0
        self.lost = False
        self.cancelled = False
        self._cancel_seen_at: float | None = None
        self._stop = threading.Event()
        # run in a copy of the stage's context: its lines carry the release (app.core.logs)
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._run,),
            name="lease-heartbeat",
            daemon=True,
        )

    def set_progress(self, fraction: float) -> None:
        self.progress = min(max(float(fraction), 0.0), 1.0)
        self.check()

    def check(self) -> None:
        if self.lost:
            raise LeaseLost
        if self.cancelled:
            raise StageCancelled

    def beat(self) -> None:
        with self.services.db.transaction() as session:
            release = lock_release(session, self.claim.release_id)
            if release is None or release.lease_owner != self.claim.owner:
                self.lost = True
                return
            self.cancelled = release.cancel_requested
            if self.cancelled:
                now = time.monotonic()
                self._cancel_seen_at = self._cancel_seen_at or now
                grace = CANCEL_GRACE_LEASES * self.services.settings.lease_seconds
                if now - self._cancel_seen_at > grace:
                    # the stage ignored the cancel (hung after its last progress call):
                    # let the lease run out; the next claim ends the release
                    log.warning("release %s: cancel ignored; lease released", release.id)
                    self.lost = True
                    return
            lease = timedelta(seconds=self.services.settings.lease_seconds)
            hand_lease(release, self.claim.owner, db_now(session), lease)
            release.progress = self.progress

    def _run(self) -> None:
        tick = min(self.interval, PROGRESS_SECONDS)
        last_beat, published = time.monotonic(), self.progress
        while not self._stop.wait(tick):
            if time.monotonic() - last_beat < self.interval and self.progress == published:
                continue
            last_beat, published = time.monotonic(), self.progress
            try:
                self.beat()
            except Exception as exc:  # a missed beat is retried; the lease has slack
                log.warning("heartbeat of %s failed: %s", self.claim.release_id, type(exc).__name__)
            if self.lost:
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


#: The measure stage's progress once its mechanism is done: its measurements are stored
#: next (and the synthesis stage starts again at 0).
MEASURED_PROGRESS = 0.99


class MeasureProgress:
    """The measure stage's progress, never decreasing and at most
    :data:`MEASURED_PROGRESS`: reading the rows (:meth:`rows`, the source's ``on_rows``:
    rows read over stored rows) fills the mechanism's ``read_share`` of it
    (:meth:`~app.releases.registry.Mechanism.measure_read_share`; a second pass adds
    nothing), and the mechanism's work after its first read (:meth:`work`, ``measure``'s
    ``progress``) the rest. Every call goes through :meth:`Heartbeat.set_progress`, which
    raises a cancel or a lost lease. A graph's read (``stored_rows`` None) only checks:
    its row count is its private edge count, which published fractions of whole batches
    would give exactly."""

    def __init__(self, heartbeat: Heartbeat, stored_rows: int | None, read_share: float) -> None:
        self.heartbeat = heartbeat
        self.stored_rows = stored_rows
        self.read_share = min(max(float(read_share), 0.0), 1.0)
        self.value = 0.0

    def rows(self, rows: int) -> None:
        if self.stored_rows is None:
            self.heartbeat.check()
            return
        self._set(self.read_share * min(1.0, rows / max(self.stored_rows, 1)))

    def work(self, fraction: float) -> None:
        done = min(max(float(fraction), 0.0), 1.0)
        self._set(self.read_share + (1.0 - self.read_share) * done)

    def _set(self, value: float) -> None:
        self.value = max(self.value, value)
        self.heartbeat.set_progress(MEASURED_PROGRESS * self.value)


@contextmanager
def _owned(services: Services, claim: Claim, status: str) -> Iterator[Release | None]:
    """A transaction holding the release locked, or None if the claim is no longer ours."""
    with services.db.transaction() as session:
        release = lock_release(session, claim.release_id)
        if release is None or release.lease_owner != claim.owner or release.status != status:
            yield None
        else:
            yield release


def _end_measuring(
    services: Services, claim: Claim, status: str, message: str, *, read: bool
) -> None:
    """Fail or cancel a release whose measurement was not persisted. Nothing of the data
    read (``read=False``): the reservation is refunded. Once rows have been read the
    reservation is spent (a non-DP release gets its ``non_dp`` entry): DESIGN rule 6,
    refund only if nothing was measured, since a refunded failure after reading could
    depend on the data and be repeated for free."""
    with services.db.transaction() as session:
        release = lock_release(session, claim.release_id)
        if release is None or release.lease_owner != claim.owner or release.status != "measuring":
            return
        _settle_unpersisted(session, release, read=read)
        release.status = status
        release.message = message
        release.finished_at = utcnow()
        release.lease_owner = None
        release.lease_expires_at = None


def _settle_unpersisted(session: Session, release: Release, *, read: bool) -> None:
    """Refund (nothing read) or spend (rows read) a release ending without measurements."""
    if ledger.reservation_state(session, release.id) == "reserved":
        if read:
            ledger.commit(session, release.id, WORKER)
        else:
            ledger.refund(session, release.id, WORKER)
    elif read and registry.get(release.mechanism).privacy_kind != "dp":
        ledger.record_non_dp(session, release.dataset_id, release.id, WORKER)


def _outcome(read: bool, mechanism: registry.Mechanism) -> str:
    if mechanism.privacy_kind != "dp":
        return "the data may have been read (a non_dp ledger entry)" if read else "nothing was read"
    return (
        "the data may have been read, so the budget stays spent"
        if read
        else "nothing was read; the budget was refunded"
    )


def _has_read(claim: Claim, source: EncryptedTableSource | None) -> bool:
    """Whether the data may have been read: rows read in this attempt, or an earlier
    attempt of the stage that opened the data (its worker died or lost its lease, possibly
    after reading). An earlier attempt that died before opening it read nothing."""
    return claim.read_before or (source is not None and source.rows_read > 0)


def _start_reading(services: Services, claim: Claim, mechanism: registry.Mechanism) -> bool:
    """Record, in a transaction of its own that commits before the data file is opened,
    that this attempt may read the data (``Release.read_started_at``, set once): if its
    worker dies, the next attempt knows the data may have been read. A cancel requested
    since the claim stops the attempt here, before the file is opened. Returns False,
    nothing recorded, for a release that is not differentially private whose curator has
    withdrawn the dataset's opt-in: read here under the dataset's lock, which the
    opt-out's update takes, so one committed before this transaction is seen (read in an
    earlier one, an opt-out from an API process in between was not)."""
    with _owned(services, claim, "measuring") as release:
        if release is None:
            raise LeaseLost
        if release.cancel_requested:  # since the claim: nothing of it read yet
            raise StageCancelled
        if mechanism.privacy_kind == "non_dp":
            dataset = ledger.lock_dataset(_session_of(release), claim.dataset_id)
            if not dataset.allow_non_dp_releases:
                return False
        if release.read_started_at is None:
            release.read_started_at = utcnow()
    return True


def run_measure(services: Services, release_id: uuid.UUID) -> None:
    """The measure stage of ``release_id``; its log lines carry the release's id and the
    stage's name (:func:`app.core.logs.release_context`)."""
    with release_context(release_id, "measure"):
        _measure(services, release_id)


def _measure(services: Services, release_id: uuid.UUID) -> None:
    if _postpone_measure(services, release_id):
        return
    claim = _claim(services, release_id, "measure")
    if claim is None:
        return
    mechanism = registry.get(claim.mechanism)
    if claim.cancel_requested:
        read = _has_read(claim, None)
        message = (
            f"cancelled while measuring; {_outcome(read, mechanism)}"
            if read
            else "cancelled before measuring; refunded"
        )
        _end_measuring(services, claim, "cancelled", message, read=read)
        return
    if claim.prior_attempts >= MAX_MEASURE_ATTEMPTS:
        # a stage that keeps dying is not retried for ever, each retry reading the data
        # again (spent if any attempt opened the data)
        read = _has_read(claim, None)
        _end_measuring(
            services,
            claim,
            "failed",
            f"the measure stage was attempted {claim.prior_attempts} times (its workers died "
            f"or lost their leases); {_outcome(read, mechanism)}",
            read=read,
        )
        return
    source: EncryptedTableSource | None = None
    try:
        with services.db.transaction() as session:
            dataset = session.get(Dataset, claim.dataset_id)
            assert dataset is not None
            info = dataset_info(dataset, mechanism, claim.columns)
            path = services.settings.datasets_dir / dataset.storage_name
            file_keys = dataset.file_keys
            stored_rows = dataset.n_rows
            # Progress is rows read over stored rows. A graph's row count is its edge
            # count, which is private: published fractions of whole batches would give it
            # exactly, so a graph's read only checks for a cancel or a lost lease.
            count_rows = dataset.kind != "graph"
        # the curator's opt-in is read again (by _start_reading): one withdrawn while the
        # release waited (or was being recorded) must not let a worker read the data for it
        if not _start_reading(services, claim, mechanism):
            read = _has_read(claim, None)
            _end_measuring(
                services,
                claim,
                "failed",
                "the curator withdrew the dataset's opt-in to releases that are not "
                f"differentially private before it was measured; {_outcome(read, mechanism)}",
                read=read,
            )
            return
        eps_value, delta_value_ = epsilon_value(claim.epsilon), delta_value(claim.delta)
        with Heartbeat(services, claim) as heartbeat:
            params = mechanism.parse_params(claim.params)
            progress = MeasureProgress(
                heartbeat,
                stored_rows if count_rows else None,
                mechanism.measure_read_share(info, eps_value, delta_value_, params),
            )
            source = EncryptedTableSource(
                path,
                tables.file_ring(services.data_key, file_keys),
                info.names,
                stored_rows,
                on_rows=progress.rows,
                reopen_key=lambda: _file_ring(services, claim.dataset_id),
            )
            measured = mechanism.measure(
                source, info, eps_value, delta_value_, params, progress=progress.work
            )
            if not measured.privacy_cost.within(eps_value, delta_value_):
                raise RuntimeError("the mechanism's privacy cost exceeds the reservation")
            if heartbeat.lost:  # a cancel is handled where the finished measurement is kept
                raise LeaseLost
            # under the heartbeat, which keeps the lease while a store is retried
            _persist_retrying(services, claim, mechanism, measured)
    except LeaseLost:
        log.warning("release %s: lease lost while measuring; work discarded", release_id)
    except StageCancelled:
        read = _has_read(claim, source)
        _end_measuring(
            services,
            claim,
            "cancelled",
            f"cancelled while measuring; {_outcome(read, mechanism)}",
            read=read,
        )
    except Exception as exc:
        # also a failure to store a complete measurement: it ends the release (spent,
        # since the data were read) rather than leaving it to retries that read the
        # data again and draw fresh noise
        read = _has_read(claim, source)
        message = f"{describe_failure(exc)}; {_outcome(read, mechanism)}"
        _failed(
            release_id,
            "measure",
            exc,
            lambda: _end_measuring(services, claim, "failed", message, read=read),
        )


#: How long, in leases, the measure stage retries storing a finished measurement through
#: errors of the database's connection (a restart, a failover, a dropped connection, a
#: SQLite lock held past its busy timeout) before the release ends failed and spent.
PERSIST_RETRY_LEASES = 2
#: The first wait between two tries (it doubles, up to :data:`PERSIST_RETRY_MAX_DELAY`).
PERSIST_RETRY_DELAY = 0.5
PERSIST_RETRY_MAX_DELAY = 8.0


def _persist_retrying(
    services: Services, claim: Claim, mechanism: registry.Mechanism, measured: Measured
) -> None:
    """:func:`_persist_measurement`, tried again with the same measurement (never a fresh
    draw) while it fails on the database's connection, for up to
    :data:`PERSIST_RETRY_LEASES` leases. One dropped connection in its transaction ended
    the release failed and spent, its complete measurement thrown away (DESIGN rule 6
    spends a release that read the data), and every request retried by its curator spent
    the same epsilon again while the database was unsteady."""
    deadline = time.monotonic() + PERSIST_RETRY_LEASES * services.settings.lease_seconds
    delay = PERSIST_RETRY_DELAY
    while True:
        try:
            _persist_measurement(services, claim, mechanism, measured)
            return
        except Exception as exc:
            # the connection's error, not the statement's (which fails every time)
            if not database_unavailable(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning(
                "release %s: storing the measurement failed (%s); retrying in %.1f s",
                claim.release_id,
                type(exc).__name__,
                delay,
            )
        time.sleep(delay)
        delay = min(2 * delay, PERSIST_RETRY_MAX_DELAY)


def _persist_measurement(
    services: Services, claim: Claim, mechanism: registry.Mechanism, measured: Measured
) -> None:
    """Store the noisy measurements, turn the reservation into a spend and hand the release
    to the synthesis stage, in one transaction (or, if the curator cancelled meanwhile,
    keep the measurements and end the release)."""
    with _owned(services, claim, "measuring") as release:
        if release is None:
            raise LeaseLost
        session = _session_of(release)
        now = db_now(session)
        session.add(ReleaseMeasurement(release_id=release.id, payload=measured.payload))
        if mechanism.privacy_kind == "dp":
            ledger.commit(session, release.id, WORKER)
        else:
            ledger.record_non_dp(session, release.dataset_id, release.id, WORKER)
        release.measured_at = now
        release.resolved = measured.resolved
        release.privacy_cost = measured.privacy_cost.as_dict()
        if release.cancel_requested:
            # measured in full: spent, and kept so that a re-synthesis can reach the output
            release.status = "cancelled"
            release.message = CANCELLED_AFTER_MEASURING
            release.finished_at = now
            release.lease_owner = None
            release.lease_expires_at = None
            return
        release.status = "synthesizing"
        release.progress = 0.0
        release.attempts = 0  # from here on, claims of the synthesis run
        hand_lease(release, QUEUED, now, timedelta(seconds=services.settings.lease_seconds))
        enqueue_after_commit(session, services, SYNTHESIZE_TASK, release.id)


def _session_of(release: Release) -> Session:
    session = object_session(release)
    assert session is not None
    return session


def enqueue_after_commit(
    session: Session, services: Services, task: str, release_id: uuid.UUID
) -> None:
    key = str(release_id)
    on_commit(session, lambda: services.queue.enqueue(task, key))


def run_synthesize(services: Services, release_id: uuid.UUID) -> None:
    """The synthesis stage of ``release_id``, logged as :func:`run_measure` is."""
    with release_context(release_id, "synthesize"):
        _synthesize(services, release_id)


def _synthesize(services: Services, release_id: uuid.UUID) -> None:
    claim = _claim(services, release_id, "synthesize")
    if claim is None:
        return
    store = ArtifactStore(services.settings.releases_dir)
    with services.db.transaction() as session:
        measurement = session.get(ReleaseMeasurement, claim.release_id)
        dataset = session.get(Dataset, claim.dataset_id)
        assert dataset is not None
        mechanism = registry.get(claim.mechanism)
        info = dataset_info(dataset, mechanism, claim.columns)
        payload = measurement.payload if measurement is not None else None
    if claim.cancel_requested:
        _end_synthesizing(services, claim, "cancelled", CANCELLED_AFTER_MEASURING)
        return
    if payload is None:
        _end_synthesizing(services, claim, "failed", "no stored measurements to synthesise from")
        return
    if claim.prior_attempts >= MAX_SYNTHESIZE_ATTEMPTS:
        _end_synthesizing(
            services,
            claim,
            "failed",
            f"the synthesis was attempted {claim.prior_attempts} times (its workers died or "
            "lost their leases, e.g. out of memory); the measurements are kept: re-synthesise "
            "with other parameters at no privacy cost",
        )
        return
    version = claim.synthesis_version
    rng = np.random.default_rng(np.random.SeedSequence([claim.seed, version]))
    try:
        with _owned(services, claim, "synthesizing") as release:
            # begun under the lock, as the lease's holder: ``begin`` removes the run's other
            # temporary directories, and a claim whose lease ran out since (its worker held
            # up) would remove the work of the run's new owner
            work = None if release is None else store.begin(claim.release_id, version)
    except OSError as exc:
        # a data directory that is read-only (or full, out of inodes): the run ends now,
        # where it escaped and was claimed again until its attempts ran out, then
        # blamed on workers that died
        _fail_synthesis(services, claim, exc)
        return
    if work is None:  # logged once the lock is let go (it reads the release again)
        _log_not_ours(services, claim, "before synthesizing; nothing done")
        return
    try:
        with Heartbeat(services, claim) as heartbeat:
            params = mechanism.parse_params({**claim.params, **claim.synthesis_params})
            synthesized = mechanism.synthesize(
                payload, info, params, rng, work, heartbeat.set_progress
            )
            heartbeat.check()
        _publish_synthesis(services, claim, store, work, synthesized)
    except LeaseLost:
        store.discard(work)
    except StageCancelled:
        store.discard(work)
        _end_synthesizing(services, claim, "cancelled", CANCELLED_AFTER_MEASURING)
    except Exception as exc:
        # also a failure to store the finished synthesis (it escaped, and the sweeper
        # retried it without end)
        store.discard(work)
        if _fail_synthesis(services, claim, exc) is False:
            # the run was cancelled or handed to another worker meanwhile, and its work
            # directory removed (by the sweeper, or the run's new owner): not a failure
            log.warning(
                "release %s: lease lost while synthesizing (%s); work discarded",
                release_id,
                type(exc).__name__,
            )


def _log_not_ours(services: Services, claim: Claim, what: str) -> None:
    """Log why a stage found its claim no longer its own: a curator's cancel since the
    claim (at the info level: nothing went wrong; it was logged as a lost lease, which
    operators read as a fault) or a lease that ran out and went to another worker (a
    warning: this worker was held up)."""
    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, claim.release_id)
        cancelled = release is not None and release.cancel_requested
    if cancelled:
        log.info("release %s: cancelled %s", claim.release_id, what)
    else:
        log.warning("release %s: lease lost %s", claim.release_id, what)


def _end_synthesizing(services: Services, claim: Claim, status: str, message: str) -> bool:
    """Fail or cancel a synthesis this claim still owns (no ledger entry: the measurements
    were spent when they were stored; :func:`end_synthesis_run`); returns whether it did.
    The run's version is never published then: a directory of it on disk (moved into
    place by a publish whose transaction then failed) is removed once this commits."""
    with _owned(services, claim, "synthesizing") as release:
        if release is None:
            return False
        end_synthesis_run(release, status, message)
        store = ArtifactStore(services.settings.releases_dir)
        unpublished = store.version_dir(claim.release_id, claim.synthesis_version)
        on_commit(_session_of(release), lambda: store.discard(unpublished))
        return True


def _publish_synthesis(
    services: Services, claim: Claim, store: ArtifactStore, work: Path, synthesized: Synthesized
) -> None:
    """Move the artifacts into place and mark the release succeeded, in one transaction.
    Once it commits, earlier versions are pruned but the one it replaces: a download or an
    answer that read that version just before has yet to open its files (the next publish
    removes it)."""
    version = claim.synthesis_version
    with _owned(services, claim, "synthesizing") as release:
        if release is None:
            raise LeaseLost
        replaced = release.published_version
        store.publish(claim.release_id, version, work)
        release.status = "succeeded"
        release.progress = 1.0
        release.message = None
        release.published_version = version
        release.files_deleted_at = None
        release.published_synthesis_params = dict(claim.synthesis_params)
        release.artifacts = {
            name: {"file": a.file, "media_type": a.media_type, "description": a.description}
            for name, a in synthesized.artifacts.items()
        }
        release.resolved = {**release.resolved, "synthesis": synthesized.summary}
        release.finished_at = utcnow()
        release.lease_owner = None
        release.lease_expires_at = None
        kept = (version,) if replaced is None else (version, replaced)
        # what the release holds once the versions but these are pruned (after commit)
        release.stored_bytes = store.disk_bytes(claim.release_id, *kept)
        on_commit(_session_of(release), lambda: store.prune(claim.release_id, *kept))


def _file_ring(services: Services, dataset_id: uuid.UUID) -> bytes:
    """What the dataset's file opens with now (:func:`app.storage.tables.file_ring`), read
    again: a key rotation replaced the file since the measure stage read its keys."""
    with services.db.transaction(read_only=True) as session:
        file_keys = session.scalar(select(Dataset.file_keys).where(Dataset.id == dataset_id))
    return tables.file_ring(services.data_key, file_keys)


#: The longest wait, in leases, before a release that no worker has claimed since it was
#: enqueued is enqueued again (:func:`sweep`).
MAX_QUEUED_LEASES = 16


def sweep(services: Services) -> int:
    """Re-enqueue every active release whose lease expired (a dead worker, or an enqueue
    lost between commit and queue, or one Redis did not take). Returns how many it
    re-enqueued (whose leases it renewed: an enqueue Redis does not take is made again at
    the next expiry).

    A release that no worker has claimed since it was enqueued (``lease_owner`` is
    ``queued``) is most often waiting behind busy workers, not lost: each time it is
    enqueued again its next wait doubles, from one lease up to :data:`MAX_QUEUED_LEASES`
    (its last wait is ``lease_expires_at - updated_at``, both set by the last enqueue).
    Behind an hour of work a release is enqueued about 6 times, not 60 (each extra job
    finds it claimed and does nothing, but they filled the queue); an enqueue that was
    really lost is made good within 16 leases at worst. Not while the queue is known
    unreachable (its last enqueue or read failed): nothing waits behind workers then, and
    a wait doubled through an outage would keep each release waiting up to 16 leases more
    once Redis is back; each is given one lease, as its first.

    A lease that ends further ahead than any lease is given (:data:`MAX_QUEUED_LEASES`
    leases) was set before the clock it is read by went back (an NTP step back, a host
    that ran ahead and was corrected; or under a longer ``CURATOR_LEASE_SECONDS``): it is
    shortened to one lease from now, its owner kept (:func:`_clamp_lease`). "Now" is read
    once the rows are locked: a back-off another sweeper gave since this one first read
    the clock (on SQLite, while it waited for the write lock) is 16 leases from a later
    reading, and is not shortened. Left as it was, the stage of a worker that died before
    the step was recovered only once the clock caught up again, the whole step later
    (years, for a host booted with its clock years ahead): its release stayed measuring,
    its reservation held, a cancel never ended, and its dataset's data could not be
    deleted (:func:`app.datasets.service.delete_data` waits for it)."""
    lease = timedelta(seconds=services.settings.lease_seconds)
    reachability = services.queue.reachability
    queue_down = reachability is not None and not reachability.reachable
    requeued = 0
    with services.db.transaction() as session:
        seen = db_now(session)
        stmt = select(Release).where(
            Release.status.in_(ACTIVE_STATUSES),
            or_(
                Release.lease_expires_at.is_(None),
                Release.lease_expires_at < seen,
                Release.lease_expires_at > seen + MAX_QUEUED_LEASES * lease,
            ),
        )
        if uses_row_locks(session):
            stmt = stmt.with_for_update(skip_locked=True)
        releases = session.scalars(stmt).all()
        # read again once the rows are locked (SQLite: the write lock taken by the select,
        # up to its 30 s busy timeout after ``seen``): a lease committed meanwhile was
        # given from a later clock reading, and a back-off of 16 leases given then ends
        # further ahead of ``seen`` than any lease is given, but not of ``now``
        now = db_now(session)
        latest = now + MAX_QUEUED_LEASES * lease
        for release in releases:
            if release.lease_expires_at is not None and release.lease_expires_at > latest:
                _clamp_lease(release, now, lease)
                continue
            if release.lease_expires_at is not None and release.lease_expires_at >= seen:
                continue  # a back-off another sweeper gave since ``seen``: not run out
            wait = lease
            queued = release.lease_owner == QUEUED and not queue_down
            if queued and release.lease_expires_at is not None:
                waited = release.lease_expires_at - release.updated_at
                wait = min(max(lease, 2 * waited), MAX_QUEUED_LEASES * lease)
            hand_lease(release, QUEUED, now, wait)
            task = SYNTHESIZE_TASK if release.status == "synthesizing" else MEASURE_TASK
            # said once it is so: a sweep whose transaction fails (the database locked or
            # full) re-enqueued nothing, and logged each release as re-enqueued; nor is it
            # said of a release whose enqueue Redis did not take (Queue.enqueue told that
            # once; the release is swept again when its new lease runs out)
            on_commit(session, partial(_requeue, services, task, release.id, release.status))
            requeued += 1
    return requeued


def _clamp_lease(release: Release, now: datetime, lease: timedelta) -> None:
    """Give a lease set before the clock went back (:func:`sweep`) one lease from ``now``,
    its owner kept: a live holder renews it at its next beat and keeps its stage (no work
    lost), a dead one's runs out a lease later and is swept then. A holder still running
    with a ``CURATOR_LEASE_SECONDS`` more than 16 times this process's beats only every
    quarter of its own, longer lease: its stage is handed over before it renews, its work
    lost (every process must run with the same value)."""
    assert release.lease_expires_at is not None
    ahead = release.lease_expires_at - now
    log.warning(
        "release %s: its lease ended %.0f s ahead, more than any lease is given: the "
        "clock went back since it was set (or CURATOR_LEASE_SECONDS was lowered); "
        "shortened to one lease (%g s)",
        release.id,
        ahead.total_seconds(),
        lease.total_seconds(),
    )
    hand_lease(release, release.lease_owner or QUEUED, now, lease)


def _requeue(services: Services, task: str, release_id: uuid.UUID, status: str) -> None:
    if services.queue.enqueue(task, str(release_id)):
        log.info("release %s: lease expired in %s; re-enqueued", release_id, status)


def remove_stale_work(session: Session, services: Services, *, legacy: bool = False) -> int:
    """Remove the temporary directories of synthesis runs that are over, and what removals
    cut short left. A worker killed in a run leaves its ``.tmp-v<N>-*`` directory, which
    the next claim of that run removes (:meth:`ArtifactStore.begin`); a run that is not
    claimed again (the curator cancelled it, or it was given up) left it for ever. A
    directory is stale when its release is not synthesising that version; versions only
    grow, so such a run never resumes. The directories are listed before the releases are
    read, so a run that begins meanwhile is never among them. A ``.trash-*`` directory (a
    version or a run's work renamed out of the way, whose deletion a dead process cut
    short) went only with that release's next prune, so a release never re-synthesised
    kept it. Returns how many directories were removed.

    The listing is of the store's work directory only (:data:`app.storage.artifacts.WORK_DIR`:
    the runs going on and what dead processes left), and the releases read are those
    synthesising, so a pass costs the live work, not the history; with ``legacy`` (the
    sweeper's first pass after a start) every release's directory is listed too, for what
    releases stored before that directory left beside their versions, and the versions a
    deletion of a release's files left when its process died (:func:`_remove_deleted_files`)."""
    store = ArtifactStore(services.settings.releases_dir)
    candidates, trash = store.leftovers(legacy=legacy)
    for leftover in trash:
        store.discard(leftover)
        log.warning("removed %s, left by a removal that was cut short", leftover.name)
    deleted = _remove_deleted_files(session, store) if legacy else 0
    if not candidates:
        return len(trash) + deleted
    running = {
        (release_id, version)
        for release_id, version in session.execute(
            select(Release.id, Release.synthesis_version).where(Release.status == "synthesizing")
        )
    }
    stale = [
        work for release_id, version, work in candidates if (release_id, version) not in running
    ]
    for work in stale:
        store.discard(work)
        log.warning("removed the work directory %s of a synthesis run that is over", work.name)
    return len(trash) + deleted + len(stale)


def _remove_deleted_files(session: Session, store: ArtifactStore) -> int:
    """Remove the versions of releases whose files their curator deleted
    (:func:`app.releases.service.delete_files`) that are still on disk: the deletion
    removes them once its transaction commits, so a process that died in between left
    them, unserved. Versions ``v0`` to the ``synthesis_version`` read here: a re-synthesis
    that began since writes a higher one. Of a release read re-synthesising, to the one
    before: its run writes that version, and may move it into place and commit its publish
    while this pass goes through the releases (it removed the version just published,
    leaving ``published_version`` naming files that were gone). Returns how many versions
    were removed."""
    removed = 0
    deleted = session.execute(
        select(Release.id, Release.synthesis_version, Release.status).where(
            Release.files_deleted_at.is_not(None), Release.published_version.is_(None)
        )
    )
    for release_id, version, status in deleted:
        through = version - 1 if status in ACTIVE_STATUSES else version
        count = store.remove_versions(release_id, through)
        if count:
            log.warning(
                "removed %d version(s) of release %s, whose files its curator deleted",
                count,
                release_id,
            )
        removed += count
    return removed


def fill_stored_bytes(services: Services) -> int:
    """Record ``stored_bytes`` of the releases published before it was recorded (migration
    0014 gave them 0; a migration does not see the data directory): each counted 0 toward
    its curator's ``CURATOR_MAX_CURATOR_BYTES``, so an upgraded installation's quota
    under-counted what it stores. What is counted is what a publish counts
    (:func:`_publish_synthesis`): the files of the published version and of the one it
    replaced, kept beside it until the next publish; that is, the versions on disk up to
    the published one (a later one is an unpublished run's, removed when its run ends).
    Returns how many releases it filled.

    The sweeper's first pass after a start runs it (:class:`Sweeper`). Releases are listed
    in one query (``published_version`` set and ``stored_bytes`` 0); each is then filled in
    a transaction of its own holding its lock, in which it is read again: one published
    meanwhile (whose publish set its own count) or whose files were withdrawn
    (``published_version`` None) is left as it is. Filled once, a release is not listed
    again, so a pass with nothing to fill costs that query. A release with no version on
    disk (its files lost, or removed by hand) counts 0 and stays listed; it is skipped
    without a transaction (there is nothing to record, and a publish meanwhile records its
    own count): each of 10^4 such releases took a write transaction at every start, 9-13 s
    of the sweeper's first pass on SQLite and 20-24 s on PostgreSQL, with no sweep
    meanwhile; skipped, 0.5 s on both."""
    store = ArtifactStore(services.settings.releases_dir)
    filled = 0
    for release_id in _unfilled(services):
        if not store.versions(release_id):
            continue
        with services.db.transaction() as session:
            release = lock_release(session, release_id)
            if release is None or release.published_version is None or release.stored_bytes:
                continue
            published = release.published_version
            kept = [version for version in store.versions(release_id) if version <= published]
            release.stored_bytes = store.disk_bytes(release_id, *kept)
            filled += release.stored_bytes > 0
    if filled:
        log.info("recorded the stored bytes of %d releases published before they were", filled)
    return filled


def _unfilled(services: Services) -> list[uuid.UUID]:
    """The releases :func:`fill_stored_bytes` has to fill, as they were when it looked."""
    with services.db.transaction(read_only=True) as session:
        return list(
            session.scalars(
                select(Release.id).where(
                    Release.published_version.is_not(None), Release.stored_bytes == 0
                )
            )
        )


#: Database connections a running stage holds at once at most: its own transaction's
#: and its heartbeat's (:meth:`Heartbeat.beat`, from a thread of its own). A stage never
#: opens a transaction inside another.
STAGE_CONNECTIONS = 2
#: The sweeper's: one transaction at a time.
SWEEPER_CONNECTIONS = 1


def worker_connections(threads: int) -> int:
    """The most database connections a worker of ``threads`` stage threads (and its
    sweeper) holds at once: its pool's size (``curator worker``, and added to the API's by
    ``curator serve``'s embedded worker)."""
    return threads * STAGE_CONNECTIONS + SWEEPER_CONNECTIONS


class Sweeper:
    """Runs :func:`sweep`, :func:`remove_stale_work` and
    :func:`app.datasets.service.remove_stray_files` at start and every ``lease_seconds / 2``
    in a daemon thread. Its first pass also lists every release's directory
    (``remove_stale_work(legacy=True)``): one listing per release ever published, once a
    start, not every pass; and records the stored bytes of releases published before
    they were (:func:`fill_stored_bytes`). A first pass that fails is made again."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="release-sweeper", daemon=True)

    def _run(self) -> None:
        interval = self.services.settings.lease_seconds / 2
        legacy = True
        while True:
            try:
                sweep(self.services)
                with self.services.db.transaction(read_only=True) as session:
                    remove_stray_files(session, self.services)
                    remove_stale_work(session, self.services, legacy=legacy)
                if legacy:
                    fill_stored_bytes(self.services)
                legacy = False
            except Exception as exc:
                log.warning("sweep failed: %s", type(exc).__name__)
            if self._stop.wait(interval):
                return

    def start(self) -> Sweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
