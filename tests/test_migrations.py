"""Alembic: upgrade an empty database to head, down to base and up again; models match."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
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


def _owner_and_dataset(
    connection: Any, users: Any, datasets: Any, user: uuid.UUID, dataset: uuid.UUID, now: Any
) -> None:
    """A curator and an (empty) table dataset of theirs, written with core inserts (the
    models may be ahead of the revision under test)."""
    connection.execute(users.insert().values(id=user.hex, name="u", role="curator", created_at=now))
    connection.execute(
        datasets.insert().values(
            id=dataset.hex,
            owner_id=user.hex,
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


def _releases_at(url: str, revision: str, releases: dict[uuid.UUID, dict[str, Any]]) -> None:
    """At ``revision``: an owner, a dataset and one queued release per entry of
    ``releases`` (its columns beyond the required ones), written with core inserts."""
    from datetime import UTC, datetime

    from sqlalchemy import MetaData

    migrations.upgrade(url, revision)
    engine = make_engine(url)
    now = datetime.now(UTC)
    user, dataset = uuid.uuid4(), uuid.uuid4()
    try:
        meta = MetaData()
        meta.reflect(engine)
        users, datasets, table = (meta.tables[n] for n in ("users", "datasets", "releases"))
        with engine.begin() as connection:
            _owner_and_dataset(connection, users, datasets, user, dataset, now)
            for release_id, columns in releases.items():
                required = {
                    "id": release_id.hex,
                    "dataset_id": dataset.hex,
                    "status": "queued",
                    "epsilon": 1,
                    "delta": 0,
                    "created_by": user.hex,
                    "created_at": now,
                    "updated_at": now,
                }
                connection.execute(table.insert().values(**(required | columns)))
    finally:
        engine.dispose()


def _release_column(
    url: str, column: str, table: str = "releases", key: str = "id"
) -> dict[uuid.UUID, Any]:
    """``table.column`` by release id (``table.key``; reflected, as :func:`_scalar`)."""
    from sqlalchemy import MetaData, select

    engine = make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        reflected = meta.tables[table]
        with engine.connect() as connection:
            rows = connection.execute(select(reflected.c[key], reflected.c[column])).all()
    finally:
        engine.dispose()
    return {uuid.UUID(str(row[0])): row[1] for row in rows}


def _scalar(url: str, table: str, column: str) -> Any:
    """The one value of ``table.column`` (reflected: the models may be ahead of the
    revision under test)."""
    from sqlalchemy import MetaData, select

    engine = make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        with engine.connect() as connection:
            return connection.execute(select(meta.tables[table].c[column])).scalar_one()
    finally:
        engine.dispose()


def test_the_package_carries_its_migrations() -> None:
    """An install that is not a checkout migrates with what the package holds: the default
    config sits in ``app/migrations`` and the non-Python files there are package data
    (``.ci/run`` builds the wheel and migrates from it outside the repository)."""
    import tomllib

    import app

    package = Path(app.__file__).resolve().parent
    assert migrations.alembic_ini() == package / "migrations" / "alembic.ini"
    assert (package / "migrations" / "env.py").is_file()
    assert list((package / "migrations" / "versions").glob("*_0001_*.py"))
    root = package.parent / "pyproject.toml"
    declared = tomllib.loads(root.read_text())["tool"]["setuptools"]["package-data"]["app"]
    for name in ("alembic.ini", "script.py.mako"):
        assert f"migrations/{name}" in declared
        assert (package / "migrations" / name).is_file()


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


def test_concurrent_upgrades_both_succeed(empty_database: str) -> None:
    """Two processes migrating one database at once (two ``curator serve`` replicas
    starting, or ``serve`` beside ``curator migrate``): on PostgreSQL the second used to
    fail with 'duplicate key value violates unique constraint "pg_type_typname_nsp_index"'
    (both created the tables). One waits for the other and finds the database at head."""
    url = empty_database
    script = "import sys; from app.core import migrations; migrations.upgrade(sys.argv[1])"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=120)[0].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    assert migrations.current_revision(url) == migrations.head_revision(url)
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
            _owner_and_dataset(connection, users, datasets, ids["user"], ids["dataset"], now)
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
    assert _scalar(url, "releases", "mechanism") == "m"


def test_0004_records_the_method_of_earlier_smooth_synthetic_releases(
    empty_database: str,
) -> None:
    """Releases requested before ``params.method`` existed were moment releases; 0004 says
    so in their params (other mechanisms untouched) and its downgrade takes it back."""
    url = empty_database
    releases_in = {
        uuid.uuid4(): ("smooth_synthetic", {"grid_size": 500}),
        uuid.uuid4(): ("smooth_synthetic", {"method": "marginals"}),
        uuid.uuid4(): ("smooth_synopsis", {"basis": "auto"}),
    }
    _releases_at(
        url,
        "0003",
        {r: {"mechanism": m, "params": params} for r, (m, params) in releases_in.items()},
    )
    old, marg, other = releases_in
    migrations.upgrade(url, "0004")
    after = _release_column(url, "params")
    assert after[old] == {"grid_size": 500, "method": "moments"}
    assert after[marg] == {"method": "marginals"}
    assert after[other] == {"basis": "auto"}
    migrations.downgrade(url, "0003")
    back = _release_column(url, "params")
    assert back[old] == {"grid_size": 500}
    assert back[marg] == {"method": "marginals"}
    assert back[other] == {"basis": "auto"}


def test_0005_scrubs_stored_clip_counts(empty_database: str) -> None:
    """Reports stored before 0005 held exact clip counts; 0005 sets them to null and leaves
    the rest of the report (and reports without counts) as they were."""
    import uuid
    from datetime import UTC, datetime

    from sqlalchemy import MetaData

    url = empty_database
    migrations.upgrade(url, "0004")
    engine = make_engine(url)
    now = datetime.now(UTC)
    user, dataset = uuid.uuid4(), uuid.uuid4()
    try:
        meta = MetaData()
        meta.reflect(engine)
        users, datasets = meta.tables["users"], meta.tables["datasets"]
        with engine.begin() as connection:
            _owner_and_dataset(connection, users, datasets, user, dataset, now)
            report = {"format": "csv", "n_rows": 3, "clipped": {"age": 2}}
            connection.execute(
                datasets.update().where(datasets.c.id == dataset.hex).values(validation=report)
            )
    finally:
        engine.dispose()
    migrations.upgrade(url, "0005")
    stored = _scalar(url, "datasets", "validation")
    assert stored == {"format": "csv", "n_rows": 3, "clipped": None}
    migrations.downgrade(url, "0004")


def test_0005_downgrade_leaves_reports_the_code_before_it_reads(empty_database: str) -> None:
    """The code before 0005 reads ``clipped`` as a required mapping (``dict[str, int]``):
    the null that 0005 and every later upload store made its dataset reads a 500 after a
    downgrade (found by serving a database downgraded from head with the code of 0003).
    The downgrade stores an empty mapping instead, and 0005 nulls it again."""
    from pydantic import TypeAdapter
    from sqlalchemy import MetaData

    url = empty_database
    migrations.upgrade(url, "0005")
    engine = make_engine(url)
    now = datetime.now(UTC)
    try:
        meta = MetaData()
        meta.reflect(engine)
        users, datasets = meta.tables["users"], meta.tables["datasets"]
        with engine.begin() as connection:
            _owner_and_dataset(connection, users, datasets, uuid.uuid4(), uuid.uuid4(), now)
            report = {"format": "csv", "n_rows": 3, "clipped": None}
            connection.execute(datasets.update().values(validation=report))
    finally:
        engine.dispose()
    migrations.downgrade(url, "0004")
    stored = _scalar(url, "datasets", "validation")
    assert stored == {"format": "csv", "n_rows": 3, "clipped": {}}
    TypeAdapter(dict[str, int]).validate_python(stored["clipped"])  # the field before 0005
    migrations.upgrade(url, "0005")
    assert _scalar(url, "datasets", "validation")["clipped"] is None


def test_0007_marks_earlier_attempts_as_possibly_read(empty_database: str) -> None:
    """Releases recorded before 0007 with a measure attempt (or a measurement) may have
    read the data: 0007 sets their ``read_started_at``; a release never claimed keeps it
    null, so a later end before reading refunds it."""
    url = empty_database
    attempts = {uuid.uuid4(): 0, uuid.uuid4(): 1, uuid.uuid4(): 3}
    _releases_at(
        url,
        "0006",
        {
            release_id: {
                "mechanism": "smooth_synthetic",
                "status": "queued" if count == 0 else "measuring",
                "params": {"method": "marginals"},
                "attempts": count,
            }
            for release_id, count in attempts.items()
        },
    )
    migrations.upgrade(url, "0007")
    started = {r: value is not None for r, value in _release_column(url, "read_started_at").items()}
    assert started == {release_id: count > 0 for release_id, count in attempts.items()}
    migrations.downgrade(url, "0006")


def test_0008_publishes_the_current_version_of_succeeded_releases(empty_database: str) -> None:
    """0008: a succeeded release serves its current synthesis version, with its current
    parameters; a release in any other state (a re-synthesis going, failed, cancelled)
    serves nothing, as before."""
    url = empty_database
    states = {uuid.uuid4(): s for s in ("succeeded", "synthesizing", "failed", "cancelled")}
    _releases_at(
        url,
        "0007",
        {
            release_id: {
                "mechanism": "smooth_synthetic",
                "status": status,
                "params": {"method": "marginals"},
                "synthesis_params": {"grid_size": 500},
                "synthesis_version": 2,
            }
            for release_id, status in states.items()
        },
    )
    migrations.upgrade(url, "0008")
    versions = _release_column(url, "published_version")
    params = _release_column(url, "published_synthesis_params")
    for release_id, status in states.items():
        if status == "succeeded":
            assert versions[release_id] == 2
            assert params[release_id] == {"grid_size": 500}
        else:
            assert versions[release_id] is None
            assert params[release_id] is None
    migrations.downgrade(url, "0007")


def test_0008_downgrade_serves_the_published_version(empty_database: str) -> None:
    """A cancelled or failed re-synthesis leaves a release succeeded, serving its published
    version, with ``synthesis_version`` at the run never published. The code before 0008
    serves ``synthesis_version``: after the downgrade every download of such a release was
    a 404 (found by serving, with the code of 0005, a database downgraded from head after
    a re-synthesis was cancelled there). The downgrade points it back at the published
    version; a re-synthesis still going keeps its own."""
    url = empty_database
    cancelled_run, running = uuid.uuid4(), uuid.uuid4()
    _releases_at(
        url,
        "0008",
        {
            release_id: {
                "mechanism": "smooth_synthetic",
                "status": status,
                "params": {"method": "marginals"},
                "synthesis_params": {"sample_size": 50},
                "synthesis_version": 2,
                "published_version": 1,
                "published_synthesis_params": {"sample_size": 50},
            }
            for release_id, status in ((cancelled_run, "succeeded"), (running, "synthesizing"))
        },
    )
    migrations.downgrade(url, "0007")
    assert _release_column(url, "synthesis_version") == {cancelled_run: 1, running: 2}
    migrations.upgrade(url, "0008")
    assert _release_column(url, "published_version") == {cancelled_run: 1, running: None}


#: Revisions that add a nullable column of ``datasets`` (null for every dataset already
#: there) whose downgrade refuses while a dataset has a value in it: (revision, column,
#: a value, the refusal).
REFUSING_DATASET_COLUMNS = [
    # the code before it would take a dataset whose data were deleted for a stored one
    ("0009", "data_deleted_at", datetime.now(UTC), "the data of 1 datasets were deleted"),
    # the code before it opens files with the service key alone
    ("0012", "file_keys", "a sealed key", "1 datasets' files are encrypted under keys of"),
]


@pytest.mark.parametrize(("revision", "column", "value", "refusal"), REFUSING_DATASET_COLUMNS)
def test_a_downgrade_refuses_while_a_dataset_has_the_column_it_drops(
    empty_database: str, revision: str, column: str, value: Any, refusal: str
) -> None:
    """The revision adds ``column`` (null for every dataset); its downgrade refuses while
    a dataset has a value there, changing nothing, and goes once none has."""
    from sqlalchemy import MetaData, update

    url = empty_database
    before = f"{int(revision) - 1:04d}"
    _head_with_a_release(url, ["reserve", "commit"], measured=False)
    engine = make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        datasets = meta.tables["datasets"]
        with engine.begin() as connection:
            connection.execute(update(datasets).values({column: value}))
        head = migrations.current_revision(url)
        with pytest.raises(RuntimeError, match=refusal):
            migrations.downgrade(url, before)
        assert migrations.current_revision(url) == head
        with engine.begin() as connection:
            connection.execute(update(datasets).values({column: None}))
    finally:
        engine.dispose()
    migrations.downgrade(url, before)
    assert migrations.current_revision(url) == before
    engine = make_engine(url)
    try:  # the column goes with the revision, and comes back with it
        columns = {c["name"] for c in inspect(engine).get_columns("datasets")}
        assert column not in columns
    finally:
        engine.dispose()
    migrations.upgrade(url, revision)
    assert migrations.current_revision(url) == revision
    assert _scalar(url, "datasets", column) is None


#: The indexes 0010 adds, one per list endpoint's page order, by table.
PAGE_ORDER_INDEXES = {
    "users": ("ix_users_created_at_id", ["created_at", "id"]),
    "datasets": ("ix_datasets_owner_id_created_at_id", ["owner_id", "created_at", "id"]),
    "grants": ("ix_grants_dataset_id_created_at_user_id", ["dataset_id", "created_at", "user_id"]),
    "releases": ("ix_releases_dataset_id_created_at_id", ["dataset_id", "created_at", "id"]),
    "ledger_entries": ("ix_ledger_entries_dataset_id_id", ["dataset_id", "id"]),
}


def _indexes(url: str) -> dict[str, dict[str, list[str]]]:
    """Index name -> columns, by table (reflected)."""
    engine = make_engine(url)
    try:
        inspector = inspect(engine)
        return {
            table: {str(i["name"]): list(i["column_names"]) for i in inspector.get_indexes(table)}
            for table in PAGE_ORDER_INDEXES
        }
    finally:
        engine.dispose()


def test_0010_adds_the_page_order_indexes_and_its_downgrade_drops_them(
    empty_database: str,
) -> None:
    """0010 adds one index per list order (app.core.pagination), over rows already there,
    and its downgrade drops exactly those, leaving the rows."""
    url = empty_database
    release = uuid.uuid4()
    _releases_at(url, "0009", {release: {"mechanism": "m", "params": {}}})
    before = _indexes(url)
    for table, (name, _columns) in PAGE_ORDER_INDEXES.items():
        assert name not in before[table]
    migrations.upgrade(url, "0010")
    after = _indexes(url)
    for table, (name, columns) in PAGE_ORDER_INDEXES.items():
        assert after[table][name] == columns
        assert {k: v for k, v in after[table].items() if k != name} == before[table]
    migrations.downgrade(url, "0009")
    assert _indexes(url) == before
    assert set(_release_column(url, "mechanism")) == {release}


def _measurements_at(url: str, payloads: dict[uuid.UUID, dict[str, Any]]) -> None:
    """One stored measurement per release of ``payloads`` (core inserts)."""
    from sqlalchemy import MetaData

    engine = make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        table = meta.tables["release_measurements"]
        with engine.begin() as connection:
            for release_id, payload in payloads.items():
                connection.execute(
                    table.insert().values(
                        release_id=release_id.hex, payload=payload, created_at=datetime.now(UTC)
                    )
                )
    finally:
        engine.dispose()


def _measurement_payloads(url: str) -> dict[uuid.UUID, Any]:
    return _release_column(url, "payload", "release_measurements", "release_id")


def _measurement_update_refusal(url: str) -> str:
    """The error of an UPDATE of every stored measurement ("" if none: 0002's append-only
    trigger is gone)."""
    import sqlalchemy as sa

    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("UPDATE release_measurements SET payload = payload"))
    except sa.exc.DBAPIError as exc:
        return str(exc)
    finally:
        engine.dispose()
    return ""


def _rename_update_trigger(url: str) -> None:
    """Give 0002's UPDATE trigger on release_measurements another name (an operator's
    database need not keep the name a migration gave it)."""
    import sqlalchemy as sa

    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(
                    sa.text(
                        "ALTER TRIGGER release_measurements_append_only ON release_measurements "
                        "RENAME TO kept_apart"
                    )
                )
            else:
                connection.execute(sa.text("DROP TRIGGER release_measurements_no_update"))
                connection.execute(
                    sa.text(
                        "CREATE TRIGGER kept_apart BEFORE UPDATE ON release_measurements "
                        "BEGIN SELECT RAISE(ABORT, 'release_measurements is append-only'); END"
                    )
                )
    finally:
        engine.dispose()


@pytest.mark.parametrize("renamed", [False, True], ids=["0002_trigger", "renamed_trigger"])
def test_0011_scrubs_the_alpha_of_compressed_releases_with_the_data_as_reference(
    empty_database: str, renamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """With the data as reference, alpha (two eigenvalues of the data's covariance) was
    stored in the measurement record and, before 0a3d900, reported in ``resolved``. 0011
    nulls both and leaves a declared reference's alpha, other mechanisms and the matrix
    alone; the append-only trigger (by whatever name) refuses updates again afterwards.
    Its downgrade stores infinity, which the code before f6cff34 reads as a float and
    today's code ignores."""
    from app.mechanisms.compressed import GUARANTEE, CompressedRelease
    from app.releases.adapters.compressed import DATA_REFERENCE_NOTE
    from app.releases.payloads import pack, unpack

    url = empty_database
    data, declared, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    reported = {"m": 8, "alpha": 12.5, "alpha_pairwise": 25.0, "alpha_note": None}
    _releases_at(
        url,
        "0010",
        {
            data: {
                "mechanism": "compressed",
                "params": {},
                "resolved": reported | {"reference": "data"},
            },
            declared: {
                "mechanism": "compressed",
                "params": {},
                "resolved": reported | {"reference": "declared"},
            },
            other: {"mechanism": "smooth_synopsis", "params": {}, "resolved": {"alpha": 0.5}},
        },
    )
    record = {
        "mechanism": "compressed",
        "guarantee": GUARANTEE,
        "n": 100,
        "delta_max": 0.5,
        "alpha": 12.5,
        "alpha_pairwise": 25.0,
        "matrix": pack(np.arange(8.0).reshape(4, 2)),
        "privacy_cost": {"epsilon": 0.0, "delta": 0.0},
    }
    _measurements_at(
        url,
        {
            data: record | {"reference_kind": "data"},
            declared: record | {"reference_kind": "declared"},
            other: {"alpha": 0.5, "reference_kind": "data"},
        },
    )
    if renamed:
        _rename_update_trigger(url)
    before = _measurement_payloads(url)
    with caplog.at_level(logging.WARNING, logger="curator.migrations"):
        migrations.upgrade(url, "0011")
    # the releases whose release.json still holds a reported alpha, by id
    logged = [r.getMessage() for r in caplog.records if r.name == "curator.migrations"]
    assert len(logged) == 1
    assert "1 compressed releases reported alpha" in logged[0]
    assert str(data) in logged[0]
    assert str(declared) not in logged[0]
    assert "12.5" not in logged[0]
    after = _measurement_payloads(url)
    assert after[data] == before[data] | {"alpha": None, "alpha_pairwise": None}
    assert after[declared] == before[declared]
    assert after[other] == before[other]
    resolved = _release_column(url, "resolved")
    assert resolved[data] == {
        "m": 8,
        "alpha": None,
        "alpha_pairwise": None,
        "alpha_note": DATA_REFERENCE_NOTE,
        "reference": "data",
    }
    assert resolved[declared]["alpha"] == 12.5
    assert resolved[other] == {"alpha": 0.5}
    assert "append-only" in _measurement_update_refusal(url)
    loaded = CompressedRelease.from_dict(unpack(after[data]))
    assert loaded.alpha is None
    assert np.array_equal(loaded.matrix, np.arange(8.0).reshape(4, 2))

    migrations.downgrade(url, "0010")
    back = _measurement_payloads(url)
    assert float(unpack(back[data])["alpha"]) == float("inf")  # as the code before f6cff34
    assert unpack(back[data])["alpha_pairwise"] == float("inf")
    assert back[declared] == before[declared]
    assert CompressedRelease.from_dict(unpack(back[data])).alpha is None
    assert _release_column(url, "resolved")[data]["alpha"] is None
    assert "append-only" in _measurement_update_refusal(url)
    migrations.upgrade(url, "0011")
    assert _measurement_payloads(url)[data]["alpha"] is None


def _head_with_a_release(url: str, ledger_kinds: list[str], measured: bool) -> None:
    """At head: a dataset, one release of it with ``ledger_kinds`` entries, and its stored
    measurements if ``measured``."""
    from datetime import UTC, datetime

    from sqlalchemy import MetaData

    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        now = datetime.now(UTC)
        user, dataset, release = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        with engine.begin() as connection:
            _owner_and_dataset(
                connection, meta.tables["users"], meta.tables["datasets"], user, dataset, now
            )
            connection.execute(
                meta.tables["releases"].insert(),
                {
                    "id": release.hex,
                    "dataset_id": dataset.hex,
                    "mechanism": "smooth_synthetic",
                    "status": "succeeded",
                    "epsilon": 1,
                    "delta": 0,
                    "params": {"method": "moments"},
                    "created_by": user.hex,
                    "created_at": now,
                    "updated_at": now,
                },
            )
            for kind in ledger_kinds:
                connection.execute(
                    meta.tables["ledger_entries"].insert(),
                    {
                        "dataset_id": dataset.hex,
                        "release_id": release.hex,
                        "kind": kind,
                        "epsilon": 0 if kind == "non_dp" else 1,
                        "delta": 0,
                        "actor": "worker",
                        "created_at": now,
                    },
                )
            if measured:
                connection.execute(
                    meta.tables["release_measurements"]
                    .insert()
                    .values(release_id=release.hex, payload={"m": [0.5]}, created_at=now)
                )
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("ledger_kinds", "measured", "target", "refusal"),
    [
        (["non_dp"], False, "0002", "1 non_dp ledger entries exist"),
        (["reserve", "commit"], True, "0001", "1 stored measurements exist"),
        (["reserve", "refund"], False, "base", "2 ledger entries exist"),
    ],
)
def test_a_downgrade_that_would_drop_privacy_records_refuses_and_changes_nothing(
    ledger_kinds: list[str], measured: bool, target: str, refusal: str, empty_database: str
) -> None:
    """The append-only ledger and the immutable measurements are never dropped by a
    downgrade; the refusal comes part-way through the command, after later revisions
    were undone, and the whole command rolls back on SQLite as on PostgreSQL."""
    url = empty_database
    _head_with_a_release(url, ledger_kinds, measured)
    with pytest.raises(RuntimeError, match=refusal):
        migrations.downgrade(url, target)
    assert migrations.current_revision(url) == migrations.head_revision(url)
    assert _scalar(url, "releases", "params") == {"method": "moments"}  # 0004 not undone
    assert _tables(url) == set(Base.metadata.tables)


