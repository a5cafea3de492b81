"""releases keep their predicted accuracy

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

A release shows the accuracy predicted at its request (DESIGN.md section 4: "status,
progress, privacy cost, resolved parameters, accuracy"), computed from public values as
the preview's is. A nullable column: releases recorded before it have none (their
prediction is not recomputed: the code that made them may have predicted otherwise).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("accuracy", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("accuracy")
