"""``GET /metrics`` (:mod:`app.core.metrics`): the installation's state read from the
database, this process's requests and answer slots, behind ``CURATOR_METRICS_TOKEN``, and
no name or id in any label or value (DESIGN rule 5)."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr, ValidationError
from sqlalchemy import text, update
from sqlalchemy.exc import OperationalError

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app import main as main_module
from app.answers import service as answers
from app.config import Settings
from app.core import metrics as metrics_module
from app.core.errors import Forbidden
from app.core.metrics import InstallationCollector
from app.ledger import service as ledger
from app.ledger.service import Actor
from app.ledger.units import delta_units, epsilon_units
from app.main import UNAUTHENTICATED_BODY_BYTES, create_app
from app.models import Dataset, Release
from app.models.release import RELEASE_STATUSES
from app.releases.registry import REGISTRY
from app.releases.service import QUEUED
from tests.conftest import Caller, make_user
from tests.datasets.helpers import SCHEMA, csv_bytes, upload
from tests.releases.helpers import (
    REQUEST,
    dataset,
    finished_release,
    hold_answers,
    services_of,
    wait_for,
)

TOKEN = "metrics-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The app with ``/metrics`` on (the suite's ``client``, with a metrics token)."""
    with_token = settings.model_copy(update={"metrics_token": SecretStr(TOKEN)})
    with TestClient(create_app(with_token)) as test_client:
        yield test_client


def collector(client: TestClient) -> InstallationCollector:
    return client.app.state.metrics.installation  # type: ignore[attr-defined,no-any-return]


