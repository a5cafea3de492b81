"""Helpers of the release tests."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.core.services import Services
from app.releases import stages
from app.releases.stages import run_measure, run_synthesize
from tests.conftest import Caller
from tests.datasets.helpers import csv_bytes, upload

REQUEST: dict[str, Any] = {"mechanism": "test_means", "epsilon": 0.2}


def services_of(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def dataset(client: TestClient, curator: Caller, epsilon: float = 1.0, delta: float = 1e-6) -> str:
    from tests.datasets.helpers import SCHEMA

    schema = {**SCHEMA, "budget": {"epsilon": epsilon, "delta": delta}}
    response = upload(client, curator, csv_bytes(), schema)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def request_release(
    client: TestClient,
    caller: Caller,
    dataset_id: str,
    body: dict[str, Any] | None = None,
    key: str | None = None,
) -> Any:
    headers = dict(caller.headers)
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(f"/v1/datasets/{dataset_id}/releases", headers=headers, json=body or REQUEST)


def heartbeat_sees_the_cancel(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once a stage's heartbeat has read the release's cancel (the stage's
    next progress call raises it). The cancel's grace is lifted meanwhile: a heartbeat lets
    the lease lapse when the stage ignores a cancel for 4 lease periods (1.6 s at 0.4 s;
    test_a_cancel_the_stage_ignores_ends_the_release_through_the_sweeper), and a loaded
    machine must not get there between the heartbeat seeing the cancel and the stage going
    on."""
    seen = heartbeat_finds(monkeypatch, "cancelled")
    monkeypatch.setattr(stages, "CANCEL_GRACE_LEASES", 10_000)
    return seen


def heartbeat_finds(monkeypatch: pytest.MonkeyPatch, flag: str) -> threading.Event:
    """An event set once a stage's heartbeat, after a beat, has its ``flag`` set
    (``"cancelled"``: it read the release's cancel; ``"lost"``: it gave the lease up)."""
    found = threading.Event()
    beat = stages.Heartbeat.beat

    def beat_and_tell(self: stages.Heartbeat) -> None:
        beat(self)
        if getattr(self, flag):
            found.set()

    monkeypatch.setattr(stages.Heartbeat, "beat", beat_and_tell)
    return found


def run_all(client: TestClient, release_id: str) -> None:
    services = services_of(client)
    run_measure(services, uuid.UUID(release_id))
    run_synthesize(services, uuid.UUID(release_id))


def finished_release(
    client: TestClient,
    curator: Caller,
    dataset_id: str,
    body: dict[str, Any],
    reader: Caller | None = None,
) -> dict[str, Any]:
    """Request a release (202), run its stages, and read it back as ``reader`` (the
    curator by default): it must have succeeded."""
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    run_all(client, release_id)
    headers = (reader or curator).headers
    release: dict[str, Any] = client.get(f"/v1/releases/{release_id}", headers=headers).json()
    assert release["status"] == "succeeded", release
    return release


def race_same_key(
    client: TestClient, caller: Caller, dataset_id: str, body: dict[str, Any], copies: int = 10
) -> None:
    """``copies`` identical requests with one Idempotency-Key, released together: one
    creates the release (202) and every other replays it (200)."""
    barrier = threading.Barrier(copies)
    results: list[tuple[int, str]] = []

    def attempt() -> None:
        barrier.wait()
        response = request_release(client, caller, dataset_id, body, key="same")
        results.append((response.status_code, response.json().get("id", response.text)))

    threads = [threading.Thread(target=attempt) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(code for code, _ in results) == [200] * (copies - 1) + [202], results
    assert len({release_id for _, release_id in results}) == 1


def budget(client: TestClient, caller: Caller, dataset_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/datasets/{dataset_id}/budget", headers=caller.headers)
    assert response.status_code == 200
    return dict(response.json())


def assert_sessions_free_while_held(
    client: TestClient,
    caller: Caller,
    monkeypatch: Any,
    target: type,
    method: str,
    send: Callable[[], int],
    expected: int = 200,
) -> None:
    """With more requests inside ``target.method`` than there are session slots (each held
    there until released), a request that needs a session (GET /v1/datasets) is still
    served; then every held request completes with ``expected``."""
    from app.core.deps import MAX_CONCURRENT_TRANSACTIONS

    original = getattr(target, method)
    arrived = threading.Semaphore(0)
    finish = threading.Event()

    def held(self: Any, *args: Any) -> Any:
        arrived.release()
        finish.wait(timeout=60)
        return original(self, *args)

    monkeypatch.setattr(target, method, held)
    codes: list[int] = []
    served: list[int] = []
    senders = [
        threading.Thread(target=lambda: codes.append(send()))
        for _ in range(MAX_CONCURRENT_TRANSACTIONS + 1)
    ]
    other = threading.Thread(
        target=lambda: served.append(client.get("/v1/datasets", headers=caller.headers).status_code)
    )
    try:
        for thread in senders:
            thread.start()
        assert all(arrived.acquire(timeout=30) for _ in range(MAX_CONCURRENT_TRANSACTIONS)), (
            "fewer requests than session slots reached the held method"
        )
        other.start()
        other.join(timeout=10)
        served_while_held = list(served)
    finally:
        finish.set()
        for thread in [*senders, other]:
            if thread.ident is not None:  # started
                thread.join(timeout=60)
    assert served_while_held == [200], "GET /v1/datasets waited for the held requests"
    assert codes == [expected] * (MAX_CONCURRENT_TRANSACTIONS + 1)


def hold_answers(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold every answer computation (in its slot, ``app.answers.service.answer_slots``)
    until the event returned is set."""
    from app.answers import service

    go_on = threading.Event()
    real_answer = service.answer

    def held(*args: Any, **kwargs: Any) -> Any:
        assert go_on.wait(timeout=120)
        return real_answer(*args, **kwargs)

    monkeypatch.setattr(service, "answer", held)
    return go_on


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass(frozen=True)
class Gate:
    """The fake mechanism's gate, in ``folder``: the first attempt of the stage stands at
    ``point`` (a ``GatePoint`` of ``tests.releases.fake_mechanism``) until :meth:`open`."""

    folder: Path

    def params(self, point: str) -> dict[str, Any]:
        return {"gate": point, "marker_dir": str(self.folder)}

    def wait_reached(self, timeout: float = 60) -> None:
        wait_for((self.folder / "gate.reached").exists, "the stage to reach its gate", timeout)

    def open(self) -> None:
        (self.folder / "gate.open").touch()


def published_progress(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The values the stages hand their heartbeat (what a release's progress shows),
    recorded in order from now on."""
    seen: list[float] = []
    set_progress = stages.Heartbeat.set_progress

    def recorded(self: stages.Heartbeat, fraction: float) -> None:
        seen.append(fraction)
        set_progress(self, fraction)

    monkeypatch.setattr(stages.Heartbeat, "set_progress", recorded)
    return seen


def rows_of(client: TestClient, model: Any, dataset_id: str) -> int:
    """How many rows of ``model`` (``Release``, ``LedgerEntry``, ...) the dataset has."""
    with services_of(client).db.transaction(read_only=True) as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(model)
                .where(model.dataset_id == uuid.UUID(dataset_id))
            )
            or 0
        )
