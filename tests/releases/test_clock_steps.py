"""A release's stages across a step of the clock that times its leases.

The leases are timed by the database's clock (:func:`app.core.db.db_now`): the SQLite
host's own, PostgreSQL's ``clock_timestamp()``. An NTP step, a VM resumed after hours or
a host whose clock was set wrong then corrected moves it at once. Here it is moved (the
``db_now`` the stages and the release service read, and on the one SQLite host every
``utcnow`` too) while a stage holds its lease, and the sweeper runs: the privacy rules
hold (one stored measurement, one spend, a refund only when nothing was read), a step
forward costs a stage its work, and a step back keeps no stage held for the step's
length (``bench/results/clock_audit.md``).
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

import tests.releases.fake_mechanism as fake  # registers test_means
from app.core import db
from app.core.services import Services
from app.models import Release, ReleaseMeasurement
from app.models.base import utcnow
from app.releases import stages
from app.releases.registry import Measured
from app.releases.service import QUEUED
from app.releases.stages import MAX_QUEUED_LEASES, run_measure, run_synthesize, sweep
from app.storage.artifacts import ArtifactStore
from tests.conftest import Caller
from tests.releases.helpers import budget, dataset, request_release, services_of

STEP = timedelta(hours=2)
#: The clock functions as the service defines them (a test replaces their imports).
REAL_DB_NOW, REAL_UTCNOW = db.db_now, utcnow


@dataclass
class Clock:
    """The database's clock, moved by ``offset`` from the real one."""

    offset: timedelta = timedelta(0)

    def db_now(self, session: Session) -> datetime:
        return REAL_DB_NOW(session) + self.offset

    def utcnow(self) -> datetime:
        return datetime.now(UTC) + self.offset


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The clock the leases are read by, to be stepped (``offset``): the ``db_now`` every
    ``app`` module imported, and every ``utcnow`` (the SQLite host's clock is the
    database's; on PostgreSQL the hosts' clocks time no lease)."""
    moved = Clock()
    for name, module in list(sys.modules.items()):
        if not name.startswith("app."):
            continue
        if getattr(module, "db_now", None) is REAL_DB_NOW:
            monkeypatch.setattr(module, "db_now", moved.db_now)
        if getattr(module, "utcnow", None) is REAL_UTCNOW:
            monkeypatch.setattr(module, "utcnow", moved.utcnow)
    # no beat of a stage's heartbeat while a test steps the clock and sweeps (its first
    # renewal is lease_seconds / 4 = 15 s away, and so is its first progress)
    monkeypatch.setattr(stages, "PROGRESS_SECONDS", 600.0)
    return moved


def _release(client: TestClient, release_id: str) -> Release:
    with services_of(client).db.transaction(read_only=True) as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        return release


def _lease_left(services: Services, clock: Clock, release: Release) -> timedelta:
    assert release.lease_expires_at is not None
    with services.db.transaction(read_only=True) as session:
        return release.lease_expires_at - clock.db_now(session)


def _entries(client: TestClient, curator: Caller, dataset_id: str, release_id: str) -> list[str]:
    entries = budget(client, curator, dataset_id)["entries"]
    return [e["kind"] for e in entries if e["release_id"] == release_id]


def _measurements(client: TestClient, release_id: str) -> int:
    with services_of(client).db.transaction(read_only=True) as session:
        return int(session.get(ReleaseMeasurement, uuid.UUID(release_id)) is not None)


def _in_measure(monkeypatch: pytest.MonkeyPatch, then: Any) -> list[Any]:
    """Run ``then()`` once, in the first measurement, after its rows are read; returns
    what it returned, in a list."""
    measure = fake.TestMeans.measure
    done: list[Any] = []

    def measure_then(self: fake.TestMeans, *args: Any, **kwargs: Any) -> Measured:
        measured = measure(self, *args, **kwargs)
        if not done:
            done.append(then())
        return measured

    monkeypatch.setattr(fake.TestMeans, "measure", measure_then)
    return done


def test_a_dead_workers_stage_is_recovered_a_lease_after_the_clock_went_back(
    client: TestClient, curator: Caller, clock: Clock
) -> None:
    """A worker claims the measure stage and dies before opening the data; the clock then
    goes back 2 hours and the curator cancels. Its lease, set before the step, ended 2
    hours ahead of the clock: the sweeper left it, so the release stayed measuring for 2
    hours (its reservation held, the cancel not done, its dataset's data not deletable).
    The sweeper now gives it one lease from now, its owner kept; once that runs out the
    release is re-enqueued and the next claim ends it, refunded (nothing was read)."""
    services = services_of(client)
    lease = timedelta(seconds=services.settings.lease_seconds)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    dead = stages._claim(services, uuid.UUID(release_id), "measure")
    assert dead is not None
    clock.offset = -STEP
    cancelled = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
    assert cancelled.json()["cancel_requested"] is True

    assert sweep(services) == 0  # the holder may be alive: not taken from it yet
    held = _release(client, release_id)
    assert held.lease_owner == dead.owner
    assert timedelta(0) < _lease_left(services, clock, held) <= lease

    clock.offset = -STEP + lease + timedelta(seconds=1)
    assert sweep(services) == 1
    assert _release(client, release_id).lease_owner == QUEUED
    run_measure(services, uuid.UUID(release_id))
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "cancelled"
    assert final["message"] == "cancelled before measuring; refunded"
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "refund"]


def test_a_live_stage_keeps_its_lease_and_its_work_across_the_clock_going_back(
    client: TestClient, curator: Caller, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock goes back 2 hours while the measure stage runs and the sweeper runs: the
    lease is shortened, not taken over (the owner is kept), and the stage stores its
    measurement, spent once, in its one attempt."""
    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]

    def step_back_and_sweep() -> tuple[int, str | None]:
        clock.offset = -STEP
        swept = sweep(services)
        return swept, _release(client, release_id).lease_owner

    seen = _in_measure(monkeypatch, step_back_and_sweep)
    run_measure(services, uuid.UUID(release_id))
    [(swept, owner)] = seen
    assert swept == 0
    assert owner not in (None, QUEUED)
    release = _release(client, release_id)
    # measured in its first attempt (the count restarts at 0 for the synthesis's claims)
    assert (release.status, release.attempts, release.lease_owner) == ("synthesizing", 0, QUEUED)
    assert _measurements(client, release_id) == 1
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]


