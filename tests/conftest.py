"""Shared fixtures.

Every test that takes ``database_url`` (directly or through ``services``/``client``) runs
twice: on SQLite and on PostgreSQL. The PostgreSQL lane needs ``CURATOR_TEST_DATABASE_URL``
(``.ci/run`` sets it when a server answers on 127.0.0.1:5432); without it the lane is
skipped with that reason. With it, an unreachable server is a failure, not a skip. Each
pytest session migrates its own private PostgreSQL database (so that concurrent runs on
one server cannot interfere) and truncates its tables between tests; SQLite tests copy a
migrated template file. Schemas are always built by Alembic, never ``create_all``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.config import Settings
from app.core import migrations
from app.core.services import Services
from app.core.threads import limit_blas_threads
from app.main import create_app
from app.models import Role
from app.users import service as users

PG_ENV = "CURATOR_TEST_DATABASE_URL"
REDIS_ENV = "CURATOR_TEST_REDIS_URL"
TABLES = ("audit_events", "ledger_entries", "grants", "releases", "datasets", "api_keys", "users")


def pytest_configure(config: pytest.Config) -> None:
    """One BLAS thread per product, as ``curator serve`` and ``worker`` run
    (``CURATOR_BLAS_THREADS``): the suite runs on every core already (pytest-xdist)."""
    limit_blas_threads(1)


@pytest.fixture(autouse=True)
def _restore_umask() -> Iterator[None]:
    """``curator``'s ``main`` sets the process umask (adds 007): a test that calls it in
    process leaves the next test the umask it found."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    migrations.upgrade(f"sqlite:///{path}")
    return path


@contextmanager
def temporary_postgres() -> Iterator[str]:
    """A new, empty PostgreSQL database on the test server, dropped afterwards."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL lane: {PG_ENV} is not set")
    name = f"curator_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """This session's migrated PostgreSQL database (tables truncated between tests)."""
    with temporary_postgres() as url:
        migrations.upgrade(url)
        yield url


def reset_postgres(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    if request.param == "sqlite":
        path = tmp_path / "curator.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("postgres_url")
    reset_postgres(url)
    return url


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        redis_url=None,
        max_upload_bytes=2 << 20,
        max_json_bytes=1 << 20,
        queue_name=f"test-{uuid.uuid4().hex[:12]}",
        # the suite does not depend on the test machine's free space (the check is tested
        # with a threshold of its own: test_low_free_space_refuses_uploads_and_releases...)
        min_free_bytes=0,
    )


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    built = Services.build(settings)
    yield built
    built.close()


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings)
    with TestClient(app) as test_client:
        yield test_client


@dataclass(frozen=True)
class Caller:
    id: uuid.UUID
    role: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def make_user(client: TestClient, role: str, name: str | None = None) -> Caller:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    with services.db.transaction() as session:
        user, _key, secret = users.create_user(
            session, name or f"{role}-{secrets.token_hex(3)}", Role(role), None
        )
        user_id = user.id
    return Caller(id=user_id, role=role, key=secret)


@pytest.fixture
def admin(client: TestClient) -> Caller:
    return make_user(client, "admin")


@pytest.fixture
def curator(client: TestClient) -> Caller:
    return make_user(client, "curator")


@pytest.fixture
def analyst(client: TestClient) -> Caller:
    return make_user(client, "analyst")


@pytest.fixture
def redis_url() -> str:
    url = os.environ.get(REDIS_ENV)
    if not url:
        pytest.skip(f"Redis lane: {REDIS_ENV} is not set")
    return url
