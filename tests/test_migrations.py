"""Alembic: upgrade an empty database to head, down to base and up again; models match."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from app.core import migrations
from app.core.db import make_engine
from app.models import Base
from tests.conftest import temporary_postgres


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    with temporary_postgres() as url:
        yield url


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


def test_upgrade_and_downgrade_with_data_in_place(empty_database: str) -> None:
    """Rows written under 0001 survive 0002 (new NOT NULL columns get defaults) and back."""
    import uuid

    from sqlalchemy import MetaData, select

    url = empty_database
    migrations.upgrade(url, "0001")
    engine = make_engine(url)
    ids = {name: uuid.uuid4() for name in ("user", "dataset", "release")}
    try:
        meta = MetaData()
        meta.reflect(engine)
        users, datasets, releases = (meta.tables[n] for n in ("users", "datasets", "releases"))
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        with engine.begin() as connection:
            connection.execute(
                users.insert().values(id=ids["user"].hex, name="u", role="curator", created_at=now)
            )
            connection.execute(
                datasets.insert().values(
                    id=ids["dataset"].hex,
                    owner_id=ids["user"].hex,
                    name="d",
                    kind="table",
                    columns=[],
                    n_rows=3,
                    out_of_bounds="clip",
                    epsilon_total=10,
                    delta_total=0,
                    storage_name="s",
                    validation={},
                    created_at=now,
                )
            )
            connection.execute(
                releases.insert().values(
                    id=ids["release"].hex,
                    dataset_id=ids["dataset"].hex,
                    mechanism="m",
                    status="queued",
                    epsilon=1,
                    delta=0,
                    params={"a": 1},
                    created_by=ids["user"].hex,
                    created_at=now,
                    updated_at=now,
                )
            )
    finally:
        engine.dispose()
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        with engine.connect() as connection:
            row = connection.execute(select(meta.tables["releases"])).mappings().one()
        assert row["params"] == {"a": 1}
        assert (row["seed"], row["attempts"], row["progress"], row["cancel_requested"]) == (
            0,
            0,
            0.0,
            False,
        )
        assert row["columns"] == []
        assert row["artifacts"] == {}
    finally:
        engine.dispose()
    migrations.downgrade(url, "0001")
    engine = make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        with engine.connect() as connection:
            assert (
                connection.execute(select(meta.tables["releases"].c.mechanism)).scalar_one() == "m"
            )
    finally:
        engine.dispose()
