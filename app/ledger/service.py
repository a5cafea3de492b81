"""Ledger use cases: reserve, commit, refund, balances, totals (DESIGN §2 rule 6).

A reservation is atomic: the dataset row is locked (``SELECT ... FOR NO KEY UPDATE`` on
PostgreSQL, which serialises reservations yet stays compatible with the key-share locks
that inserting a release or ledger row takes on it; SQLite transactions are
``BEGIN IMMEDIATE`` and hold the write lock), the balance is summed from the ledger
itself, ``spent + reserved + cost <= total`` is checked for epsilon and delta, and the
entry is appended, all in the caller's transaction. Nothing here commits.

Every entry is appended under that lock, a spend, refund or ``non_dp`` record too: on
PostgreSQL an entry's id is drawn at its insert and seen at its commit, and a spend that
held only its release's lock committed after a reservation with a larger id, which a
reader paging by ``after_id`` had already gone past. Under the dataset's lock, held to the
commit, a dataset's entries get their ids in commit order. Lock order: a release's row
(the worker's and a cancel's settle hold it), then its dataset's.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core import pagination
from app.core.db import uses_row_locks
from app.core.errors import BudgetExhausted, Conflict, InvalidRequest, NotFound
from app.core.pagination import Page
from app.ledger.journal import journal_after_commit
from app.ledger.units import delta_value, epsilon_value
from app.models import Dataset, LedgerEntry


@dataclass(frozen=True)
class Actor:
    """Who acts: a user, or the worker (``user_id=None``)."""

    user_id: uuid.UUID | None
    label: str

    @classmethod
    def user(cls, user_id: uuid.UUID) -> Actor:
        return cls(user_id=user_id, label=f"user:{user_id}")

    @classmethod
    def worker(cls) -> Actor:
        return cls(user_id=None, label="worker")


@dataclass(frozen=True)
class Balance:
    """A dataset's budget in ledger units."""

    epsilon_total: int
    delta_total: int
    epsilon_spent: int
    delta_spent: int
    epsilon_reserved: int
    delta_reserved: int

    @property
    def epsilon_remaining(self) -> int:
        return self.epsilon_total - self.epsilon_spent - self.epsilon_reserved

    @property
    def delta_remaining(self) -> int:
        return self.delta_total - self.delta_spent - self.delta_reserved

    def remaining(self) -> dict[str, float]:
        return {
            "epsilon": epsilon_value(self.epsilon_remaining),
            "delta": delta_value(self.delta_remaining),
        }


def lock_dataset(session: Session, dataset_id: uuid.UUID) -> Dataset:
    """Lock the dataset's budget for this transaction (see the module docstring)."""
    stmt = select(Dataset).where(Dataset.id == dataset_id).execution_options(populate_existing=True)
    if uses_row_locks(session):
        stmt = stmt.with_for_update(key_share=True)  # renders FOR NO KEY UPDATE
    dataset = session.scalars(stmt).one_or_none()
    if dataset is None:
        raise NotFound("dataset not found")
    return dataset


def balance(session: Session, dataset: Dataset) -> Balance:
    """The dataset's totals and its ledger's sums (:func:`balances` for many at once)."""
    return balances(session, [dataset])[dataset.id]


#: A ledger sum: exact integer units, or a float where the database sums in floats.
Units = TypeVar("Units", int, float)


def spent_and_reserved(
    sums: Mapping[str, tuple[Units, Units]], zero: Units
) -> tuple[tuple[Units, Units], tuple[Units, Units]]:
    """``(spent, reserved)``, each ``(epsilon, delta)``, from a ledger's sums by kind
    (``reserve``, ``commit``, ``refund``): ``spent = sum commit``, ``reserved = sum reserve
    - sum commit - sum refund``. A dataset's balance (:func:`balances`) and the
    installation's (:mod:`app.core.metrics`) both read it so."""
    reserve, commit, refund = (sums.get(k, (zero, zero)) for k in ("reserve", "commit", "refund"))
    reserved = (reserve[0] - commit[0] - refund[0], reserve[1] - commit[1] - refund[1])
    return commit, reserved


def balances(session: Session, datasets: Sequence[Dataset]) -> dict[uuid.UUID, Balance]:
    """:func:`balance` of each dataset, by id, from one grouped query (a page of datasets
    took one query each): :func:`spent_and_reserved` of the dataset's own entries."""
    sums: dict[uuid.UUID, dict[str, tuple[int, int]]] = {d.id: {} for d in datasets}
    if sums:
        rows = session.execute(
            select(
                LedgerEntry.dataset_id,
                LedgerEntry.kind,
                func.sum(LedgerEntry.epsilon),
                func.sum(LedgerEntry.delta),
            )
            .where(LedgerEntry.dataset_id.in_(list(sums)))
            .group_by(LedgerEntry.dataset_id, LedgerEntry.kind)
        ).all()
        for dataset_id, kind, eps, dlt in rows:
            sums[dataset_id][kind] = (int(eps or 0), int(dlt or 0))
    out = {}
    for dataset in datasets:
        spent, reserved = spent_and_reserved(sums[dataset.id], 0)
        out[dataset.id] = Balance(
            epsilon_total=dataset.epsilon_total,
            delta_total=dataset.delta_total,
            epsilon_spent=spent[0],
            delta_spent=spent[1],
            epsilon_reserved=reserved[0],
            delta_reserved=reserved[1],
        )
    return out


