"""Releases: one mechanism run on one dataset, with its reserved budget."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, new_id, utcnow

RELEASE_STATUSES = ("queued", "measuring", "synthesizing", "succeeded", "failed", "cancelled")


class Release(Base):
    __tablename__ = "releases"
    __table_args__ = (
        CheckConstraint(
            "status IN ('queued', 'measuring', 'synthesizing', 'succeeded', 'failed', 'cancelled')",
            name="status",
        ),
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
