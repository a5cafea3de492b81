"""The container files stay honest even where no Docker engine runs (CI here has none;
``.ci/run`` also runs ``docker compose config`` when a compose client exists)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_has_the_services_and_their_order() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "api", "worker"}
    for name in ("api", "worker"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert depends["redis"]["condition"] == "service_healthy"
        assert "curator-data:/data" in services[name]["volumes"]
    assert services["migrate"]["command"] == ["curator", "migrate"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "--no-migrate" in services["api"]["command"]
    assert "--no-worker" in services["api"]["command"]
    assert "http://127.0.0.1:8000/readyz" in services["api"]["healthcheck"]["test"][-1]
    assert services["worker"]["command"] == ["curator", "worker"]
    env = services["api"]["environment"]
    assert env["CURATOR_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["CURATOR_REDIS_URL"].startswith("redis://")
    assert env["CURATOR_DATA_KEY"].startswith("${CURATOR_DATA_KEY:?")  # required, shared by all
    # the metrics token is the api's alone (the workers serve no HTTP); the rest is shared
    assert env["CURATOR_METRICS_TOKEN"] == "${CURATOR_METRICS_TOKEN:-}"
    for name in ("migrate", "worker"):
        assert services[name]["environment"] == {
            k: v for k, v in env.items() if k != "CURATOR_METRICS_TOKEN"
        }


def test_compose_redis_requires_a_password_the_services_use() -> None:
    """The queue's messages are signed (a forged job is dropped unread), but whoever
    reaches Redis could still drop or flood jobs: it has a required password, its health
    check authenticates, the API and the workers connect with it, and it publishes no port."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    redis = compose["services"]["redis"]
    command = redis["command"]
    password = command[command.index("--requirepass") + 1]
    assert password.startswith("${REDIS_PASSWORD:?")  # required, no default
    assert redis["environment"]["REDISCLI_AUTH"] == password
    assert "PONG" in redis["healthcheck"]["test"][-1]  # NOAUTH is not healthy
    assert "ports" not in redis
    for name in ("api", "worker", "migrate"):
        url = compose["services"][name]["environment"]["CURATOR_REDIS_URL"]
        assert url == f"redis://:{password}@redis:6379/0"


def test_compose_publishes_the_api_on_loopback_and_requires_the_database_password() -> None:
    """API keys are bearer tokens over plain HTTP: the API is published on the host's
    loopback unless CURATOR_BIND says otherwise (a TLS proxy goes in front), and
    PostgreSQL's password has no default (security audit)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["api"]["ports"] == ["${CURATOR_BIND:-127.0.0.1}:${CURATOR_PORT:-8000}:8000"]
    password = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert password.startswith("${POSTGRES_PASSWORD:?")  # required, no default
    for name in ("api", "worker", "migrate"):
        url = services[name]["environment"]["CURATOR_DATABASE_URL"]
        assert url == f"postgresql+psycopg://curator:{password}@postgres:5432/curator"
    assert "ports" not in services["postgres"]


def test_dockerfile_is_multistage_nonroot_with_healthcheck() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert text.count("\nFROM ") + text.startswith("FROM ") >= 2
    assert "\nUSER curator" in text
    assert "chmod 700 /data" in text  # a named volume takes the mode of the image's /data
    assert "\nHEALTHCHECK " in text
    # the installed package carries its migrations (app/migrations): nothing to copy beside it
    assert "alembic" not in text.lower()


def test_compose_postgres_takes_the_connections_of_the_api_and_thirty_workers() -> None:
    """Each process's pool holds what it can at once (``tests/core/test_pool.py``): a
    PostgreSQL whose ``max_connections`` is below the API's and the workers' together
    refuses the last ones ("too many clients already", a 503). PostgreSQL's default (100,
    3 kept for superusers) holds the API and 3 one-thread workers (it said 5 while the API
    held 84); compose sets enough for 30, the scale the README names, whose arithmetic is
    checked here too."""
    from app.core.deps import request_connections
    from app.releases.stages import worker_connections

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["postgres"]["command"]
    settings = dict(arg.split("=", 1) for arg in command[command.index("-c") + 1 :: 2])
    reserved = 3  # superuser_reserved_connections' default
    needed = request_connections() + 30 * worker_connections(1) + reserved
    assert int(settings["max_connections"]) >= needed

    readme = " ".join((ROOT / "README.md").read_text().split())
    api, worker = request_connections(), worker_connections(1)
    assert f"the API {api} (" in readme
    assert f"{api} for each API process + {worker} for each one-thread worker" in readme
    room = (100 - reserved - api) // worker
    assert f"leaves room for one API and {room} workers" in readme
    two_apis = (int(settings["max_connections"]) - reserved - 2 * api) // worker
    assert f"or two APIs and {two_apis} workers" in readme
