"""datasets record when their data were deleted

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25

``DELETE /v1/datasets/{id}/data`` removes a dataset's stored rows (its encrypted file)
and keeps everything else: the declaration, the append-only ledger, the releases and
their measurements. ``data_deleted_at`` records it; a dataset with it set takes no new
release. A downgrade refuses while any dataset has it: without the column the service
would take such a dataset for one whose data are still there.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("data_deleted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    count = op.get_bind().execute(
        sa.text("SELECT COUNT(*) FROM datasets WHERE data_deleted_at IS NOT NULL")
    ).scalar_one()
    if count:
        raise RuntimeError(
            f"the data of {count} datasets were deleted; revision 0008 cannot record it, "
            "and would take them for datasets whose data are still stored"
        )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_column("data_deleted_at")
