"""Releases: one mechanism run on one dataset, with its reserved budget and its stages.

Lifecycle (DESIGN §2 rule 4): ``queued`` -> ``measuring`` (the only stage that reads raw
rows; it ends by persisting the noisy measurements and committing the spend in one
transaction) -> ``synthesizing`` (post-processing of the stored measurements only) ->
``succeeded``; or ``failed`` / ``cancelled``. A stage runs under a lease (owner, expiry)
that its worker renews; a sweeper hands stages with expired leases to another worker. A
re-synthesis moves a release back to ``synthesizing``; its published version stays served
meanwhile, and if the run fails or is cancelled the release is ``succeeded`` again with it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, new_id, utcnow

RELEASE_STATUSES = ("queued", "measuring", "synthesizing", "succeeded", "failed", "cancelled")
ACTIVE_STATUSES = ("queued", "measuring", "synthesizing")


class Release(Base):
    __tablename__ = "releases"
    __table_args__ = (
        CheckConstraint(
            "status IN ('queued', 'measuring', 'synthesizing', 'succeeded', 'failed', 'cancelled')",
            name="status",
        ),
        Index(
            "uq_releases_idempotency",
            "created_by",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        Index("ix_releases_status_lease", "status", "lease_expires_at"),
        # a dataset's release list in page order (app.core.pagination)
        Index("ix_releases_dataset_id_created_at_id", "dataset_id", "created_at", "id"),
        # covers the metrics' releases by type and status (app.core.metrics)
        Index("ix_releases_mechanism_status_stored_bytes", "mechanism", "status", "stored_bytes"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), index=True)
    mechanism: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    epsilon: Mapped[int] = mapped_column(BigInteger)
    delta: Mapped[int] = mapped_column(BigInteger)
    params: Mapped[dict[str, Any]]
    created_by: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    columns: Mapped[list[Any]] = mapped_column(default=list)
    #: Seed of the post-processing generator: a retried synthesis reproduces its artifacts.
    seed: Mapped[int] = mapped_column(BigInteger, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    request_hash: Mapped[str] = mapped_column(String(64), default="")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str | None] = mapped_column(Text, default=None)
    lease_owner: Mapped[str | None] = mapped_column(String(128), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    #: Claims of the current stage: the measure stage's, then (from 0 again) those of each
    #: synthesis run (releases recorded before migration 0008 count every claim).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: When a measure attempt first opened the data file (set, in a transaction of its
    #: own, before a row is read; never cleared): an attempt that died may have read the
    #: data only if this is set. Releases recorded before migration 0007 with any attempt
    #: have it set (their attempts may have read).
    read_started_at: Mapped[datetime | None] = mapped_column(default=None)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    resolved: Mapped[dict[str, Any]] = mapped_column(default=dict)
    #: The accuracy predicted at the request from public values (as the preview's);
    #: ``None`` for releases recorded before migration 0006.
    accuracy: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    privacy_cost: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    synthesis_params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    synthesis_version: Mapped[int] = mapped_column(Integer, default=0)
    #: The artifacts of the synthesis version served to downloads and answers (``None``
    #: until one succeeded). A re-synthesis that runs, fails or is cancelled leaves it
    #: served; its success replaces it.
    artifacts: Mapped[dict[str, Any]] = mapped_column(default=dict)
    published_version: Mapped[int | None] = mapped_column(Integer, default=None)
    #: ``synthesis_params`` of the published version, restored when a re-synthesis with
    #: other parameters fails or is cancelled.
    published_synthesis_params: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    measured_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    #: The upper bound on the bytes of the files of the release's latest synthesis run,
    #: requested or re-synthesised (``Mechanism.artifact_bytes``): counted against its
    #: curator's ``CURATOR_MAX_CURATOR_BYTES`` while the run is queued or going.
    predicted_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    #: The bytes its synthesis versions on disk took when the last one was published (that
    #: version and the one it replaced, which is kept a publish longer; whole blocks): 0
    #: until then. Releases published before this was recorded (migration 0014) have it
    #: filled in by the worker's sweeper after a start (``stages.fill_stored_bytes``).
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    #: When its curator deleted its published files (``DELETE
    #: /v1/releases/{id}/artifacts``): downloads and answers are 410 ``files_deleted``
    #: until a re-synthesis publishes a version again, which clears it. The measurements
    #: and the spend stay (migration 0015).
    files_deleted_at: Mapped[datetime | None] = mapped_column(default=None)

    @property
    def has_published(self) -> bool:
        """Whether a version of it was published: one is served, or its curator deleted
        its files since (a synthesis run of it is then a re-synthesis)."""
        return self.published_version is not None or self.files_deleted_at is not None


class ReleaseMeasurement(Base):
    """The noisy measurements of a release: written once, in the transaction that commits
    the spend; every later stage reads only this."""

    __tablename__ = "release_measurements"

    release_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("releases.id"), primary_key=True)
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
