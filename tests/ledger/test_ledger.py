"""The budget ledger: exact units, reserve/commit/refund, append-only, no overspending."""

from __future__ import annotations

import threading
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from app.config import Settings
from app.core.errors import BudgetExhausted, Conflict, InvalidRequest
from app.core.services import Services
from app.ledger import service as ledger
from app.ledger.units import delta_units, delta_value, epsilon_units, epsilon_value
from app.models import Dataset, LedgerEntry, Release, Role
from app.users import service as users

WORKER = ledger.Actor.worker()


def test_units_are_exact() -> None:
    assert sum([epsilon_units(0.1, charge=True)] * 10) == epsilon_units(1.0, charge=False)
    assert epsilon_units(0.1, charge=True) == 10**11
    assert delta_units(1e-10, charge=True) == 10**8
    assert epsilon_value(epsilon_units(0.3, charge=True)) == 0.3
    assert delta_value(delta_units(1e-9, charge=True)) == 1e-9
    # rounding never favours spending: charges round up, totals round down
    assert epsilon_units(Decimal("1e-13"), charge=True) == 1
    assert epsilon_units(Decimal("1e-13"), charge=False) == 0


def _dataset(services: Services, epsilon: float, delta: float) -> uuid.UUID:
    with services.db.transaction() as session:
        owner, _, _ = users.create_user(session, "owner", Role.curator, None)
        dataset = Dataset(
            owner_id=owner.id,
            name="d",
            columns=[],
            n_rows=10,
            out_of_bounds="clip",
            epsilon_total=epsilon_units(epsilon, charge=False),
            delta_total=delta_units(delta, charge=False),
            storage_name="none",
            validation={},
        )
        session.add(dataset)
        session.flush()
        return dataset.id


def _releases(services: Services, dataset_id: uuid.UUID, count: int) -> list[uuid.UUID]:
    with services.db.transaction() as session:
        dataset = session.get(Dataset, dataset_id)
        assert dataset is not None
        releases = [
            Release(
                dataset_id=dataset_id,
                mechanism="test",
                epsilon=0,
                delta=0,
                params={},
                created_by=dataset.owner_id,
            )
            for _ in range(count)
        ]
        session.add_all(releases)
        session.flush()
        return [r.id for r in releases]


def _balance(services: Services, dataset_id: uuid.UUID) -> ledger.Balance:
    with services.db.transaction() as session:
        dataset = session.get(Dataset, dataset_id)
        assert dataset is not None
        return ledger.balance(session, dataset)


def test_ten_spends_of_a_tenth_exhaust_one_exactly(services: Services) -> None:
    dataset_id = _dataset(services, 1.0, 0.0)
    release_ids = _releases(services, dataset_id, 11)
    for release_id in release_ids[:10]:
        with services.db.transaction() as session:
            ledger.reserve(
                session, dataset_id, release_id, epsilon_units(0.1, charge=True), 0, WORKER
            )
            ledger.commit(session, release_id, WORKER)
    balance = _balance(services, dataset_id)
    assert balance.epsilon_remaining == 0
    assert balance.epsilon_spent == balance.epsilon_total
    with pytest.raises(BudgetExhausted) as info, services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_ids[10], 1, 0, WORKER)
    assert info.value.extra["remaining"] == {"epsilon": 0.0, "delta": 0.0}


def test_reserve_commit_refund_balances(services: Services) -> None:
    dataset_id = _dataset(services, 2.0, 1e-6)
    a, b = _releases(services, dataset_id, 2)
    with services.db.transaction() as session:
        ledger.reserve(
            session,
            dataset_id,
            a,
            epsilon_units(0.5, charge=True),
            delta_units(1e-7, charge=True),
            WORKER,
        )
        ledger.reserve(session, dataset_id, b, epsilon_units(0.25, charge=True), 0, WORKER)
    balance = _balance(services, dataset_id)
    assert (epsilon_value(balance.epsilon_reserved), epsilon_value(balance.epsilon_remaining)) == (
        0.75,
        1.25,
    )
    assert delta_value(balance.delta_remaining) == 9e-7
    with services.db.transaction() as session:
        ledger.commit(session, a, WORKER)
        ledger.refund(session, b, WORKER)
    balance = _balance(services, dataset_id)
    assert epsilon_value(balance.epsilon_spent) == 0.5
    assert balance.epsilon_reserved == 0
    assert epsilon_value(balance.epsilon_remaining) == 1.5
    with services.db.transaction() as session:
        assert ledger.reservation_state(session, a) == "committed"
        assert ledger.reservation_state(session, b) == "refunded"


