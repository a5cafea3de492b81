"""indexes for the list endpoints' page order

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25

Every list endpoint now pages by keyset (``app.core.pagination``): a dataset's releases
and grants and a curator's datasets by ``(created_at, id)`` within the owning dataset or
curator, the users by ``(created_at, id)``, a dataset's ledger entries by id. One index
per order, so that a page is a range scan of ``limit + 1`` index entries however deep it
is, instead of a sort of the whole collection. Indexes only: no data changes, and the
downgrade drops them.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (index, table, columns)
INDEXES = (
    ("ix_users_created_at_id", "users", ["created_at", "id"]),
    ("ix_datasets_owner_id_created_at_id", "datasets", ["owner_id", "created_at", "id"]),
    ("ix_grants_dataset_id_created_at_user_id", "grants", ["dataset_id", "created_at", "user_id"]),
    ("ix_releases_dataset_id_created_at_id", "releases", ["dataset_id", "created_at", "id"]),
    ("ix_ledger_entries_dataset_id_id", "ledger_entries", ["dataset_id", "id"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns, unique=False)


def downgrade() -> None:
    for name, table, _columns in reversed(INDEXES):
        op.drop_index(name, table_name=table)
