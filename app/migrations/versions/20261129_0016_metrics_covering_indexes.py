"""releases and ledger_entries: covering indexes for the metrics' aggregates

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29

``GET /metrics`` reads the installation's state at scrape time
(:func:`app.core.metrics.read_installation`): releases grouped by type and status with
their stored bytes, and the ledger's sums by kind. Without an index each is a scan of the
whole table, whose rows are wide (a release's JSON parameters and results): at 10^5
releases and 1.9 * 10^5 ledger entries the two took 118 and 127 ms on SQLite, 62 and 53
ms on PostgreSQL; with these indexes, which hold every column the queries read (SQLite
scans the covering index, PostgreSQL makes an index-only scan), 26 and 33 ms, 27 and 43
ms (2 shared cores; ``bench/results/metrics_scrape_*.md`` for the whole read). Data are
unchanged; the downgrade drops them.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_releases_mechanism_status_stored_bytes",
        "releases",
        ["mechanism", "status", "stored_bytes"],
    )
    op.create_index(
        "ix_ledger_entries_kind_epsilon_delta",
        "ledger_entries",
        ["kind", "epsilon", "delta"],
    )


def downgrade() -> None:
    op.drop_index("ix_ledger_entries_kind_epsilon_delta", table_name="ledger_entries")
    op.drop_index("ix_releases_mechanism_status_stored_bytes", table_name="releases")