def test_a_reservation_settles_once(services: Services) -> None:
    dataset_id = _dataset(services, 1.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_id, 10, 0, WORKER)
        ledger.commit(session, release_id, WORKER)
    for settle in (ledger.commit, ledger.refund):
        with (
            pytest.raises(Conflict, match="already committed"),
            services.db.transaction() as session,
        ):
            settle(session, release_id, WORKER)
    (unreserved,) = _releases(services, dataset_id, 1)
    with (
        pytest.raises(Conflict, match="holds no reservation"),
        services.db.transaction() as session,
    ):
        ledger.refund(session, unreserved, WORKER)


def test_the_database_refuses_a_second_settlement(services: Services) -> None:
    # even code that bypasses the service cannot settle twice (partial unique index)
    dataset_id = _dataset(services, 1.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_id, 10, 0, WORKER)
        ledger.commit(session, release_id, WORKER)
    with pytest.raises(DBAPIError), services.db.transaction() as session:
        session.add(
            LedgerEntry(
                dataset_id=dataset_id,
                release_id=release_id,
                kind="refund",
                epsilon=10,
                delta=0,
                actor="x",
            )
        )
        session.flush()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_entries SET epsilon = 0",
        "DELETE FROM ledger_entries",
        "UPDATE audit_events SET action = 'x'",
        "DELETE FROM audit_events",
    ],
)
def test_ledger_and_audit_are_append_only(services: Services, statement: str) -> None:
    dataset_id = _dataset(services, 1.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_id, 10, 0, WORKER)
    with pytest.raises(DBAPIError, match="append-only"), services.db.transaction() as session:
        session.execute(text(statement))


def test_totals_never_drop_below_spent_plus_reserved(services: Services) -> None:
    dataset_id = _dataset(services, 1.0, 1e-6)
    a, b = _releases(services, dataset_id, 2)
    with services.db.transaction() as session:
        ledger.reserve(
            session,
            dataset_id,
            a,
            epsilon_units(0.4, charge=True),
            delta_units(5e-7, charge=True),
            WORKER,
        )
        ledger.commit(session, a, WORKER)
        ledger.reserve(session, dataset_id, b, epsilon_units(0.2, charge=True), 0, WORKER)
    with (
        pytest.raises(Conflict, match=r"budget.epsilon cannot go below spent \+ reserved \(0.6\)"),
        services.db.transaction() as session,
    ):
        ledger.set_totals(session, dataset_id, epsilon_units(0.59, charge=False), None)
    with pytest.raises(Conflict, match=r"budget\.delta"), services.db.transaction() as session:
        ledger.set_totals(session, dataset_id, None, delta_units(4e-7, charge=False))
    with services.db.transaction() as session:
        _, balance = ledger.set_totals(session, dataset_id, epsilon_units(0.6, charge=False), None)
    assert balance.epsilon_remaining == 0
    with services.db.transaction() as session:
        _, balance = ledger.set_totals(
            session, dataset_id, epsilon_units(3, charge=False), delta_units(1e-5, charge=False)
        )
    assert epsilon_value(balance.epsilon_remaining) == 2.4


