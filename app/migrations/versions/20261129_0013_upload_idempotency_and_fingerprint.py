"""uploads: Idempotency-Key and a keyed fingerprint of the file

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29

``POST /v1/datasets`` takes an ``Idempotency-Key``: a retried upload (its response lost
to a proxy timeout) returns the dataset it created instead of a second dataset of the
same rows with a budget of its own. ``idempotency_key`` is unique per curator (a partial
unique index, as the releases'), ``request_hash`` is a SHA-256 of the declaration, and
``fingerprint`` an HMAC-SHA256 of the file's bytes under a key derived from the data key
(never a plain hash, which would confirm a guessed table). Existing datasets keep nulls.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("request_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("fingerprint", sa.String(length=64), nullable=True))
        batch_op.create_index(
            "uq_datasets_idempotency",
            ["owner_id", "idempotency_key"],
            unique=True,
            sqlite_where=sa.text("idempotency_key IS NOT NULL"),
            postgresql_where=sa.text("idempotency_key IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_datasets_owner_id_fingerprint", ["owner_id", "fingerprint"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index("ix_datasets_owner_id_fingerprint")
        batch_op.drop_index(
            "uq_datasets_idempotency",
            sqlite_where=sa.text("idempotency_key IS NOT NULL"),
            postgresql_where=sa.text("idempotency_key IS NOT NULL"),
        )
        batch_op.drop_column("fingerprint")
        batch_op.drop_column("request_hash")
        batch_op.drop_column("idempotency_key")
