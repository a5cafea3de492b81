"""The append-only budget ledger.

Every change of a dataset's privacy budget is one row: ``reserve`` (a release holds
budget), ``commit`` (its noisy measurements exist: the reservation became a spend) or
``refund`` (it ended before measuring). A release whose guarantee is not differential
privacy (``compressed``) is recorded as ``non_dp`` with zero amounts: visible in the
ledger, never part of an epsilon or delta sum. Amounts are integers in ledger units. Rows are
never updated or deleted (database triggers refuse it); a release has at most one
reserve and at most one settlement (commit or refund), enforced by unique indexes.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Index, String, text
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, BigIntPK, utcnow

LEDGER_KINDS = ("reserve", "commit", "refund", "non_dp")


class LedgerEntry(Base):
    __tablename__ = "ledger_entries"
    __table_args__ = (
        CheckConstraint("kind IN ('reserve', 'commit', 'refund', 'non_dp')", name="kind"),
        CheckConstraint("kind != 'non_dp' OR (epsilon = 0 AND delta = 0)", name="non_dp_free"),
        CheckConstraint("epsilon >= 0 AND delta >= 0", name="amounts_nonnegative"),
        Index(
            "uq_ledger_entries_reserve",
            "release_id",
            unique=True,
            sqlite_where=text("kind = 'reserve'"),
            postgresql_where=text("kind = 'reserve'"),
        ),
        Index(
            "uq_ledger_entries_settlement",
            "release_id",
            unique=True,
            sqlite_where=text("kind IN ('commit', 'refund')"),
            postgresql_where=text("kind IN ('commit', 'refund')"),
        ),
        # a dataset's entries in page order (app.core.pagination); SQLite's index on
        # dataset_id alone would do (its rows end with the rowid), PostgreSQL's would not
        Index("ix_ledger_entries_dataset_id_id", "dataset_id", "id"),
        # covers the metrics' sums by kind (app.core.metrics)
        Index("ix_ledger_entries_kind_epsilon_delta", "kind", "epsilon", "delta"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), index=True)
    release_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("releases.id"))
    kind: Mapped[str] = mapped_column(String(8))
    epsilon: Mapped[int] = mapped_column(BigInteger)
    delta: Mapped[int] = mapped_column(BigInteger)
    actor_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("users.id"))
    actor: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