def _race(services: Services, k: int, cost: float, attempts: int, read_first: bool) -> None:
    """``attempts`` reservations race for a budget that fits exactly ``k`` of them; with
    ``read_first`` each transaction reads the dataset before it reserves, as the release
    service does (its ownership check), which is where a snapshot would be taken."""
    dataset_id = _dataset(services, k * cost, k * 1e-9)
    release_ids = _releases(services, dataset_id, attempts)
    barrier = threading.Barrier(attempts)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt(release_id: uuid.UUID) -> None:
        barrier.wait()
        try:
            with services.db.transaction() as session:
                if read_first:
                    session.execute(select(Dataset.name).where(Dataset.id == dataset_id)).one()
                ledger.reserve(
                    session,
                    dataset_id,
                    release_id,
                    epsilon_units(cost, charge=True),
                    delta_units(1e-9, charge=True),
                    WORKER,
                )
            outcome = "ok"
        except BudgetExhausted:
            outcome = "exhausted"
        except Exception as exc:  # anything else is a failure of the test
            outcome = f"error: {type(exc).__name__}: {exc}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=attempt, args=(r,)) for r in release_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(outcomes) == attempts
    assert sorted(set(outcomes)) == ["exhausted", "ok"], outcomes
    assert outcomes.count("ok") == k
    balance = _balance(services, dataset_id)
    assert balance.epsilon_remaining == 0
    assert balance.delta_remaining == 0
    assert balance.epsilon_reserved == k * epsilon_units(cost, charge=True)


@pytest.mark.parametrize(("k", "cost"), [(7, 0.1), (5, 0.2)])
def test_concurrent_reservations_never_overspend(services: Services, k: int, cost: float) -> None:
    """50 reservations race for a budget that fits exactly k of them."""
    _race(services, k, cost, attempts=50, read_first=False)
    _race(services, k, cost, attempts=50, read_first=True)


def test_reservations_ignore_a_repeatable_read_default(settings: Settings) -> None:
    """A server, database or role may default to ``REPEATABLE READ``; the snapshot would
    then be taken at the first statement, before the dataset lock, and every waiter would
    sum a stale ledger (an audit measured 20 of 20 reservations granted against a budget
    for 10). The engine sets ``READ COMMITTED`` itself (:mod:`app.core.db`)."""
    if settings.database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL only: SQLite serialises writers with BEGIN IMMEDIATE")
    url = make_url(settings.database_url).update_query_dict(
        {"options": r"-c default_transaction_isolation=repeatable\ read"}
    )
    services = Services.build(
        settings.model_copy(update={"database_url": url.render_as_string(hide_password=False)})
    )
    try:
        with services.db.engine.connect() as connection:  # the option reaches the server
            default = connection.exec_driver_sql("SHOW default_transaction_isolation").scalar()
            assert default == "repeatable read"
        with services.db.transaction() as session:
            level = session.execute(text("SHOW transaction_isolation")).scalar()
        assert level == "read committed"
        _race(services, 10, 0.1, attempts=20, read_first=True)
    finally:
        services.close()


def test_a_negative_reservation_is_refused_before_the_database(services: Services) -> None:
    """The service refuses a negative epsilon or delta itself (InvalidRequest, a 422), in
    either amount; the database's ``amounts_nonnegative`` constraint alone would answer
    with an IntegrityError (a 500)."""
    dataset_id = _dataset(services, 1.0, 1e-6)
    (release_id,) = _releases(services, dataset_id, 1)
    for epsilon, delta in [(-1, 0), (0, -1), (10, -1)]:
        with (
            pytest.raises(InvalidRequest, match="cannot be negative"),
            services.db.transaction() as session,
        ):
            ledger.reserve(session, dataset_id, release_id, epsilon, delta, WORKER)
    assert _balance(services, dataset_id).epsilon_remaining == epsilon_units(1.0, charge=False)


def test_an_epsilon_total_of_zero_is_refused(services: Services) -> None:
    """budget.epsilon must be positive: 0 is refused by the service (422), not left to the
    database's check constraint; the total is unchanged."""
    dataset_id = _dataset(services, 1.0, 0.0)
    for total in (0, -1):
        with (
            pytest.raises(InvalidRequest, match="must be positive"),
            services.db.transaction() as session,
        ):
            ledger.set_totals(session, dataset_id, total, None)
    assert _balance(services, dataset_id).epsilon_total == epsilon_units(1.0, charge=False)


