"""initial schema: users, keys, datasets, grants, releases, ledger, audit

Revision ID: 0001
Revises: 
Create Date: 2026-11-22

The ledger and the audit log are append-only: triggers refuse UPDATE and DELETE on
ledger_entries and audit_events, on SQLite and PostgreSQL alike.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


APPEND_ONLY_TABLES = ("ledger_entries", "audit_events")


def _create_append_only_triggers() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(
            """
            CREATE FUNCTION curator_refuse_change() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
            END
            $$ LANGUAGE plpgsql
            """
        )
        for table in APPEND_ONLY_TABLES:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION curator_refuse_change()"
            )
    elif dialect == "sqlite":
        for table in APPEND_ONLY_TABLES:
            for action in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
                )


def _drop_append_only_triggers() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        for table in APPEND_ONLY_TABLES:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        op.execute("DROP FUNCTION IF EXISTS curator_refuse_change()")
    elif dialect == "sqlite":
        for table in APPEND_ONLY_TABLES:
            for action in ("update", "delete"):
                op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{action}")


def upgrade() -> None:
    op.create_table('users',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("role IN ('admin', 'curator', 'analyst')", name=op.f('ck_users_role')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users'))
    )
    op.create_table('api_keys',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('user_id', sa.Uuid(), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_api_keys_user_id_users')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash'))
    )
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_keys_user_id'), ['user_id'], unique=False)

    op.create_table('audit_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('actor_id', sa.Uuid(), nullable=True),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('object_type', sa.String(length=32), nullable=False),
    sa.Column('object_id', sa.String(length=64), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['actor_id'], ['users.id'], name=op.f('fk_audit_events_actor_id_users')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events'))
    )
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_events_actor_id'), ['actor_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_audit_events_created_at'), ['created_at'], unique=False)

    op.create_table('datasets',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('owner_id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('columns', sa.JSON(), nullable=False),
    sa.Column('n_rows', sa.Integer(), nullable=False),
    sa.Column('out_of_bounds', sa.String(length=8), nullable=False),
    sa.Column('epsilon_total', sa.BigInteger(), nullable=False),
    sa.Column('delta_total', sa.BigInteger(), nullable=False),
    sa.Column('storage_name', sa.String(length=200), nullable=False),
    sa.Column('validation', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("out_of_bounds IN ('clip', 'reject')", name=op.f('ck_datasets_out_of_bounds')),
    sa.CheckConstraint('delta_total >= 0', name=op.f('ck_datasets_delta_total_nonnegative')),
    sa.CheckConstraint('epsilon_total > 0', name=op.f('ck_datasets_epsilon_total_positive')),
    sa.ForeignKeyConstraint(['owner_id'], ['users.id'], name=op.f('fk_datasets_owner_id_users')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_datasets'))
    )
    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_datasets_owner_id'), ['owner_id'], unique=False)

    op.create_table('grants',
    sa.Column('dataset_id', sa.Uuid(), nullable=False),
    sa.Column('user_id', sa.Uuid(), nullable=False),
    sa.Column('granted_by', sa.Uuid(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_grants_dataset_id_datasets')),
    sa.ForeignKeyConstraint(['granted_by'], ['users.id'], name=op.f('fk_grants_granted_by_users')),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_grants_user_id_users')),
    sa.PrimaryKeyConstraint('dataset_id', 'user_id', name=op.f('pk_grants'))
    )
    with op.batch_alter_table('grants', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_grants_user_id'), ['user_id'], unique=False)

    op.create_table('releases',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('dataset_id', sa.Uuid(), nullable=False),
    sa.Column('mechanism', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('epsilon', sa.BigInteger(), nullable=False),
    sa.Column('delta', sa.BigInteger(), nullable=False),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('created_by', sa.Uuid(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('queued', 'measuring', 'synthesizing', 'succeeded', 'failed', 'cancelled')", name=op.f('ck_releases_status')),
    sa.ForeignKeyConstraint(['created_by'], ['users.id'], name=op.f('fk_releases_created_by_users')),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_releases_dataset_id_datasets')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_releases'))
    )
    with op.batch_alter_table('releases', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_releases_dataset_id'), ['dataset_id'], unique=False)

    op.create_table('ledger_entries',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('dataset_id', sa.Uuid(), nullable=False),
    sa.Column('release_id', sa.Uuid(), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('epsilon', sa.BigInteger(), nullable=False),
    sa.Column('delta', sa.BigInteger(), nullable=False),
    sa.Column('actor_id', sa.Uuid(), nullable=True),
    sa.Column('actor', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("kind IN ('reserve', 'commit', 'refund')", name=op.f('ck_ledger_entries_kind')),
    sa.CheckConstraint('epsilon >= 0 AND delta >= 0', name=op.f('ck_ledger_entries_amounts_nonnegative')),
    sa.ForeignKeyConstraint(['actor_id'], ['users.id'], name=op.f('fk_ledger_entries_actor_id_users')),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_ledger_entries_dataset_id_datasets')),
    sa.ForeignKeyConstraint(['release_id'], ['releases.id'], name=op.f('fk_ledger_entries_release_id_releases')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ledger_entries'))
    )
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ledger_entries_dataset_id'), ['dataset_id'], unique=False)
        batch_op.create_index('uq_ledger_entries_reserve', ['release_id'], unique=True, sqlite_where=sa.text("kind = 'reserve'"), postgresql_where=sa.text("kind = 'reserve'"))
        batch_op.create_index('uq_ledger_entries_settlement', ['release_id'], unique=True, sqlite_where=sa.text("kind IN ('commit', 'refund')"), postgresql_where=sa.text("kind IN ('commit', 'refund')"))

    _create_append_only_triggers()


def downgrade() -> None:
    count = op.get_bind().execute(sa.text("SELECT COUNT(*) FROM ledger_entries")).scalar_one()
    if count:
        raise RuntimeError(
            f"{count} ledger entries exist; the append-only ledger cannot drop them"
        )
    _drop_append_only_triggers()
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_index('uq_ledger_entries_settlement', sqlite_where=sa.text("kind IN ('commit', 'refund')"), postgresql_where=sa.text("kind IN ('commit', 'refund')"))
        batch_op.drop_index('uq_ledger_entries_reserve', sqlite_where=sa.text("kind = 'reserve'"), postgresql_where=sa.text("kind = 'reserve'"))
        batch_op.drop_index(batch_op.f('ix_ledger_entries_dataset_id'))

    op.drop_table('ledger_entries')
    with op.batch_alter_table('releases', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_releases_dataset_id'))

    op.drop_table('releases')
    with op.batch_alter_table('grants', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_grants_user_id'))

    op.drop_table('grants')
    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_datasets_owner_id'))

    op.drop_table('datasets')
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_events_created_at'))
        batch_op.drop_index(batch_op.f('ix_audit_events_actor_id'))

    op.drop_table('audit_events')
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_keys_user_id'))

    op.drop_table('api_keys')
    op.drop_table('users')
