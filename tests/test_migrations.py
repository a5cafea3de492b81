"""Alembic: upgrade an empty database to head, down to base and up again; models match."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from app.core import migrations
from app.core.db import make_engine
from app.models import Base


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    if not os.environ.get("CURATOR_TEST_DATABASE_URL"):
        pytest.skip("PostgreSQL lane: CURATOR_TEST_DATABASE_URL is not set")
    url: str = request.getfixturevalue("postgres_url")
    migrations.downgrade(url, "base")
    return url


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_database: str) -> None:
    url = empty_database
    assert _tables(url) == set()
    migrations.upgrade(url)
    assert migrations.current_revision(url) == migrations.head_revision(url)
    assert _tables(url) == set(Base.metadata.tables)
    migrations.downgrade(url, "base")
    assert _tables(url) == set()
    assert migrations.current_revision(url) is None
    migrations.upgrade(url)
    assert _tables(url) == set(Base.metadata.tables)


def test_models_and_migrations_agree(empty_database: str) -> None:
    migrations.upgrade(empty_database)
    engine = make_engine(empty_database)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()
