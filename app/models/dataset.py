"""Datasets (declared schema, budget, encrypted storage) and analyst grants."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, new_id, utcnow


class Dataset(Base):
    """A curator's table or graph. ``columns`` is the declared schema (public by
    definition); budget totals are in ledger units (see :mod:`app.ledger.units`)."""

    __tablename__ = "datasets"
    __table_args__ = (
        CheckConstraint("out_of_bounds IN ('clip', 'reject')", name="out_of_bounds"),
        CheckConstraint("kind IN ('table', 'graph')", name="kind"),
        CheckConstraint("epsilon_total > 0", name="epsilon_total_positive"),
        CheckConstraint("delta_total >= 0", name="delta_total_nonnegative"),
        # a curator's dataset list in page order (app.core.pagination)
        Index("ix_datasets_owner_id_created_at_id", "owner_id", "created_at", "id"),
        # a retried upload finds its dataset; two copies racing insert one
        Index(
            "uq_datasets_idempotency",
            "owner_id",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        # a curator's earlier upload of the same file (a warning, not a refusal)
        Index("ix_datasets_owner_id_fingerprint", "owner_id", "fingerprint"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    owner_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    #: ``table`` (rows with declared columns) or ``graph`` (an undirected edge list).
    kind: Mapped[str] = mapped_column(String(16), default="table")
    #: Public vertex count of a graph dataset (ids 0..n_vertices-1); None for tables.
    n_vertices: Mapped[int | None] = mapped_column(Integer, default=None)
    #: The curator's opt-in to releases whose guarantee is not differential privacy
    #: (``compressed``, paper 002).
    allow_non_dp_releases: Mapped[bool] = mapped_column(Boolean, default=False)
    columns: Mapped[list[Any]]
    n_rows: Mapped[int] = mapped_column(Integer)
    out_of_bounds: Mapped[str] = mapped_column(String(8))
    epsilon_total: Mapped[int] = mapped_column(BigInteger)
    delta_total: Mapped[int] = mapped_column(BigInteger)
    storage_name: Mapped[str] = mapped_column(String(200))
    validation: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: When the curator deleted the stored rows (``DELETE /v1/datasets/{id}/data``): the
    #: encrypted file is gone; the declaration, ledger and releases stay. No new release.
    data_deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    #: The key(s) of the stored file, sealed with the service's data key
    #: (:func:`app.storage.tables.seal_file_keys`). Forgotten (null) when the data are
    #: deleted, so that no copy of the file opens again; null too for a file stored
    #: before datasets had keys of their own (it opens with the service key).
    file_keys: Mapped[str | None] = mapped_column(Text, default=None)
    #: The upload's ``Idempotency-Key`` (unique per curator), if it sent one.
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    #: SHA-256 (hex) of the upload's declaration (public parameters), which a retry under
    #: the same key must repeat; null for an upload without a key.
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    #: HMAC-SHA256 (hex) of the uploaded file's bytes under a key derived from the data
    #: key (:func:`app.datasets.upload.fingerprint_keys`), never a plain hash of them;
    #: null for a dataset uploaded before it was recorded.
    fingerprint: Mapped[str | None] = mapped_column(String(64), default=None)


class Grant(Base):
    """An analyst's read access to one dataset and its releases."""

    __tablename__ = "grants"
    __table_args__ = (
        # a dataset's grant list in page order (app.core.pagination)
        Index("ix_grants_dataset_id_created_at_user_id", "dataset_id", "created_at", "user_id"),
    )

    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), primary_key=True)
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"), primary_key=True, index=True)
    granted_by: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
