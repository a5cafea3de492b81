"""releases: files_deleted_at

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29

A curator can delete a release's published files (``DELETE /v1/releases/{id}/artifacts``)
to free their storage (``CURATOR_MAX_CURATOR_BYTES``): ``files_deleted_at`` records when,
so downloads and answers say why there is nothing to serve (410 ``files_deleted``) rather
than "not succeeded yet". Existing releases get NULL: none had its files deleted.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("files_deleted_at", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("files_deleted_at")
