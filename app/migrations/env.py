"""Alembic environment: the URL comes from ``config.attributes["url"]`` (tests, the CLI)
or from the service settings; the engine is the service's own (same SQLite pragmas)."""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import text

from app.config import load_settings
from app.core.db import make_engine
from app.models import Base
from app.models.base import UTCDateTime

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata

#: The PostgreSQL advisory lock a migration holds for its transaction ("curator").
MIGRATION_LOCK = 0x63757261746F72


def _render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render the service's column types as plain SQLAlchemy types, so that migrations
    never import application code."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _url() -> str:
    url = config.attributes.get("url")
    return str(url) if url else load_settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        compare_type=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            raw = connection.connection.driver_connection
            if sqlite and raw is not None:
                # Batch migrations rebuild tables (copy, drop, rename); with foreign keys on,
                # dropping a referenced table fails. Alembic's documented recipe: switch them
                # off (outside any transaction) and check integrity afterwards.
                raw.execute("PRAGMA foreign_keys=OFF")
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                compare_type=True,
                render_item=_render_item,
                render_as_batch=sqlite,
                # One transaction for the whole command on SQLite too (its DDL is
                # transactional; Alembic assumes otherwise): a migration that refuses, or
                # fails, part-way through a multi-step upgrade or downgrade leaves the
                # database where it was, not at some revision in between.
                transactional_ddl=True,
            )
            with context.begin_transaction():
                if not sqlite:
                    # Concurrent migrators (two `curator serve` starting at once) take turns:
                    # the second reads the version table once the first has committed
                    # (READ COMMITTED) and finds nothing to do. SQLite's BEGIN IMMEDIATE
                    # already serialises them.
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK}
                    )
                context.run_migrations()
            if sqlite and raw is not None:
                violations = raw.execute("PRAGMA foreign_key_check").fetchall()
                raw.execute("PRAGMA foreign_keys=ON")
                if violations:
                    raise RuntimeError(f"foreign key violations after migrating: {violations}")
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
