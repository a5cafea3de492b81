"""releases: predicted_bytes and stored_bytes

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29

``CURATOR_MAX_CURATOR_BYTES`` caps what a curator's releases store: the bytes of their
published versions (``stored_bytes``, set when a version is published) and the predicted
bytes of their queued or running synthesis runs (``predicted_bytes``, set at the request
or re-synthesis). Existing releases get 0 for both: their files are not measured here (a
migration does not see the data directory), so they count from their next publish.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("predicted_bytes", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("stored_bytes", sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("stored_bytes")
        batch_op.drop_column("predicted_bytes")
