"""releases keep their published version through a re-synthesis

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25

A re-synthesis moved a succeeded release to ``synthesizing`` and, if it failed or was
cancelled, left it ``failed`` or ``cancelled``: downloads and answers refused (409) the
version already released, although its files were still on disk. ``published_version``
names the version served, and ``published_synthesis_params`` its parameters, which a failed
or cancelled re-synthesis restores. Succeeded releases get both from their current
version. Others get none: under the old code a release that is not succeeded serves
nothing (its earlier files, if any, are removed when a version next succeeds).

The code before 0008 serves ``synthesis_version``. A failed or cancelled re-synthesis
leaves a release ``succeeded`` with ``synthesis_version`` at the run that was never
published (its files discarded) and ``published_version`` at the one served, so the
downgrade points ``synthesis_version`` of a succeeded release back at its published
version (its ``synthesis_params`` are already that version's): otherwise every download
of it is a 404 under that code.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("published_version", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("published_synthesis_params", sa.JSON(), nullable=True))
    op.execute(
        "UPDATE releases SET published_version = synthesis_version, "
        "published_synthesis_params = synthesis_params WHERE status = 'succeeded'"
    )


def downgrade() -> None:
    op.execute(
        "UPDATE releases SET synthesis_version = published_version "
        "WHERE status = 'succeeded' AND published_version IS NOT NULL"
    )
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("published_synthesis_params")
        batch_op.drop_column("published_version")
