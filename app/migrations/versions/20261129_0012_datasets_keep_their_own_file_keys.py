"""datasets keep their own file keys, forgotten when their data are deleted

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29

A dataset's file was encrypted with data keys wrapped by the service's key
(``CURATOR_DATA_KEY``), so deleting the data (``DELETE /v1/datasets/{id}/data``) unlinked
the file but any copy of it, or its blocks left on the disk, still opened with that key.
From this revision each upload's file is encrypted under a key of its own, kept in
``datasets.file_keys`` sealed with the service key and set to null when the data are
deleted (crypto-shredding). Existing datasets keep null: their files open with the
service key as before, until ``curator rotate-data-key`` gives them keys of their own.

A downgrade refuses while any dataset has file keys: the code before this revision opens
files with the service key alone, and would find those files unreadable.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("file_keys", sa.Text(), nullable=True))


def downgrade() -> None:
    count = op.get_bind().execute(
        sa.text("SELECT COUNT(*) FROM datasets WHERE file_keys IS NOT NULL")
    ).scalar_one()
    if count:
        raise RuntimeError(
            f"{count} datasets' files are encrypted under keys of their own, which revision "
            "0011 does not know: it would find those files unreadable"
        )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_column("file_keys")