def scrape(client: TestClient, *, fresh: bool = True) -> Samples:
    """Every sample of a scrape, by name and labels (``fresh``: not from the cache)."""
    if fresh:
        collector(client).expire()
    response = client.get("/metrics", headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def add_release(
    client: TestClient,
    dataset_id: str,
    owner: uuid.UUID,
    status: str,
    *,
    mechanism: str = "smooth_synopsis",
    stored_bytes: int = 0,
    created_at: datetime | None = None,
    lease_expires_at: datetime | None = None,
    lease_owner: str = "worker-1",
) -> uuid.UUID:
    """A release row in a given state, written as a worker would leave it."""
    with services_of(client).db.transaction() as session:
        release = Release(
            dataset_id=uuid.UUID(dataset_id),
            mechanism=mechanism,
            status=status,
            epsilon=0,
            delta=0,
            params={},
            created_by=owner,
            stored_bytes=stored_bytes,
            lease_expires_at=lease_expires_at,
            lease_owner=None if lease_expires_at is None else lease_owner,
        )
        if created_at is not None:
            release.created_at = created_at
        session.add(release)
        session.flush()
        return release.id


# --- access ----------------------------------------------------------------------------


def test_metrics_are_not_served_without_a_token(settings: Settings) -> None:
    """Unset ``CURATOR_METRICS_TOKEN``: no ``/metrics`` at all, the 404 of any unknown path."""
    with TestClient(create_app(settings)) as plain:
        # under one X-Request-ID, which the error bodies quote
        headers = {**AUTH, "X-Request-ID": "unknown-path"}
        response = plain.get("/metrics", headers=headers)
        assert response.status_code == 404
        assert response.json() == plain.get("/no-such-path", headers=headers).json()


def test_metrics_answer_only_the_bearer_of_the_token(client: TestClient, admin: Caller) -> None:
    missing = client.get("/metrics")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "unauthorized"
    assert client.get("/metrics", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    wrong = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}y"})
    assert wrong.status_code == 403
    assert wrong.json()["error"]["code"] == "forbidden"
    assert TOKEN not in wrong.text
    # an API key, even an admin's, is not the metrics token
    assert client.get("/metrics", headers=admin.headers).status_code == 403
    assert client.get("/metrics", headers=AUTH).status_code == 200
    # not one of the API's operations
    assert "/metrics" not in client.get("/openapi.json").json()["paths"]


def test_the_token_is_compared_as_digests_of_one_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hmac.compare_digest`` returns at once for arguments of different lengths: the
    tokens are compared as SHA-256 digests, whatever the length sent."""
    metrics = metrics_module
    compared: list[tuple[int, int]] = []
    real = metrics.hmac.compare_digest

    def recorded(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(metrics.hmac, "compare_digest", recorded)
    expected = "t" * 40
    for sent in ("t" * 24, "t" * 40, "u" * 400):
        with pytest.raises(Forbidden) if sent != expected else contextlib.nullcontext():
            metrics.check_token(expected, f"Bearer {sent}")
    assert compared == [(32, 32)] * 3


@pytest.mark.parametrize("token", ["short", "x" * 23, " " + "x" * 30, "x" * 15 + " " + "x" * 15])
def test_a_weak_metrics_token_is_refused(token: str) -> None:
    with pytest.raises(ValidationError, match="at least 24 characters"):
        Settings(metrics_token=token)


def test_an_empty_metrics_token_is_unset() -> None:
    """docker-compose passes an unset variable as empty."""
    assert Settings(metrics_token="").metrics_token is None


# --- the installation's state ----------------------------------------------------------


def test_the_installations_state_is_read_from_the_database(
    client: TestClient, curator: Caller
) -> None:
    """Releases in known states, written straight into the database (as workers and other
    API processes write them), are counted exactly, as are datasets and ledger totals."""
    first = dataset(client, curator, epsilon=1.0, delta=1e-6)
    second = dataset(client, curator, epsilon=2.5, delta=0.0)
    owner = curator.id
    now = datetime.now(UTC)
    add_release(client, first, owner, "succeeded", stored_bytes=1000)
    add_release(client, first, owner, "succeeded", stored_bytes=234)
    add_release(client, first, owner, "succeeded", mechanism="graph_cuts", stored_bytes=5)
    add_release(client, first, owner, "failed")
    add_release(client, second, owner, "cancelled", mechanism="randomized_response")
    add_release(client, second, owner, "queued", created_at=now - timedelta(seconds=600))
    add_release(client, second, owner, "queued", created_at=now - timedelta(seconds=60))
    # leases: two measuring (one run out), two synthesising (one run out); a queued
    # release whose lease ran out is waiting, not a stage a worker lost
    add_release(client, first, owner, "measuring", lease_expires_at=now - timedelta(seconds=5))
    add_release(client, first, owner, "measuring", lease_expires_at=now + timedelta(hours=1))
    add_release(client, first, owner, "synthesizing", lease_expires_at=now - timedelta(hours=1))
    add_release(client, first, owner, "synthesizing", lease_expires_at=now + timedelta(hours=1))
    add_release(
        client, first, owner, "queued", created_at=now, lease_expires_at=now - timedelta(hours=1)
    )
    # a type no longer registered is "other", never its stored name
    add_release(client, first, owner, "succeeded", mechanism="retired_type", stored_bytes=7)
    # the ledger: reserved 0.5 + 0.25 + 0.125, of which 0.5 spent and 0.25 refunded
    spent, refunded, held = (
        add_release(client, first, owner, "failed", mechanism="graph_cuts") for _ in range(3)
    )
    with services_of(client).db.transaction() as session:
        worker = Actor.worker()
        for release_id, eps in ((spent, 0.5), (refunded, 0.25), (held, 0.125)):
            ledger.reserve(
                session,
                uuid.UUID(first),
                release_id,
                epsilon_units(eps, charge=True),
                delta_units(1e-7, charge=True),
                worker,
            )
        ledger.commit(session, spent, worker)
        ledger.refund(session, refunded, worker)

    samples = scrape(client)
    assert value(samples, "curator_database_up") == 1
    expected: dict[tuple[str, str], int] = {(m, s): 0 for m in REGISTRY for s in RELEASE_STATUSES}
    expected |= {("smooth_synopsis", "succeeded"): 2, ("graph_cuts", "succeeded"): 1}
    expected |= {("smooth_synopsis", "failed"): 1, ("randomized_response", "cancelled"): 1}
    expected |= {("smooth_synopsis", "queued"): 3, ("smooth_synopsis", "measuring"): 2}
    expected |= {("smooth_synopsis", "synthesizing"): 2, ("other", "succeeded"): 1}
    expected |= {("graph_cuts", "failed"): 3}
    reported = {
        (dict(labels)["mechanism"], dict(labels)["status"]): v
        for (name, labels), v in samples.items()
        if name == "curator_releases"
    }
    assert reported == expected
    stored = {
        dict(labels)["mechanism"]: v
        for (name, labels), v in samples.items()
        if name == "curator_release_stored_bytes"
    }
    sizes = {"smooth_synopsis": 1234, "graph_cuts": 5, "other": 7}
    assert stored == {**dict.fromkeys(REGISTRY, 0), **sizes}
    age = value(samples, "curator_releases_oldest_queued_age_seconds")
    assert 600 <= age < 660
    assert value(samples, "curator_releases_lease_expired", status="measuring") == 1
    assert value(samples, "curator_releases_lease_expired", status="synthesizing") == 1
    # none written with the queue's owner (add_release's leases are a worker's)
    assert value(samples, "curator_releases_waiting", status="synthesizing") == 0
    assert value(samples, "curator_datasets") == 2
    assert value(samples, "curator_budget_epsilon", state="total") == pytest.approx(3.5)
    assert value(samples, "curator_budget_epsilon", state="spent") == pytest.approx(0.5)
    assert value(samples, "curator_budget_epsilon", state="reserved") == pytest.approx(0.125)
    assert value(samples, "curator_budget_delta", state="total") == pytest.approx(1e-6)
    assert value(samples, "curator_budget_delta", state="spent") == pytest.approx(1e-7)
    assert value(samples, "curator_budget_delta", state="reserved") == pytest.approx(1e-7)
    assert value(samples, "curator_metrics_database_read_seconds") > 0


def test_a_stage_waiting_for_a_worker_is_waiting_not_a_lost_lease(
    client: TestClient, curator: Caller
) -> None:
    """A stage enqueued and not yet claimed (owner ``queued``: a measured release waiting
    for its synthesis, a re-synthesis, a stage the sweeper enqueued again) whose lease ran
    out is waiting behind busy workers, which the sweeper handles by enqueueing it again:
    not a worker that died holding it. Only a worker's own lease counts."""
    dataset_id = dataset(client, curator)
    past = datetime.now(UTC) - timedelta(minutes=5)
    for status in ("measuring", "synthesizing"):
        add_release(
            client, dataset_id, curator.id, status, lease_expires_at=past, lease_owner=QUEUED
        )
    add_release(client, dataset_id, curator.id, "synthesizing", lease_expires_at=past)
    add_release(client, dataset_id, curator.id, "queued", lease_expires_at=past, lease_owner=QUEUED)
    samples = scrape(client)
    assert value(samples, "curator_releases_lease_expired", status="measuring") == 0
    assert value(samples, "curator_releases_lease_expired", status="synthesizing") == 1
    # they are waiting: a synthesis queue that does not drain shows here
    for status in ("queued", "measuring", "synthesizing"):
        assert value(samples, "curator_releases_waiting", status=status) == 1


def test_nothing_queued_reports_an_age_of_zero(client: TestClient, curator: Caller) -> None:
    add_release(client, dataset(client, curator), curator.id, "succeeded")
    samples = scrape(client)
    assert value(samples, "curator_releases_oldest_queued_age_seconds") == 0
    assert value(samples, "curator_datasets") == 1


def test_budget_totals_past_64_bit_integers_are_summed(client: TestClient, curator: Caller) -> None:
    """Two datasets of 6 * 10^18 delta units each: SQLite's integer sum raised an overflow."""
    ids = [uuid.UUID(dataset(client, curator)) for _ in range(2)]
    with services_of(client).db.transaction() as session:
        session.execute(update(Dataset).where(Dataset.id.in_(ids)).values(delta_total=6 * 10**18))
    samples = scrape(client)
    assert value(samples, "curator_database_up") == 1
    assert value(samples, "curator_budget_delta", state="total") == pytest.approx(12.0)


def test_scrapes_share_one_read_of_the_database_per_period(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storm of scrapes costs one read each ``CACHE_SECONDS``: scrapes at once wait for
    one read and share it; a later one within the period is answered from it."""
    dataset_id = dataset(client, curator)
    reads: list[int] = []
    gate = threading.Event()
    read = metrics_module.read_installation

    def counted(session: Any) -> Any:
        reads.append(1)
        assert gate.wait(timeout=60)
        return read(session)

    monkeypatch.setattr(metrics_module, "read_installation", counted)
    arrived: list[int] = []
    check = main_module.check_token

    def counted_check(*args: Any) -> None:
        arrived.append(1)
        check(*args)

    monkeypatch.setattr(main_module, "check_token", counted_check)
    clock = [1000.0]
    collector(client).clock = lambda: clock[0]
    collector(client).expire()
    results: list[Samples] = []
    threads = [
        threading.Thread(target=lambda: results.append(scrape(client, fresh=False)))
        for _ in range(5)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(reads) == 1, "the first read")
    wait_for(lambda: len(arrived) == 5, "five scrapes")
    # the four behind the read wait in the event loop: no request thread is theirs
    # (waiting in threads, they held one each, which every other request needs)
    threadpool = anyio.to_thread.current_default_thread_limiter
    borrowed = [client.portal.call(lambda: threadpool().borrowed_tokens) for _ in range(20)]  # type: ignore[attr-defined]
    gate.set()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 5
    assert reads == [1]
    assert max(borrowed) == 1, borrowed
    add_release(client, dataset_id, curator.id, "queued")
    clock[0] += metrics_module.CACHE_SECONDS - 0.5
    cached = scrape(client, fresh=False)
    assert value(cached, "curator_releases", mechanism="smooth_synopsis", status="queued") == 0
    assert reads == [1]
    clock[0] += 0.5
    renewed = scrape(client, fresh=False)
    assert value(renewed, "curator_releases", mechanism="smooth_synopsis", status="queued") == 1
    assert reads == [1, 1]


def test_a_failing_database_read_is_a_metric_not_an_error(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The scrape is still a 200 with this process's metrics, ``curator_database_up 0`` and
    the failure counted; the log line names the error's type, not its message."""
    client.get("/healthz")

    def broken(session: Any) -> Any:
        raise OperationalError("SELECT secret_value", {}, Exception("connection refused"))

    monkeypatch.setattr(metrics_module, "read_installation", broken)
    with caplog.at_level(logging.WARNING, logger="curator.metrics"):
        samples = scrape(client)
        again = scrape(client)
    assert value(samples, "curator_database_up") == 0
    assert value(samples, "curator_metrics_database_errors_total") == 1
    assert value(again, "curator_metrics_database_errors_total") == 2
    assert not any(name.startswith("curator_releases") for name, _ in samples)
    assert not any(name.startswith("curator_budget") for name, _ in samples)
    assert value(
        samples, "curator_http_requests_total", route="/healthz", method="GET", status="2xx"
    )
    assert [r.getMessage() for r in caplog.records] == [
        "metrics: the database read failed (OperationalError)"
    ] * 2
    monkeypatch.undo()
    recovered = scrape(client)
    assert value(recovered, "curator_database_up") == 1
    assert value(recovered, "curator_metrics_database_errors_total") == 2


def test_a_read_behind_a_table_lock_fails_after_the_lock_timeout(settings: Settings) -> None:
    """PostgreSQL: a table locked (a migration, VACUUM FULL) fails the read after
    ``CURATOR_LOCK_TIMEOUT`` (``curator_database_up 0``) rather than holding the scrape,
    and every one behind it, until the lock is released. SQLite's readers take no lock."""
    update_ = {"metrics_token": SecretStr(TOKEN), "lock_timeout": 0.5}
    with TestClient(create_app(settings.model_copy(update=update_))) as locked_client:
        db = services_of(locked_client).db
        if db.is_sqlite:
            pytest.skip("SQLite's readers wait for no lock")
        results: list[Samples] = []
        with db.transaction() as session:
            session.execute(text("LOCK TABLE releases IN ACCESS EXCLUSIVE MODE"))
            thread = threading.Thread(target=lambda: results.append(scrape(locked_client)))
            thread.start()
            thread.join(timeout=20)
            answered = not thread.is_alive()
        thread.join(timeout=60)
    assert answered, "the scrape waited for the lock"
    assert value(results[0], "curator_database_up") == 0


# --- this process's own ----------------------------------------------------------------


def test_requests_are_counted_by_route_template_never_by_path(
    client: TestClient, curator: Caller
) -> None:
    missing = uuid.uuid4()
    for _ in range(3):
        assert client.get("/healthz").status_code == 200
    assert client.get(f"/v1/releases/{missing}", headers=curator.headers).status_code == 404
    assert client.get(f"/v1/releases/{missing}").status_code == 401
    assert client.get(f"/nowhere/{missing}").status_code == 404
    assert client.request("BREW", "/healthz").status_code == 405
    response = client.get("/metrics", headers=AUTH)
    samples = scrape(client)
    count = "curator_http_requests_total"
    assert value(samples, count, route="/healthz", method="GET", status="2xx") == 3
    release = "/v1/releases/{release_id}"
    assert value(samples, count, route=release, method="GET", status="4xx") == 2
    assert value(samples, count, route="unmatched", method="GET", status="4xx") == 1
    assert value(samples, count, route="/healthz", method="other", status="4xx") == 1
    assert value(samples, count, route="/metrics", method="GET", status="2xx") == 1
    latency = "curator_http_request_duration_seconds_count"
    assert value(samples, latency, route="/healthz", method="GET") == 3
    assert value(samples, latency, route=release, method="GET") == 2
    buckets = "curator_http_request_duration_seconds_bucket"
    assert value(samples, buckets, route="/healthz", method="GET", le="+Inf") == 3
    assert str(missing) not in response.text
    assert "nowhere" not in response.text
    assert "BREW" not in response.text


def test_requests_answered_before_routing_are_counted_by_their_route(
    client: TestClient, settings: Settings, curator: Caller
) -> None:
    """A body over its limit (413) and a large body without a valid key (401) are refused
    by ``BodyLimit`` before the router runs; ``/openapi.json`` is one of Starlette's own
    routes: each is counted under its route's template, not as ``unmatched``."""
    over = settings.max_upload_bytes + (8 << 20) + 1
    too_large = client.post(
        "/v1/datasets", headers={**curator.headers, "Content-Length": str(over)}, content=b""
    )
    assert too_large.status_code == 413
    body = b"{" + b" " * (UNAUTHENTICATED_BODY_BYTES + 1) + b"}"
    release = f"/v1/releases/{uuid.uuid4()}/answers"
    assert client.post(release, content=body).status_code == 401
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/no-such-path").status_code == 404
    samples = scrape(client)
    count = "curator_http_requests_total"
    assert value(samples, count, route="/v1/datasets", method="POST", status="4xx") == 1
    answers_route = "/v1/releases/{release_id}/answers"
    assert value(samples, count, route=answers_route, method="POST", status="4xx") == 1
    assert value(samples, count, route="/openapi.json", method="GET", status="2xx") == 1
    assert value(samples, count, route="unmatched", method="GET", status="4xx") == 1


def test_an_unhandled_error_is_counted_as_a_5xx(client: TestClient) -> None:
    def fails() -> None:
        raise RuntimeError("a bug")

    client.app.add_api_route("/boom/{item_id}", fails)  # type: ignore[attr-defined]
    assert client.get("/boom/1").status_code == 500
    samples = scrape(client)
    count = "curator_http_requests_total"
    assert value(samples, count, route="/boom/{item_id}", method="GET", status="5xx") == 1


def test_answer_slots_in_use_and_waiting(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One user's three answer requests: two compute (the user's share of the slots), one
    waits."""
    release_id = finished_release(client, curator, dataset(client, curator), REQUEST)["id"]
    go_on = hold_answers(monkeypatch)
    idle = scrape(client)
    assert value(idle, "curator_answer_slots") == answers.MAX_CONCURRENT_ANSWERS
    assert value(idle, "curator_answer_slots_in_use") == 0
    assert value(idle, "curator_answer_slots_waiting") == 0

    def ask() -> None:
        url = f"/v1/releases/{release_id}/answers"
        client.post(url, headers=curator.headers, json={"queries": [{"type": "pca", "k": 1}]})

    threads = [threading.Thread(target=ask) for _ in range(answers.MAX_ANSWERS_PER_USER + 1)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: client.portal.call(answers.answer_slots.usage) == (2, 1),  # type: ignore[attr-defined]
            "two answers computing and one waiting",
        )
        busy = scrape(client)
    finally:
        go_on.set()
        for thread in threads:
            thread.join(timeout=120)
    assert value(busy, "curator_answer_slots_in_use") == answers.MAX_ANSWERS_PER_USER
    assert value(busy, "curator_answer_slots_waiting") == 1


# --- privacy ---------------------------------------------------------------------------


def test_no_name_or_id_reaches_the_scrape(client: TestClient) -> None:
    """DESIGN rule 5: a dataset's and a column's name, a user's name, ids and data values
    are in no label and no value, whatever the requests made."""
    user_name = "Zebulon-Quixote-metrics-user"
    curator = make_user(client, "curator", user_name)
    column = "zqx_secret_column"
    schema = {
        **SCHEMA,
        "name": "Zanzibar-secret-cohort",
        "columns": [{**SCHEMA["columns"][0], "name": column}, *SCHEMA["columns"][1:]],
    }
    header = f"{column},weight,blood,smoker"
    created = upload(client, curator, csv_bytes(header), schema)
    assert created.status_code == 201, created.text
    dataset_id = created.json()["id"]
    release = finished_release(client, curator, dataset_id, REQUEST)
    client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers)
    client.get(f"/v1/releases/{release['id']}?name={user_name}", headers=curator.headers)
    collector(client).expire()
    text = client.get("/metrics", headers=AUTH).text
    assert "Zanzibar" not in text
    assert column not in text
    assert user_name not in text
    for secret in (dataset_id, release["id"], str(curator.id), curator.key, TOKEN):
        assert secret not in text
    assert "37.123456" not in text


def test_the_reads_over_every_row_scan_covering_indexes(client: TestClient) -> None:
    """Releases by type and the ledger by kind read only their indexes (migration 0016),
    not the wide tables: 10^5 releases took 118 ms on SQLite without (26 with). PostgreSQL
    plans a small table's scan as it likes, so its sequential scans are priced out."""
    db = services_of(client).db
    with db.transaction(read_only=True) as session:
        sqlite = db.is_sqlite
        if not sqlite:
            session.execute(text("SET LOCAL enable_seqscan = off"))
        add = metrics_module.adder(session)
        for statement, index in (
            (metrics_module.releases_by_type(add), "ix_releases_mechanism_status_stored_bytes"),
            (metrics_module.ledger_by_kind(add), "ix_ledger_entries_kind_epsilon_delta"),
        ):
            sql = statement.compile(
                dialect=session.get_bind().dialect, compile_kwargs={"literal_binds": True}
            )
            explain = "EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN "
            plan = " ".join(str(row) for row in session.execute(text(f"{explain}{sql}")))
            scan = f"COVERING INDEX {index}" if sqlite else f"Index Only Scan using {index}"
            assert scan in plan, plan
