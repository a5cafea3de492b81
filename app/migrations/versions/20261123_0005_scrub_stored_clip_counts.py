"""stored validation reports keep no clip counts

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

The number of values clipped per column is an exact statistic of the data. It is now
reported in the upload's response only (privacy rule 5); datasets uploaded before kept it
in ``datasets.validation``. This sets ``"clipped": null`` in every stored report. Data
only: no schema change. The counts are gone for good. The code before 0005 declares
``clipped`` a mapping (``dict[str, int]``, not optional): a null there made every listing
or read of the dataset a 500 under that code, so the downgrade writes an empty mapping
where a report has null (no counts, not "nothing clipped"; 0005 nulls it again).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_datasets = sa.table(
    "datasets",
    sa.column("id", sa.Uuid()),
    sa.column("validation", sa.JSON()),
)


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.select(_datasets.c.id, _datasets.c.validation)).all()
    for dataset_id, validation in rows:
        if isinstance(validation, dict) and validation.get("clipped") is not None:
            scrubbed = {**validation, "clipped": None}
            bind.execute(
                _datasets.update().where(_datasets.c.id == dataset_id).values(validation=scrubbed)
            )


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.select(_datasets.c.id, _datasets.c.validation)).all()
    for dataset_id, validation in rows:
        if isinstance(validation, dict) and validation.get("clipped") is None:
            readable = {**validation, "clipped": {}}
            bind.execute(
                _datasets.update().where(_datasets.c.id == dataset_id).values(validation=readable)
            )
