"""The job queue: a registered task runs on a consumer, on SQLite and on Redis."""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path

import pytest

from app.config import Settings
from app.worker import queue as queue_module
from app.worker.queue import Queue, TaskFailed, guarded

_seen: dict[str, threading.Event] = {}


@queue_module.task("test.mark")
def _mark(token: str) -> None:
    _seen[token].set()


@pytest.fixture(params=["sqlite", "redis"])
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> Queue:
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    settings = Settings(
        data_dir=tmp_path, redis_url=redis_url, queue_name=f"test-{uuid.uuid4().hex[:10]}"
    )
    return Queue(settings)


def test_enqueued_task_runs_and_consumer_stops_cleanly(queue: Queue) -> None:
    queue.ping()
    token = uuid.uuid4().hex
    _seen[token] = threading.Event()
    queue.enqueue("test.mark", token)
    assert queue.pending() == 1
    consumer = queue.consumer(1, embedded=True)
    consumer.start()
    try:
        assert _seen[token].wait(timeout=20), "the task did not run"
    finally:
        consumer.stop(graceful=True)
    assert queue.pending() == 0
    assert all(not t.is_alive() for _, t in consumer.worker_threads)
    queue.huey.storage.flush_all()


def test_a_failing_task_reaches_huey_without_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Huey logs a task's exception with its message; a guarded task logs the type and
    frames and hands Huey a TaskFailed that carries neither the message nor the cause."""
    secret = "bob,41,s3cr3t-value"

    def failing(release_id: str) -> None:
        raise ValueError(f"bad row {secret}")

    with caplog.at_level(logging.DEBUG), pytest.raises(TaskFailed) as info:
        guarded("measure", failing)("0000-id")
    assert str(info.value) == "task measure failed with ValueError"
    assert info.value.__suppress_context__
    assert info.value.__cause__ is None
    assert "failed with ValueError" in caplog.text
    assert "0000-id" in caplog.text
    assert secret not in caplog.text