def test_a_clock_step_forward_in_a_measure_costs_its_work_not_the_privacy_rules(
    client: TestClient, curator: Caller, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock steps 2 hours forward while the measure stage runs, after its rows were
    read, and the sweeper runs before its heartbeat renews: every lease looks run out, so
    the stage is handed to the queue. The attempt stores nothing and settles nothing (its
    noise is never seen); the next claim, knowing the data were opened, reads them again
    and stores the one measurement, spent once."""
    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]

    def step_forward_and_sweep() -> int:
        clock.offset = STEP
        return sweep(services)

    swept = _in_measure(monkeypatch, step_forward_and_sweep)
    run_measure(services, uuid.UUID(release_id))
    assert swept == [1]
    taken = _release(client, release_id)
    assert (taken.status, taken.lease_owner, taken.attempts) == ("measuring", QUEUED, 1)
    assert taken.read_started_at is not None
    assert _measurements(client, release_id) == 0
    assert _entries(client, curator, dataset_id, release_id) == ["reserve"]

    run_measure(services, uuid.UUID(release_id))
    assert _release(client, release_id).status == "synthesizing"
    assert _measurements(client, release_id) == 1
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]


def test_a_clock_step_forward_in_a_synthesis_redoes_it_to_the_same_files(
    client: TestClient, curator: Caller, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock steps 2 hours forward while a synthesis runs and the sweeper hands the
    run to the queue: the run's files are discarded unpublished, and the next claim
    synthesises from the same stored measurement with the same seed, to the same files
    (nothing drawn afresh, nothing spent)."""
    services = services_of(client)
    dataset_id = dataset(client, curator)
    release_id = request_release(client, curator, dataset_id).json()["id"]
    run_measure(services, uuid.UUID(release_id))
    synthesize = fake.TestMeans.synthesize
    first: list[bytes] = []

    def synthesize_then_step(self: fake.TestMeans, *args: Any) -> Any:
        synthesized = synthesize(self, *args)
        if not first:
            first.append((args[4] / "sample.csv").read_bytes())  # the run's workdir
            clock.offset = STEP
            assert sweep(services) == 1
        return synthesized

    monkeypatch.setattr(fake.TestMeans, "synthesize", synthesize_then_step)
    run_synthesize(services, uuid.UUID(release_id))
    taken = _release(client, release_id)
    assert (taken.status, taken.lease_owner, taken.published_version) == (
        "synthesizing",
        QUEUED,
        None,
    )
    run_synthesize(services, uuid.UUID(release_id))
    release = _release(client, release_id)
    assert (release.status, release.published_version) == ("succeeded", 0)
    store = ArtifactStore(services.settings.releases_dir)
    published = store.version_dir(uuid.UUID(release_id), 0) / "sample.csv"
    assert published.read_bytes() == first[0]
    assert _entries(client, curator, dataset_id, release_id) == ["reserve", "commit"]


def test_a_back_off_given_by_a_sweep_since_another_read_the_clock_is_not_shortened(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers' sweepers: one reads the clock, then (before its rows are locked; on
    SQLite while it waits for the write lock) the other enqueues a release again and
    backs it off the longest wait, 16 leases from its own, later reading. Measured from
    the first one's reading that lease ends further ahead than any is given: it was
    taken for a clock that went back and shortened to one lease (a warning, the back-off
    lost). It is measured from a reading taken once the rows are locked."""
    services = services_of(client)
    lease = timedelta(seconds=services.settings.lease_seconds)
    dataset_id = dataset(client, curator)
    release_id = uuid.UUID(request_release(client, curator, dataset_id).json()["id"])
    with services.db.transaction() as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert release.lease_owner == QUEUED
        # waited 8 leases since its last enqueue, and that ran out: next wait, 16 leases
        release.lease_expires_at = REAL_DB_NOW(session) - timedelta(seconds=1)
        release.updated_at = release.lease_expires_at - 8 * lease
    other: list[int] = []

    def then_the_other_sweeps(session: Session) -> datetime:
        seen = REAL_DB_NOW(session)
        if not other:
            other.append(0)
            other[0] = sweep(services)
        return seen

    monkeypatch.setattr(stages, "db_now", then_the_other_sweeps)
    assert sweep(services) == 0
    assert other == [1]
    backed_off = _release(client, str(release_id))
    assert backed_off.lease_owner == QUEUED
    assert backed_off.lease_expires_at is not None
    assert backed_off.lease_expires_at - backed_off.updated_at == MAX_QUEUED_LEASES * lease