def test_delta_alone_exhausts_a_budget(services: Services) -> None:
    """A reservation that fits in epsilon but not in delta is refused: the delta check is
    not implied by the epsilon one. Exactly the remaining delta still fits."""
    dataset_id = _dataset(services, 10.0, 1e-6)
    a, b, c = _releases(services, dataset_id, 3)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, a, 1, delta_units(6e-7, charge=True), WORKER)
    with pytest.raises(BudgetExhausted) as info, services.db.transaction() as session:
        ledger.reserve(session, dataset_id, b, 1, delta_units(4e-7, charge=True) + 1, WORKER)
    assert info.value.extra["remaining"]["delta"] == pytest.approx(4e-7, rel=1e-12)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, c, 1, delta_units(4e-7, charge=True), WORKER)
    balance = _balance(services, dataset_id)
    assert balance.delta_remaining == 0
    assert balance.delta_reserved == balance.delta_total


def test_a_refund_returns_delta_too(services: Services) -> None:
    """Refunding gives back the reservation's delta as well as its epsilon; a commit keeps
    both spent. Exact ledger sums, in units."""
    dataset_id = _dataset(services, 1.0, 1e-6)
    a, b = _releases(services, dataset_id, 2)
    eps_a, dlt_a = epsilon_units(0.3, charge=True), delta_units(2e-7, charge=True)
    eps_b, dlt_b = epsilon_units(0.2, charge=True), delta_units(3e-7, charge=True)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, a, eps_a, dlt_a, WORKER)
        ledger.reserve(session, dataset_id, b, eps_b, dlt_b, WORKER)
        ledger.commit(session, a, WORKER)
        ledger.refund(session, b, WORKER)
    balance = _balance(services, dataset_id)
    assert (balance.epsilon_spent, balance.delta_spent) == (eps_a, dlt_a)
    assert (balance.epsilon_reserved, balance.delta_reserved) == (0, 0)
    assert balance.delta_remaining == balance.delta_total - dlt_a
    assert balance.epsilon_remaining == balance.epsilon_total - eps_a


def test_a_refunded_reservation_settles_no_more(services: Services) -> None:
    """After a refund, neither a commit nor a second refund is written: the service says
    so (409) before the database's partial unique index would (an IntegrityError)."""
    dataset_id = _dataset(services, 1.0, 0.0)
    (release_id,) = _releases(services, dataset_id, 1)
    with services.db.transaction() as session:
        ledger.reserve(session, dataset_id, release_id, 10, 0, WORKER)
        ledger.refund(session, release_id, WORKER)
    for settle in (ledger.commit, ledger.refund):
        with (
            pytest.raises(Conflict, match="already refunded"),
            services.db.transaction() as session,
        ):
            settle(session, release_id, WORKER)
    assert _balance(services, dataset_id).epsilon_remaining == epsilon_units(1.0, charge=False)


def test_a_non_dp_entry_counts_as_having_read_the_data(services: Services) -> None:
    """has_read_data: a commit or a non_dp entry means the worker read the data; a
    reservation alone or a refund does not."""
    dataset_id = _dataset(services, 1.0, 0.0)
    reserved, refunded, committed, non_dp = _releases(services, dataset_id, 4)
    with services.db.transaction() as session:
        for release_id in (reserved, refunded, committed):
            ledger.reserve(session, dataset_id, release_id, 10, 0, WORKER)
        ledger.refund(session, refunded, WORKER)
        ledger.commit(session, committed, WORKER)
        ledger.record_non_dp(session, dataset_id, non_dp, WORKER)
    with services.db.transaction(read_only=True) as session:
        read = {
            r: ledger.has_read_data(session, r) for r in (reserved, refunded, committed, non_dp)
        }
    assert read == {reserved: False, refunded: False, committed: True, non_dp: True}
