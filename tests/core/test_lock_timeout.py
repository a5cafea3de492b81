"""A request's write transaction waits for a lock ``CURATOR_LOCK_TIMEOUT`` at most.

On PostgreSQL a request that needs a lock held by slow work (a dataset's row, a key's
advisory lock) waited for as long as that work lasted, in one of the API's transaction
slots; a revocation waiting behind one slow write of a key made every later write of that
key wait too (the advisory lock's queue is fair). Now it gives up after the timeout with a
503 ``service_unavailable`` (Retry-After), its transaction rolled back. SQLite bounds its
write lock's wait with its 30 s busy timeout instead (``BEGIN IMMEDIATE``), already a 503.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from httpx2 import Response
from sqlalchemy import Connection, create_engine, func, select, text

import tests.releases.fake_mechanism as _fake  # noqa: F401 - registers test_means
from app.config import Settings
from app.core.security import key_lock
from app.core.services import Services
from app.models import ApiKey, LedgerEntry, Release
from tests.conftest import Caller, make_user
from tests.releases.helpers import REQUEST, dataset, request_release, services_of, wait_for

#: The tests' lock timeout (seconds): short, the default's 10 s would slow the suite.
LOCK_TIMEOUT = 1.0
#: A request that gives up after LOCK_TIMEOUT answers within this (a loaded CI machine).
ANSWERED_WITHIN = 8.0


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"lock_timeout": LOCK_TIMEOUT})


def _postgres_only(services: Services) -> None:
    if services.db.is_sqlite:
        pytest.skip("SQLite: a write waits for the database's write lock (busy timeout, 30 s)")


@contextmanager
def _other_connection(services: Services) -> Iterator[Connection]:
    """A connection of another process (its own engine), in a transaction rolled back at
    the end: the slow work that holds a lock."""
    engine = create_engine(services.db.url)
    try:
        with engine.connect() as connection, connection.begin() as transaction:
            yield connection
            transaction.rollback()
    finally:
        engine.dispose()


def _waiting_for_a_lock(services: Services) -> int:
    """Lock requests waiting in this database (any process)."""
    with services.db.transaction(read_only=True) as session:
        waiting = session.scalar(
            text(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON l.database = d.oid "
                "WHERE NOT l.granted AND d.datname = current_database()"
            )
        )
    return int(waiting or 0)


def test_the_lock_timeout_is_the_transactions_own(services: Services) -> None:
    """Set for the transaction that asks for it (``SET LOCAL``): the pooled connection
    goes back without it, and a worker's transaction (none asked) waits as long as it
    must. SQLite: the argument changes nothing."""
    if services.db.is_sqlite:
        with services.db.transaction(lock_timeout=LOCK_TIMEOUT) as session:
            assert session.scalar(select(func.count()).select_from(Release)) == 0
        return
    with services.db.transaction(lock_timeout=1.5) as session:
        assert session.scalar(text("SHOW lock_timeout")) == "1500ms"
    with services.db.transaction(lock_timeout=0.0001) as session:  # rounded up, not off
        assert session.scalar(text("SHOW lock_timeout")) == "1ms"
    for _ in range(3):  # whichever pooled connection comes next
        with services.db.transaction() as session:
            assert session.scalar(text("SHOW lock_timeout")) == "0"


def test_a_release_request_behind_a_held_dataset_lock_is_a_503_that_reserves_nothing(
    client: TestClient, curator: Caller
) -> None:
    services = services_of(client)
    _postgres_only(services)
    dataset_id = dataset(client, curator)
    with _other_connection(services) as other:
        other.execute(
            text("SELECT id FROM datasets WHERE id = :id FOR UPDATE"),
            {"id": uuid.UUID(dataset_id)},
        )
        answers: list[Response] = []
        started = time.monotonic()
        request = threading.Thread(
            target=lambda: answers.append(request_release(client, curator, dataset_id))
        )
        request.start()
        request.join(timeout=ANSWERED_WITHIN)
        took = time.monotonic() - started
    request.join()  # the lock let go: one that waited for it goes on now
    assert took < ANSWERED_WITHIN, "the request waited for the lock's holder"
    (refused,) = answers
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "service_unavailable"
    assert "waited too long" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "30"
    assert took >= LOCK_TIMEOUT
    with services.db.transaction(read_only=True) as session:  # nothing half-written
        assert session.scalar(select(func.count()).select_from(Release)) == 0
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == 0
    budget = client.get(f"/v1/datasets/{dataset_id}/budget", headers=curator.headers).json()
    assert budget["epsilon_reserved"] == 0
    assert budget["epsilon_spent"] == 0
    assert budget["epsilon_remaining"] == budget["epsilon_total"]
    accepted = request_release(client, curator, dataset_id)  # the lock let go: it goes on
    assert accepted.status_code == 202, accepted.text


def test_a_revocation_behind_a_slow_write_gives_up_and_the_keys_writes_go_on(
    client: TestClient, curator: Caller
) -> None:
    """A slow write of the curator's key holds its advisory lock (shared); the admin's
    revocation waits for it (exclusive), and a later write of the key waits behind the
    revocation. Without a lock timeout both waited for as long as the slow write lasted
    (here the whole test); now the revocation is a 503 after the timeout, the key stays
    active, and the write queued behind it goes on."""
    services = services_of(client)
    _postgres_only(services)
    admin = make_user(client, "admin")
    dataset_id = dataset(client, curator)
    key_id = client.get("/v1/users/me", headers=curator.headers).json()["keys"][0]["id"]
    codes: dict[str, int] = {}
    took: dict[str, float] = {}

    def call(name: str, method: str, url: str, caller: Caller, body: object = None) -> None:
        started = time.monotonic()
        response = client.request(method, url, headers=caller.headers, json=body)
        took[name], codes[name] = time.monotonic() - started, response.status_code

    revocation = threading.Thread(
        target=call, args=("revoke", "DELETE", f"/v1/keys/{key_id}", admin)
    )
    write = threading.Thread(
        target=call,
        args=("write", "POST", f"/v1/datasets/{dataset_id}/releases", curator, REQUEST),
    )
    with _other_connection(services) as slow_write:
        slow_write.execute(
            text("SELECT pg_advisory_xact_lock_shared(:lock)"),
            {"lock": key_lock(uuid.UUID(key_id))},
        )
        revocation.start()
        wait_for(lambda: _waiting_for_a_lock(services) == 1, "the revocation to wait", 10)
        write.start()
        wait_for(lambda: _waiting_for_a_lock(services) >= 2, "the write to wait behind it", 10)
        revocation.join(timeout=ANSWERED_WITHIN)
        write.join(timeout=ANSWERED_WITHIN)
        alive = revocation.is_alive() or write.is_alive()
    revocation.join()
    write.join()
    assert not alive, "a request waited for the slow write to end"
    assert codes == {"revoke": 503, "write": 202}
    assert LOCK_TIMEOUT <= took["revoke"] < ANSWERED_WITHIN
    with services.db.transaction(read_only=True) as session:
        key = session.get(ApiKey, uuid.UUID(key_id))
        assert key is not None
        assert key.revoked_at is None  # the revocation rolled back
    assert client.get("/v1/users/me", headers=curator.headers).status_code == 200