def test_0014_counts_earlier_releases_as_storing_nothing(empty_database: str) -> None:
    """Releases recorded before 0014 get 0 predicted and 0 stored bytes (their files are
    not measured by the migration: they count against ``CURATOR_MAX_CURATOR_BYTES`` from
    their next publish); the downgrade drops both columns."""
    url = empty_database
    ids = [uuid.uuid4(), uuid.uuid4()]
    _releases_at(
        url,
        "0013",
        {r: {"mechanism": "test_means", "params": {}, "status": "succeeded"} for r in ids},
    )
    migrations.upgrade(url, "0014")
    for column in ("predicted_bytes", "stored_bytes"):
        assert _release_column(url, column) == dict.fromkeys(ids, 0)
    migrations.downgrade(url, "0013")
    with pytest.raises(KeyError):
        _release_column(url, "stored_bytes")


def test_0015_downgrade_says_which_releases_had_their_files_deleted(empty_database: str) -> None:
    """Releases recorded before 0015 get no ``files_deleted_at``. The code before it knows
    no deleted files (a deleted release reads as succeeded with nothing published): the
    downgrade gives each such release a message saying why, and leaves the others'."""
    from datetime import UTC, datetime

    url = empty_database
    before, deleted, kept = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    succeeded = {"mechanism": "test_means", "params": {}, "status": "succeeded"}
    _releases_at(url, "0014", {before: {**succeeded, "published_version": 0}})
    migrations.upgrade(url, "0015")
    assert _release_column(url, "files_deleted_at") == {before: None}
    _releases_at(
        url,
        "0015",
        {
            deleted: {**succeeded, "files_deleted_at": datetime.now(UTC), "message": None},
            kept: {**succeeded, "published_version": 1, "message": "kept"},
        },
    )
    migrations.downgrade(url, "0014")
    assert _release_column(url, "message") == {
        before: None,
        deleted: "its files were deleted by its curator; re-synthesise it (no budget) to "
        "publish them again",
        kept: "kept",
    }
    with pytest.raises(KeyError):
        _release_column(url, "files_deleted_at")
    migrations.upgrade(url, "0015")
    assert set(_release_column(url, "files_deleted_at").values()) == {None}


METRICS_INDEXES = {
    "releases": (
        "ix_releases_mechanism_status_stored_bytes",
        ["mechanism", "status", "stored_bytes"],
    ),
    "ledger_entries": ("ix_ledger_entries_kind_epsilon_delta", ["kind", "epsilon", "delta"]),
}


def test_0016_adds_the_metrics_covering_indexes_and_its_downgrade_drops_them(
    empty_database: str,
) -> None:
    """0016 adds the indexes the metrics' aggregates scan (app.core.metrics), over rows
    already there, and its downgrade drops exactly those, leaving the rows."""
    url = empty_database
    release = uuid.uuid4()
    _releases_at(url, "0015", {release: {"mechanism": "m", "params": {}}})
    before = _indexes(url)
    migrations.upgrade(url, "0016")
    after = _indexes(url)
    for table, (name, columns) in METRICS_INDEXES.items():
        assert name not in before[table]
        assert after[table][name] == columns
        assert {k: v for k, v in after[table].items() if k != name} == before[table]
    migrations.downgrade(url, "0015")
    assert _indexes(url) == before
    assert set(_release_column(url, "mechanism")) == {release}
