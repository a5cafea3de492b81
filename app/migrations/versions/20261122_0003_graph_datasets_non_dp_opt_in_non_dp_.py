"""graph datasets, non-DP opt-in, non_dp ledger entries

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

Datasets get a kind check ('table' or 'graph'), a public vertex count for graphs and the
curator's opt-in to non-DP releases. The ledger accepts 'non_dp' entries, which must
carry zero amounts (they are records, never part of an epsilon or delta sum). On SQLite
the ledger table is rebuilt to change its CHECK constraints, so its append-only triggers
are created again afterwards. Downgrading fails if 'non_dp' entries exist (the ledger is
append-only: they cannot be removed).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = "kind IN ('reserve', 'commit', 'refund')"
NEW_KINDS = "kind IN ('reserve', 'commit', 'refund', 'non_dp')"


def _sqlite_ledger_triggers() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for action in ("UPDATE", "DELETE"):
        name = f"ledger_entries_no_{action.lower()}"
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute(
            f"CREATE TRIGGER {name} BEFORE {action} ON ledger_entries "
            "BEGIN SELECT RAISE(ABORT, 'ledger_entries is append-only'); END"
        )


def _ledger_kinds(old: str, new: str, *, non_dp_free: bool) -> None:
    with op.batch_alter_table("ledger_entries", recreate="auto") as batch_op:
        batch_op.drop_constraint(op.f("ck_ledger_entries_kind"), type_="check")
        batch_op.create_check_constraint(op.f("ck_ledger_entries_kind"), sa.text(new))
        if non_dp_free:
            batch_op.create_check_constraint(
                op.f("ck_ledger_entries_non_dp_free"),
                sa.text("kind != 'non_dp' OR (epsilon = 0 AND delta = 0)"),
            )
        else:
            batch_op.drop_constraint(op.f("ck_ledger_entries_non_dp_free"), type_="check")
    _sqlite_ledger_triggers()


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("n_vertices", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column(
                "allow_non_dp_releases", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )
        batch_op.create_check_constraint(op.f("ck_datasets_kind"), sa.text("kind IN ('table', 'graph')"))
    _ledger_kinds(OLD_KINDS, NEW_KINDS, non_dp_free=True)


def downgrade() -> None:
    count = op.get_bind().execute(
        sa.text("SELECT COUNT(*) FROM ledger_entries WHERE kind = 'non_dp'")
    ).scalar_one()
    if count:
        raise RuntimeError(
            f"{count} non_dp ledger entries exist; the append-only ledger cannot drop them"
        )
    _ledger_kinds(NEW_KINDS, OLD_KINDS, non_dp_free=False)
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_datasets_kind"), type_="check")
        batch_op.drop_column("allow_non_dp_releases")
        batch_op.drop_column("n_vertices")
