"""releases record when a measure attempt started reading

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

A measure attempt whose worker died may have read the data, so a later attempt that ends
without measurements kept the spend (DESIGN rule 6: refund only if nothing was measured),
even when the dead attempt died before opening the data. ``read_started_at`` is set, in a
transaction of its own, before an attempt opens the data file; a release whose earlier
attempts never set it is refunded. Releases recorded before this column with any attempt
(or a measurement) get it set from ``updated_at``: their attempts may have read.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("read_started_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE releases SET read_started_at = updated_at "
        "WHERE attempts > 0 OR measured_at IS NOT NULL"
    )


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("read_started_at")
