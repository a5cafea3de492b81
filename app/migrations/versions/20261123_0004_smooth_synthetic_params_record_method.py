"""smooth_synthetic releases record their method

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

``smooth_synthetic`` gained ``params.method`` with the default ``"marginals"``; releases
requested before it were all paper 000's moment method. Their stored params get
``"method": "moments"`` so that one still queued (not yet measured) is measured the way it
was requested; measured ones already follow their payload's format. Data only: no schema
change. Downgrade removes ``"method": "moments"`` again; releases made with
``"marginals"`` keep it (the code before 0004 cannot synthesise them in any case).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_releases = sa.table(
    "releases",
    sa.column("id", sa.Uuid()),
    sa.column("mechanism", sa.String(32)),
    sa.column("params", sa.JSON()),
)


def _rewrite(change: str) -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(_releases.c.id, _releases.c.params).where(
            _releases.c.mechanism == "smooth_synthetic"
        )
    ).all()
    for release_id, params in rows:
        params = dict(params or {})
        if change == "add" and "method" not in params:
            params["method"] = "moments"
        elif change == "remove" and params.get("method") == "moments":
            del params["method"]
        else:
            continue
        bind.execute(
            _releases.update().where(_releases.c.id == release_id).values(params=params)
        )


def upgrade() -> None:
    _rewrite("add")


def downgrade() -> None:
    _rewrite("remove")
