"""release lifecycle: leases, progress, idempotency, measurements

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

release_measurements rows are immutable (triggers refuse UPDATE and DELETE): once noisy
measurements exist, nothing can replace them. New NOT NULL columns get server defaults
so that existing releases migrate.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _measurement_triggers(create: bool) -> None:
    dialect = op.get_bind().dialect.name
    table = "release_measurements"
    if dialect == "postgresql":
        if create:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION curator_refuse_change()"
            )
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    elif dialect == "sqlite":
        for action in ("UPDATE", "DELETE"):
            if create:
                op.execute(
                    f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
                )
            else:
                op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{action.lower()}")


def upgrade() -> None:
    op.create_table('release_measurements',
    sa.Column('release_id', sa.Uuid(), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['release_id'], ['releases.id'], name=op.f('fk_release_measurements_release_id_releases')),
    sa.PrimaryKeyConstraint('release_id', name=op.f('pk_release_measurements'))
    )
    _measurement_triggers(create=True)
    with op.batch_alter_table('releases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('columns', sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
        batch_op.add_column(sa.Column('seed', sa.BigInteger(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('idempotency_key', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('request_hash', sa.String(length=64), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('progress', sa.Float(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('message', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('lease_owner', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('attempts', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('cancel_requested', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('resolved', sa.JSON(), nullable=False, server_default=sa.text("'{}'")))
        batch_op.add_column(sa.Column('privacy_cost', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('synthesis_params', sa.JSON(), nullable=False, server_default=sa.text("'{}'")))
        batch_op.add_column(sa.Column('synthesis_version', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('artifacts', sa.JSON(), nullable=False, server_default=sa.text("'{}'")))
        batch_op.add_column(sa.Column('measured_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index('ix_releases_status_lease', ['status', 'lease_expires_at'], unique=False)
        batch_op.create_index('uq_releases_idempotency', ['created_by', 'idempotency_key'], unique=True, sqlite_where=sa.text('idempotency_key IS NOT NULL'), postgresql_where=sa.text('idempotency_key IS NOT NULL'))



def downgrade() -> None:
    count = op.get_bind().execute(sa.text("SELECT COUNT(*) FROM release_measurements")).scalar_one()
    if count:
        raise RuntimeError(
            f"{count} stored measurements exist; they are immutable (measure once) and this "
            "downgrade would drop them"
        )
    with op.batch_alter_table('releases', schema=None) as batch_op:
        batch_op.drop_index('uq_releases_idempotency', sqlite_where=sa.text('idempotency_key IS NOT NULL'), postgresql_where=sa.text('idempotency_key IS NOT NULL'))
        batch_op.drop_index('ix_releases_status_lease')
        batch_op.drop_column('finished_at')
        batch_op.drop_column('measured_at')
        batch_op.drop_column('artifacts')
        batch_op.drop_column('synthesis_version')
        batch_op.drop_column('synthesis_params')
        batch_op.drop_column('privacy_cost')
        batch_op.drop_column('resolved')
        batch_op.drop_column('cancel_requested')
        batch_op.drop_column('attempts')
        batch_op.drop_column('lease_expires_at')
        batch_op.drop_column('lease_owner')
        batch_op.drop_column('message')
        batch_op.drop_column('progress')
        batch_op.drop_column('request_hash')
        batch_op.drop_column('idempotency_key')
        batch_op.drop_column('seed')
        batch_op.drop_column('columns')

    _measurement_triggers(create=False)
    op.drop_table('release_measurements')
