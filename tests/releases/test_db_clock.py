"""A release stage's lease is timed by the database's clock, not its host's.

The API, the workers and their sweepers run on several hosts; a lease set by one is
compared by the others. Each read its own host's clock (``utcnow``): with hosts drifting
more than a lease apart, a host ahead saw live leases as run out (a second worker claimed a
stage that was still running, the sweeper re-enqueued it) and a host behind set leases that
had already run out. Here the host's clock is moved (every ``utcnow`` the service imported)
while PostgreSQL's stays right. SQLite has one host, whose clock is the database's.
"""

from __future__ import annotations

import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

import tests.releases.fake_mechanism as _fake  # noqa: F401 - registers test_means
from app.core.db import db_now
from app.core.services import Services
from app.models import Release
from app.models.base import utcnow
from app.releases.service import QUEUED
from app.releases.stages import Heartbeat, _claim, sweep
from tests.conftest import Caller
from tests.releases.helpers import dataset, request_release, services_of

#: How far the host's clock is moved, in leases: far more than one lease.
SKEW_LEASES = 100


def _postgres_only(services: Services) -> None:
    if services.db.is_sqlite:
        pytest.skip("SQLite: the database's clock is its one host's")


def _set_host_clock(monkeypatch: pytest.MonkeyPatch, offset: timedelta) -> None:
    """Move the host's clock by ``offset``: every ``utcnow`` an ``app`` module imported."""

    def skewed() -> datetime:
        return datetime.now(UTC) + offset

    for name, module in list(sys.modules.items()):
        if name.startswith("app.") and getattr(module, "utcnow", None) is utcnow:
            monkeypatch.setattr(module, "utcnow", skewed)


def _lease(services: Services) -> timedelta:
    return timedelta(seconds=services.settings.lease_seconds)


def _server_now(services: Services) -> datetime:
    with services.db.transaction(read_only=True) as session:
        now = session.scalar(select(func.clock_timestamp()))
    assert isinstance(now, datetime)
    return now.astimezone(UTC)


def _lease_left(services: Services, release_id: uuid.UUID) -> timedelta:
    """How long the release's lease runs yet, by the database's clock."""
    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert release.lease_expires_at is not None
        expires = release.lease_expires_at
    return expires - _server_now(services)


def _new_release(client: TestClient, curator: Caller) -> uuid.UUID:
    response = request_release(client, curator, dataset(client, curator))
    assert response.status_code == 202, response.text
    return uuid.UUID(response.json()["id"])


def _close_to_a_lease(services: Services, left: timedelta) -> bool:
    lease = _lease(services)
    return lease - timedelta(seconds=10) < left <= lease


def test_db_now_is_aware_utc_on_both_backends(services: Services) -> None:
    with services.db.transaction(read_only=True) as session:
        now = db_now(session)
    assert now.tzinfo is not None
    assert now.utcoffset() == timedelta(0)
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)  # the test runs on one host


def test_db_now_reads_the_servers_clock_not_the_transactions_start(services: Services) -> None:
    """``now()`` on PostgreSQL is the transaction's start, before any lock wait of a claim:
    a lease set from it is short by that wait."""
    _postgres_only(services)
    with services.db.transaction() as session:
        started = session.scalar(select(func.now()))
        session.execute(select(func.pg_sleep(0.3)))
        now = db_now(session)
    assert isinstance(started, datetime)
    assert now - started >= timedelta(seconds=0.3)


@pytest.mark.parametrize("direction", [1, -1], ids=["ahead", "behind"])
def test_a_host_clock_off_by_many_leases_sets_a_lease_by_the_database(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch, direction: int
) -> None:
    """The request (an API host) and the claim (a worker host) set the lease one lease past
    the database's now, whatever their clocks say: a host behind set leases that had run
    out already (the sweeper re-enqueued a release just requested, another worker took a
    stage just claimed), a host ahead leases that lasted for days."""
    services = services_of(client)
    _postgres_only(services)
    _set_host_clock(monkeypatch, direction * SKEW_LEASES * _lease(services))
    release_id = _new_release(client, curator)
    assert _close_to_a_lease(services, _lease_left(services, release_id))
    claim = _claim(services, release_id, "measure")
    assert claim is not None
    assert _close_to_a_lease(services, _lease_left(services, release_id))
    with services.db.transaction() as session:  # the lease is nearly out, by the database
        release = session.get(Release, release_id)
        assert release is not None
        release.lease_expires_at = db_now(session) + timedelta(seconds=1)
    Heartbeat(services, claim).beat()  # a renewal by the skewed host
    assert _close_to_a_lease(services, _lease_left(services, release_id))
    monkeypatch.undo()  # another host, whose clock is right
    assert _claim(services, release_id, "measure") is None
    assert sweep(services) == 0


def test_a_worker_whose_clock_is_ahead_does_not_take_a_live_lease(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = services_of(client)
    _postgres_only(services)
    release_id = _new_release(client, curator)
    first = _claim(services, release_id, "measure")
    assert first is not None
    _set_host_clock(monkeypatch, SKEW_LEASES * _lease(services))
    assert _claim(services, release_id, "measure") is None
    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert release.lease_owner == first.owner
        assert release.attempts == 1


def test_a_sweeper_whose_clock_is_ahead_does_not_see_a_live_lease_run_out(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = services_of(client)
    _postgres_only(services)
    release_id = _new_release(client, curator)
    claim = _claim(services, release_id, "measure")
    assert claim is not None
    _set_host_clock(monkeypatch, SKEW_LEASES * _lease(services))
    before = services.queue.pending()
    assert sweep(services) == 0
    assert services.queue.pending() == before
    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert release.lease_owner == claim.owner


@pytest.mark.parametrize("direction", [1, -1], ids=["ahead", "behind"])
def test_a_swept_release_waits_by_the_database_clock(
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
    direction: int,
) -> None:
    """The sweeper reads a queued release's last wait as ``lease_expires_at -
    updated_at``: both are set from one reading of the database's clock (``updated_at``'s
    own default is the host's), so the wait doubles from exactly one lease."""
    services = services_of(client)
    _postgres_only(services)
    release_id = _new_release(client, curator)
    lease = _lease(services)

    def lapse() -> None:
        with services.db.transaction() as session:
            release = session.get(Release, release_id)
            assert release is not None
            release.lease_expires_at = db_now(session) - timedelta(seconds=1)
            release.updated_at = release.lease_expires_at - lease

    lapse()
    _set_host_clock(monkeypatch, direction * SKEW_LEASES * lease)
    assert sweep(services) == 1

    with services.db.transaction(read_only=True) as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert release.lease_owner == QUEUED
        assert release.lease_expires_at is not None
        assert release.lease_expires_at - release.updated_at == 2 * lease
    assert _close_to_a_lease(services, _lease_left(services, release_id) - lease)
