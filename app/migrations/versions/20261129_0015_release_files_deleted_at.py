"""releases: files_deleted_at

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29

A curator can delete a release's published files (``DELETE /v1/releases/{id}/artifacts``)
to free their storage (``CURATOR_MAX_CURATOR_BYTES``): ``files_deleted_at`` records when,
so downloads and answers say why there is nothing to serve (410 ``files_deleted``) rather
than "not succeeded yet". Existing releases get NULL: none had its files deleted.

The code before 0015 knows no deleted files: a release whose files were deleted reads
there as succeeded with no published version, whose downloads said "the release is
succeeded; artifacts exist once it succeeded". The downgrade says why in its ``message``
(what its downloads do not) before the column goes.
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


#: The message the downgrade gives a release whose files were deleted.
DELETED_MESSAGE = (
    "its files were deleted by its curator; re-synthesise it (no budget) to publish them again"
)


def downgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE releases SET message = :message "
            "WHERE files_deleted_at IS NOT NULL AND published_version IS NULL"
        ).bindparams(message=DELETED_MESSAGE)
    )
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("files_deleted_at")