def reserve(
    session: Session,
    dataset_id: uuid.UUID,
    release_id: uuid.UUID,
    epsilon: int,
    delta: int,
    actor: Actor,
) -> LedgerEntry:
    """Reserve ``(epsilon, delta)`` units for a release, or raise :class:`BudgetExhausted`."""
    if epsilon < 0 or delta < 0:
        raise InvalidRequest("a reservation cannot be negative")
    dataset = lock_dataset(session, dataset_id)
    current = balance(session, dataset)
    if epsilon > current.epsilon_remaining or delta > current.delta_remaining:
        raise BudgetExhausted(
            f"the request needs epsilon {epsilon_value(epsilon)} and delta {delta_value(delta)}; "
            f"the dataset has epsilon {epsilon_value(current.epsilon_remaining)} and "
            f"delta {delta_value(current.delta_remaining)} left",
            remaining=current.remaining(),
        )
    entry = LedgerEntry(
        dataset_id=dataset_id,
        release_id=release_id,
        kind="reserve",
        epsilon=epsilon,
        delta=delta,
        actor_id=actor.user_id,
        actor=actor.label,
    )
    session.add(entry)
    session.flush()
    return entry


def _entries_of(session: Session, release_id: uuid.UUID) -> list[LedgerEntry]:
    return list(
        session.scalars(
            select(LedgerEntry).where(LedgerEntry.release_id == release_id).order_by(LedgerEntry.id)
        )
    )


def has_read_data(session: Session, release_id: uuid.UUID) -> bool:
    """Whether the release's worker read the data: a spend (``commit``) or a ``non_dp``
    entry exists (a release that ended before reading was refunded or recorded nothing)."""
    return any(e.kind in ("commit", "non_dp") for e in _entries_of(session, release_id))


def reservation_state(session: Session, release_id: uuid.UUID) -> str:
    """``"none"``, ``"reserved"``, ``"committed"`` or ``"refunded"``."""
    kinds = {entry.kind for entry in _entries_of(session, release_id)}
    if "commit" in kinds:
        return "committed"
    if "refund" in kinds:
        return "refunded"
    return "reserved" if "reserve" in kinds else "none"


def _settle(session: Session, release_id: uuid.UUID, kind: str, actor: Actor) -> LedgerEntry:
    entries = _entries_of(session, release_id)
    reservation = next((e for e in entries if e.kind == "reserve"), None)
    if reservation is None:
        raise Conflict(f"release {release_id} holds no reservation")
    settled = next((e for e in entries if e.kind in ("commit", "refund")), None)
    if settled is not None:
        past = "committed" if settled.kind == "commit" else "refunded"
        raise Conflict(f"the reservation of release {release_id} is already {past}")
    lock_dataset(session, reservation.dataset_id)  # ids in commit order (module docstring)
    entry = LedgerEntry(
        dataset_id=reservation.dataset_id,
        release_id=release_id,
        kind=kind,
        epsilon=reservation.epsilon,
        delta=reservation.delta,
        actor_id=actor.user_id,
        actor=actor.label,
    )
    session.add(entry)
    session.flush()
    if kind == "commit":
        journal_after_commit(session, entry)
    return entry


def record_non_dp(
    session: Session, dataset_id: uuid.UUID, release_id: uuid.UUID, actor: Actor
) -> LedgerEntry:
    """Record that a release whose guarantee is not differential privacy was measured: a
    ``non_dp`` entry with zero amounts, never part of an epsilon or delta sum."""
    lock_dataset(session, dataset_id)  # ids in commit order (module docstring)
    entry = LedgerEntry(
        dataset_id=dataset_id,
        release_id=release_id,
        kind="non_dp",
        epsilon=0,
        delta=0,
        actor_id=actor.user_id,
        actor=actor.label,
    )
    session.add(entry)
    session.flush()
    journal_after_commit(session, entry)
    return entry


def commit(session: Session, release_id: uuid.UUID, actor: Actor) -> LedgerEntry:
    """The release's noisy measurements exist: its reservation becomes a spend."""
    return _settle(session, release_id, "commit", actor)


def refund(session: Session, release_id: uuid.UUID, actor: Actor) -> LedgerEntry:
    """The release ended before measuring: its reservation is released."""
    return _settle(session, release_id, "refund", actor)


def set_totals(
    session: Session,
    dataset_id: uuid.UUID,
    epsilon_total: int | None,
    delta_total: int | None,
) -> tuple[Dataset, Balance]:
    """Change a dataset's budget totals; never below what is spent plus reserved."""
    dataset = lock_dataset(session, dataset_id)
    current = balance(session, dataset)
    used_eps = current.epsilon_spent + current.epsilon_reserved
    used_delta = current.delta_spent + current.delta_reserved
    if epsilon_total is not None:
        if epsilon_total <= 0:
            raise InvalidRequest("budget.epsilon must be positive")
        if epsilon_total < used_eps:
            raise Conflict(
                f"budget.epsilon cannot go below spent + reserved ({epsilon_value(used_eps)})"
            )
        dataset.epsilon_total = epsilon_total
    if delta_total is not None:
        if delta_total < used_delta:
            raise Conflict(
                f"budget.delta cannot go below spent + reserved ({delta_value(used_delta)})"
            )
        dataset.delta_total = delta_total
    session.flush()
    return dataset, balance(session, dataset)


def entries(
    session: Session, dataset_id: uuid.UUID, limit: int, after_id: int | None
) -> Page[LedgerEntry]:
    """A page of the dataset's entries in the order they were written (by id), past
    ``after_id`` (index ``ix_ledger_entries_dataset_id_id``)."""
    return pagination.by_id(
        session,
        select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id),
        LedgerEntry.id,
        limit,
        after_id,
        lambda e: e.id,
    )
