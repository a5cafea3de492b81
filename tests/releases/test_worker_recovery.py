"""A worker killed with SIGKILL in either stage: another worker recovers the release, with
exactly one spend and the same noisy measurements. Real processes, real queues."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from app.models import ReleaseMeasurement
from tests.conftest import Caller, make_user
from tests.releases.helpers import (
    Gate,
    budget,
    dataset,
    request_release,
    services_of,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 2.0


@pytest.fixture(params=["sqlite+sqlite-queue", "postgresql+redis"])
def lane(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> Settings:
    import shutil

    if request.param.startswith("sqlite"):
        path = tmp_path / "curator.db"
        shutil.copy(sqlite_template, path)
        database_url, redis_url = f"sqlite:///{path}", None
    else:
        from tests.conftest import reset_postgres

        database_url = request.getfixturevalue("postgres_url")
        reset_postgres(database_url)
        redis_url = request.getfixturevalue("redis_url")
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        redis_url=redis_url,
        queue_name=f"test-{uuid.uuid4().hex[:10]}",
        lease_seconds=LEASE_SECONDS,
    )


@pytest.fixture
def api(lane: Settings) -> Iterator[TestClient]:
    import tests.releases.fake_mechanism  # noqa: F401 - registers test_means

    with TestClient(create_app(lane)) as client:
        yield client
    if lane.redis_url:
        services_of(client).queue.huey.storage.flush_all()


def start_worker(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURATOR_")}
    env |= {
        "CURATOR_DATA_DIR": str(settings.data_dir),
        "CURATOR_DATABASE_URL": str(settings.database_url),
        "CURATOR_QUEUE_NAME": settings.queue_name,
        "CURATOR_LEASE_SECONDS": str(settings.lease_seconds),
        "PYTHONPATH": str(ROOT),
    }
    if settings.redis_url:
        env["CURATOR_REDIS_URL"] = settings.redis_url
    code = "import tests.releases.fake_mechanism; from app.cli import main; main(['worker'])"
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-c", code], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _payload(client: TestClient, release_id: str) -> Any:
    with services_of(client).db.transaction() as session:
        row = session.get(ReleaseMeasurement, uuid.UUID(release_id))
        return None if row is None else row.payload


def _held_release(api: TestClient, tmp_path: Path, gate: str) -> tuple[Caller, str, str, Gate]:
    """A queued test_means release whose first attempt stands at ``gate`` until the
    returned gate is opened: ``(curator, dataset id, release id, gate)``."""
    curator = make_user(api, "curator")
    dataset_id = dataset(api, curator)
    held = Gate(tmp_path / "markers")
    held.folder.mkdir()
    body = {"mechanism": "test_means", "epsilon": 0.2, "params": {**held.params(gate), "rows": 4}}
    release_id = request_release(api, curator, dataset_id, body).json()["id"]
    return curator, dataset_id, release_id, held


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["measure", "synthesize"])
def test_sigkill_in_a_stage_is_recovered(
    api: TestClient, lane: Settings, tmp_path: Path, stage: str
) -> None:
    gate = "after_first_batch" if stage == "measure" else "before_synthesizing"
    curator, dataset_id, release_id, held = _held_release(api, tmp_path, gate)
    log = tmp_path / "worker.log"
    first = start_worker(lane, log)
    try:
        held.wait_reached()
        before = _payload(api, release_id)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        stop(first)
    assert (before is None) == (stage == "measure")
    status = api.get(f"/v1/releases/{release_id}", headers=curator.headers).json()["status"]
    assert status == ("measuring" if stage == "measure" else "synthesizing")

    second = start_worker(lane, log)
    try:
        wait_for(
            lambda: (
                api.get(f"/v1/releases/{release_id}", headers=curator.headers).json()["status"]
                in ("succeeded", "failed", "cancelled")
            ),
            "the release to finish",
        )
    finally:
        stop(second)
    release = api.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "succeeded", (release, log.read_text())
    entries = [
        e["kind"]
        for e in budget(api, curator, dataset_id)["entries"]
        if e["release_id"] == release_id
    ]
    assert entries == ["reserve", "commit"]
    after = _payload(api, release_id)
    assert after is not None
    if stage == "synthesize":
        assert after == before  # the same noisy measurements: never redrawn
    assert "lease expired" in log.read_text()


@pytest.mark.slow
def test_sigterm_lets_the_running_stage_finish(
    api: TestClient, lane: Settings, tmp_path: Path
) -> None:
    """SIGTERM (docker stop, systemd) is a graceful stop: the worker takes no new task and
    its running measure stage finishes and is stored, instead of being cut off and taken
    over once its lease expires, at the cost of one of the stage's three attempts (Huey's
    graceful signal was SIGINT; SIGTERM interrupted the stage)."""
    curator, _, release_id, held = _held_release(api, tmp_path, "after_reading")
    log = tmp_path / "worker.log"
    worker = start_worker(lane, log)
    try:
        held.wait_reached()
        worker.send_signal(signal.SIGTERM)
        # the consumer has taken the signal (and stops taking tasks) while the stage runs
        wait_for(lambda: "Shutting down" in log.read_text(), "the worker to take SIGTERM")
        held.open()
        assert worker.wait(timeout=30) == 0, log.read_text()
    finally:
        stop(worker)
    assert _payload(api, release_id) is not None, log.read_text()
    release = api.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    # measured by the stopping worker; its synthesis waits in the queue for the next one
    assert release["status"] == "synthesizing", release
    assert "All workers have stopped" in log.read_text()  # joined, not interrupted
