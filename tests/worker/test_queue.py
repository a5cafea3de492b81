"""The job queue: a registered task runs on a consumer, on SQLite and on Redis; a message
that is not signed with the data key is never unpickled."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from huey.consumer import Consumer
from pydantic import ValidationError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy import update

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means, the default
from app.config import QUEUE_BLOCKING_READ_SECONDS, Settings
from app.main import create_app
from app.models import Release
from app.models.base import utcnow
from app.releases.stages import sweep
from app.storage.tables import key_ring
from app.worker import queue as queue_module
from app.worker.queue import (
    AuthenticatedSerializer,
    Queue,
    TaskFailed,
    UnauthenticatedMessage,
    guarded,
)
from tests.conftest import Caller, make_user
from tests.releases.helpers import dataset, request_release, run_all, services_of

_seen: dict[str, threading.Event] = {}


@queue_module.task("test.mark")
def _mark(token: str) -> None:
    _seen[token].set()


@pytest.fixture(params=["sqlite", "redis"])
def queue_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    return Settings(
        data_dir=tmp_path, redis_url=redis_url, queue_name=f"test-{uuid.uuid4().hex[:10]}"
    )


@pytest.fixture
def queue(queue_settings: Settings) -> Queue:
    return Queue(queue_settings, key_ring(Fernet.generate_key()))


class _Planted:
    """What an attacker with write access to the queue's storage pushes: unpickling it
    runs ``os.mkdir(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def _push_raw(queue: Queue, data: bytes) -> None:
    """Write ``data`` straight into the queue's storage, as an attacker would: the Redis
    list ``huey.redis.<name>``, or a row of ``queue.db``'s ``task`` table."""
    storage = queue.huey.storage
    if queue.backend == "redis":
        storage.conn.lpush(storage.queue_key, data)
    else:
        with sqlite3.connect(storage.filename) as db:
            db.execute(
                "insert into task (queue, data, priority) values (?, ?, 0)", (storage.name, data)
            )


def _run_until(queue: Queue, token: str) -> Consumer:
    """Consume ``queue`` until the task marking ``token`` has run; the stopped consumer."""
    consumer = queue.consumer(1, embedded=True)
    consumer.start()
    try:
        assert _seen[token].wait(timeout=20), "the task did not run"
    finally:
        consumer.stop(graceful=True)
    return consumer


def test_enqueued_task_runs_and_consumer_stops_cleanly(queue: Queue) -> None:
    queue.ping()
    token = uuid.uuid4().hex
    _seen[token] = threading.Event()
    queue.enqueue("test.mark", token)
    assert queue.pending() == 1
    consumer = _run_until(queue, token)
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


@pytest.mark.parametrize("signed_with", ["nothing", "another key"])
def test_a_forged_message_is_never_unpickled(
    queue: Queue, tmp_path: Path, signed_with: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A pickle pushed onto the queue's storage, bare or signed with a key that is not the
    deployment's, is dropped before it is unpickled (its code never runs), logged without
    its bytes; the genuine job behind it still runs."""
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    payload = pickle.dumps(_Planted(marker))
    if signed_with == "another key":
        payload = AuthenticatedSerializer(key_ring(Fernet.generate_key()))._serialize(
            _Planted(marker)
        )
    _push_raw(queue, payload)
    token = uuid.uuid4().hex
    _seen[token] = threading.Event()
    queue.enqueue("test.mark", token)  # behind the forged message (FIFO)
    with caplog.at_level(logging.DEBUG):
        _run_until(queue, token)
    assert not marker.exists(), "the forged message was unpickled"
    assert queue.pending() == 0
    assert "failed authentication" in caplog.text
    assert marker.name not in caplog.text
    queue.huey.storage.flush_all()


def test_a_message_queued_before_a_data_key_rotation_still_runs(
    queue_settings: Settings,
) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    token = uuid.uuid4().hex
    _seen[token] = threading.Event()
    Queue(queue_settings, key_ring(old)).enqueue("test.mark", token)
    rotated = Queue(queue_settings, key_ring(new, [old]))
    _run_until(rotated, token)
    assert rotated.pending() == 0
    rotated.huey.storage.flush_all()


def test_the_serializer_signs_with_the_current_key_and_verifies_before_unpickling(
    tmp_path: Path,
) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    before = AuthenticatedSerializer(key_ring(old))
    after = AuthenticatedSerializer(key_ring(new, [old]))
    message = {"args": ("0000-id",)}
    assert after.deserialize(before.serialize(message)) == message
    assert after.deserialize(after.serialize(message)) == message
    # signed with the current key: a worker that has only the old key refuses it
    with pytest.raises(UnauthenticatedMessage):
        before.deserialize(after.serialize(message))
    signed = bytearray(after.serialize(message))
    signed[-1] ^= 1  # a pickle changed after signing
    with pytest.raises(UnauthenticatedMessage):
        after.deserialize(bytes(signed))
    marker = tmp_path / "pwned"
    with pytest.raises(UnauthenticatedMessage) as info:
        after.deserialize(pickle.dumps(_Planted(marker)))
    assert not marker.exists()
    assert str(marker) not in str(info.value)


def test_a_release_whose_job_was_dropped_as_unauthenticated_is_swept_again(
    client: TestClient, curator: Caller
) -> None:
    """A job dropped because it failed authentication (here: signed under a data key the
    reading worker does not have) carried only a release id: the release keeps its queued
    lease, and once that expires the sweeper enqueues it again, signed, and it runs."""
    services = services_of(client)
    release_id = request_release(client, curator, dataset(client, curator)).json()["id"]
    assert services.queue.pending() == 1
    stranger = Queue(services.settings, key_ring(Fernet.generate_key()))
    with pytest.raises(UnauthenticatedMessage):
        stranger.huey.dequeue()
    assert services.queue.pending() == 0
    assert sweep(services) == 0  # its lease has not run out yet
    with services.db.transaction() as session:
        session.execute(
            update(Release)
            .where(Release.id == uuid.UUID(release_id))
            .values(lease_expires_at=Release.updated_at)  # the wait is over
        )
    assert sweep(services) == 1
    task = services.queue.huey.dequeue()  # verifies under the deployment's key
    assert task is not None
    assert task.args == (release_id,)
    run_all(client, release_id)
    status = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()["status"]
    assert status == "succeeded"


def _closed_port() -> int:
    """A local TCP port nothing listens on (connections to it are refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_consumer_says_once_that_redis_is_down_and_once_that_it_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Huey's consumer logged "Error reading from queue" and "Error reading schedule." with
    a full traceback about every second, from each worker thread and its scheduler, for as
    long as Redis was down. It says so once (a warning, without the URL, which can carry
    Redis's password) and once that Redis is back (info); a message that is not Redis
    being down (one that fails authentication) is still logged by Huey."""
    monkeypatch.setattr(queue_module, "UNREACHABLE_RETRY_SECONDS", 0.05, raising=False)
    url = f"redis://:hunter2@127.0.0.1:{_closed_port()}/0"
    settings = Settings(data_dir=tmp_path, redis_url=url, queue_name="test-down")
    down = Queue(settings, key_ring(Fernet.generate_key()))
    consumer = down.consumer(2, embedded=True)
    with caplog.at_level(logging.DEBUG):
        consumer.start()
        try:
            # the scheduler reads every second, and each worker every 0.05 s here
            threading.Event().wait(2.5)
        finally:
            consumer.stop(graceful=True)
    logged = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    loud = [entry for entry in logged if entry[1] in ("WARNING", "ERROR", "CRITICAL")]
    assert loud == [
        (
            "curator.worker",
            "WARNING",
            "the job queue (Redis) cannot be reached (ConnectionError); queued releases "
            "wait, workers read it again every 0.05 s, and a release that could not be "
            "enqueued meanwhile is enqueued again by the sweeper when its lease runs out "
            "(said again when it is back)",
        )
    ], logged
    assert "hunter2" not in caplog.text
    assert not any(r.exc_info for r in caplog.records)

    # Redis answers again: one info line, however many reads follow
    caplog.clear()
    monkeypatch.setattr(down.huey.storage, "dequeue", lambda: None)
    monkeypatch.setattr(down.huey.storage, "read_schedule", lambda ts: [])
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            assert down.huey.dequeue() is None
            assert down.huey.read_schedule() == []
    back = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert back == [("curator.worker", "INFO", "the job queue (Redis) can be reached again")]

    # an error that is not Redis being down still reaches Huey (which logs it)
    monkeypatch.setattr(
        down.huey.storage, "dequeue", lambda: b"\0" * queue_module.TAG_BYTES + b"forged"
    )
    with pytest.raises(UnauthenticatedMessage):
        down.huey.dequeue()


def _expire_leases(services: Any) -> None:
    with services.db.transaction() as session:
        session.execute(update(Release).values(lease_expires_at=Release.updated_at))


def test_an_enqueue_while_redis_is_down_is_told_once_and_left_to_the_sweeper(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """While Redis was down every enqueue after a commit (a release request, the sweeper's
    re-enqueue of each release every lease) was logged as "a commit hook failed with
    ConnectionError" with its frames, and the sweeper said each release was re-enqueued.
    The release request is still accepted (202: its row and queued lease are committed);
    the outage is told once per process, by one warning without the URL (it can carry
    Redis's password), and the sweeper says nothing of what it could not enqueue. Once
    Redis takes enqueues again: one info line, and the swept releases are re-enqueued. An
    enqueue that fails otherwise (a bug) is still a hook's ERROR with its frames."""
    url = f"redis://:hunter2@127.0.0.1:{_closed_port()}/0"
    app = create_app(settings.model_copy(update={"redis_url": url}))
    with TestClient(app) as client:
        services = services_of(client)
        curator = make_user(client, "curator")
        dataset_id = dataset(client, curator)
        with caplog.at_level(logging.DEBUG):
            responses = [request_release(client, curator, dataset_id) for _ in range(2)]
            _expire_leases(services)
            assert sweep(services) == 2
            _expire_leases(services)
            assert sweep(services) == 2
        assert [r.status_code for r in responses] == [202, 202], [r.text for r in responses]
        logged = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        loud = [entry for entry in logged if entry[1] in ("WARNING", "ERROR", "CRITICAL")]
        assert loud == [
            (
                "curator.worker",
                "WARNING",
                "the job queue (Redis) cannot be reached (ConnectionError); queued releases "
                "wait, workers read it again every 1 s, and a release that could not be "
                "enqueued meanwhile is enqueued again by the sweeper when its lease runs out "
                "(said again when it is back)",
            )
        ], logged
        assert not any("re-enqueued" in message for _, _, message in logged), logged
        assert "hunter2" not in caplog.text
        assert not any(r.exc_info for r in caplog.records)

        # Redis takes enqueues again: said once, and the next sweep re-enqueues both
        pushed: list[bytes] = []
        monkeypatch.setattr(
            services.queue.huey.storage, "enqueue", lambda data, _p: pushed.append(data)
        )
        caplog.clear()
        with caplog.at_level(logging.INFO):
            _expire_leases(services)
            assert sweep(services) == 2
        messages = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert messages[0] == ("INFO", "the job queue (Redis) can be reached again"), messages
        assert sorted(m for _, m in messages[1:]) == sorted(
            f"release {release['id']}: lease expired in queued; re-enqueued"
            for release in (r.json() for r in responses)
        )
        assert len(pushed) == 2

        # an enqueue that fails for another reason is a bug: an ERROR with its frames
        def broken(data: bytes, priority: Any) -> None:
            raise RuntimeError("not Redis being down")

        monkeypatch.setattr(services.queue.huey.storage, "enqueue", broken)
        caplog.clear()
        _expire_leases(services)
        assert sweep(services) == 2
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert [r.getMessage().splitlines()[0] for r in errors] == [
            "an on_commit hook failed with RuntimeError"
        ] * 2
        assert all('File "' in r.getMessage() for r in errors)  # its frames


def test_the_queue_connects_to_redis_with_the_timeouts_of_its_settings(tmp_path: Path) -> None:
    """Huey's ``url=`` built its pool with no timeouts (redis-py before 8.0: none at all;
    8.0: 5 s, whatever the deployment wants): every connection of the queue now opens
    within ``CURATOR_REDIS_CONNECT_TIMEOUT`` and is answered within
    ``CURATOR_REDIS_TIMEOUT``, which is longer than a worker's blocking read."""
    settings = Settings(
        data_dir=tmp_path,
        redis_url=f"redis://:hunter2@127.0.0.1:{_closed_port()}/0",
        queue_name="test-timeouts",
        redis_connect_timeout=1.5,
        redis_timeout=7,
    )
    storage = Queue(settings, key_ring(Fernet.generate_key())).huey.storage
    assert storage.pool.connection_kwargs["socket_connect_timeout"] == 1.5
    assert storage.pool.connection_kwargs["socket_timeout"] == 7
    connection = storage.pool.make_connection()  # not connected: no server needed
    assert (connection.socket_connect_timeout, connection.socket_timeout) == (1.5, 7)
    assert storage.blocking
    assert storage.read_timeout == QUEUE_BLOCKING_READ_SECONDS
    defaults = Settings(data_dir=tmp_path)
    assert (defaults.redis_connect_timeout, defaults.redis_timeout) == (5, 5)
    with pytest.raises(ValidationError, match="redis_timeout"):
        Settings(data_dir=tmp_path, redis_timeout=QUEUE_BLOCKING_READ_SECONDS)


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A local TCP port whose server accepts every connection and never answers: a Redis
    whose replies a firewall or a partition drops."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        server.close()


def test_a_redis_that_never_answers_is_unreachable_within_its_timeout(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """/readyz, and an enqueue, against a Redis that accepts connections and never
    answers: with no socket timeout they waited for the kernel's TCP timeouts (minutes;
    redis-py 8 waits its own default of 5 s). They give up after CURATOR_REDIS_TIMEOUT
    (2 s here): /readyz answers 503 with the queue unreachable, and the enqueue is left
    to the sweeper with the one warning."""
    with _silent_server() as port:
        url = f"redis://:hunter2@127.0.0.1:{port}/0"
        app = create_app(settings.model_copy(update={"redis_url": url, "redis_timeout": 2.0}))
        with TestClient(app) as client, caplog.at_level(logging.INFO):
            started = time.monotonic()
            response = client.get("/readyz")
            waited = time.monotonic() - started
            assert response.status_code == 503
            assert response.json() == {
                "status": "not ready",
                "database": "ok",
                "queue": "unreachable",
                "storage": "ok",
            }
            assert waited < 4, waited
            started = time.monotonic()
            assert services_of(client).queue.enqueue("test.mark", "token") is False
            waited = time.monotonic() - started
            assert waited < 4, waited
    loud = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert [message.split(";")[0] for _, message in loud] == [
        "readiness: queue unreachable (TimeoutError)",
        "the job queue (Redis) cannot be reached (TimeoutError)",
    ], loud
    assert "hunter2" not in caplog.text


def test_a_redis_host_that_drops_connections_is_unreachable_within_the_connect_timeout(
    tmp_path: Path,
) -> None:
    """A connection to a host that drops packets never opens (its SYN goes unanswered):
    here a local listener whose accept queue is full, which Linux answers so. The ping and
    an enqueue fail within CURATOR_REDIS_CONNECT_TIMEOUT (0.5 s here; redis-py 8's default
    is 5 s, earlier ones waited for the kernel's connect timeout, about two minutes)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port), timeout=1):  # fills the queue
            with socket.socket() as probe:
                probe.settimeout(0.3)
                try:
                    probe.connect(("127.0.0.1", port))
                except TimeoutError:
                    pass
                else:
                    pytest.skip("this system answers a connection to a full accept queue")
            settings = Settings(
                data_dir=tmp_path,
                redis_url=f"redis://127.0.0.1:{port}/0",
                queue_name="test-dropped",
                redis_connect_timeout=0.5,
            )
            queue = Queue(settings, key_ring(Fernet.generate_key()))
            started = time.monotonic()
            with pytest.raises(RedisTimeoutError):
                queue.ping()
            assert queue.enqueue("test.mark", "token") is False
            waited = time.monotonic() - started
            assert waited < 3, waited


def test_a_worker_read_that_times_out_is_redis_unreachable_not_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Huey's RedisStorage.dequeue takes redis's TimeoutError as an empty queue and returns
    nothing: a worker reading a Redis that never answers (a host that drops packets, the
    case CURATOR_REDIS_TIMEOUT is for) never said it was unreachable, and each timed-out
    read said it "can be reached again", after every enqueue's warning. A read that times
    out is Redis unreachable, as an enqueue that times out is."""
    monkeypatch.setattr(queue_module, "UNREACHABLE_RETRY_SECONDS", 0.05, raising=False)
    with _silent_server() as port:
        settings = Settings(
            data_dir=tmp_path,
            redis_url=f"redis://:hunter2@127.0.0.1:{port}/0",
            queue_name="test-silent-read",
            redis_timeout=2,
        )
        silent = Queue(settings, key_ring(Fernet.generate_key()))
        with caplog.at_level(logging.DEBUG):
            assert silent.huey.dequeue() is None
            assert silent.reachability is not None
            assert not silent.reachability.reachable
            assert silent.enqueue("test.mark", "token") is False
            assert silent.huey.dequeue() is None
    logged = [(r.levelname, r.getMessage().split(";")[0]) for r in caplog.records]
    said = [entry for entry in logged if entry[0] in ("INFO", "WARNING", "ERROR")]
    assert said == [("WARNING", "the job queue (Redis) cannot be reached (TimeoutError)")], logged
    assert "hunter2" not in caplog.text


def test_a_worker_read_of_an_empty_queue_is_not_a_timeout(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker's blocking read of an empty queue (BRPOP, 1 s in Redis) is answered well
    within CURATOR_REDIS_TIMEOUT's least value (2 s): it returns nothing, not Redis lost."""
    settings = Settings(
        data_dir=tmp_path,
        redis_url=redis_url,
        queue_name=f"test-{uuid.uuid4().hex[:10]}",
        redis_timeout=QUEUE_BLOCKING_READ_SECONDS + 1,
    )
    empty = Queue(settings, key_ring(Fernet.generate_key()))
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            assert empty.huey.dequeue() is None
    assert empty.reachability is not None
    assert empty.reachability.reachable
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.text


def test_a_redis_url_whose_socket_timeout_is_shorter_than_a_read_is_refused(
    tmp_path: Path,
) -> None:
    """Options in CURATOR_REDIS_URL's query string win over CURATOR_REDIS_TIMEOUT
    (redis-py's rule), so they are held to its least value too: a ``socket_timeout``
    shorter than a worker's blocking read would time every read of an empty queue out."""
    url = "redis://:hunter2@127.0.0.1:6379/0?socket_timeout=0.5"
    with pytest.raises(ValidationError, match="socket_timeout") as info:
        Settings(data_dir=tmp_path, redis_url=url)
    assert "hunter2" not in str(info.value.errors()[0]["msg"])
    Settings(data_dir=tmp_path, redis_url=url.replace("0.5", "3"))


def test_a_redis_that_refuses_the_credentials_is_a_configuration_error_not_an_outage(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """redis-py's AuthenticationError (a wrong password or user, NOAUTH, a disabled ACL
    user: Redis's password changed under a running service) is a ConnectionError, so the
    queue took it as Redis being down: one warning that it "cannot be reached", enqueues
    left to a sweeper that can never succeed, nothing louder. It is said once as an ERROR
    that names the credentials (never the URL, which carries them), and an outage after
    it is still told as one."""
    monkeypatch.setattr(queue_module, "UNREACHABLE_RETRY_SECONDS", 0.05, raising=False)
    scheme, _, rest = redis_url.partition("://")
    url = f"{scheme}://nosuchuser:hunter2@{rest.rpartition('@')[2]}"
    settings = Settings(data_dir=tmp_path, redis_url=url, queue_name="test-refused")
    refused = Queue(settings, key_ring(Fernet.generate_key()))
    with caplog.at_level(logging.INFO):
        assert refused.enqueue("test.mark", "token") is False
        assert refused.huey.dequeue() is None
        assert refused.huey.read_schedule() == []
    said = [(r.levelname, r.getMessage().split(";")[0]) for r in caplog.records]
    assert said == [
        (
            "ERROR",
            "the job queue (Redis) refuses the credentials of CURATOR_REDIS_URL "
            "(AuthenticationError): a configuration error, not an outage",
        )
    ], said
    assert "hunter2" not in caplog.text
    assert not any(r.exc_info for r in caplog.records)

    caplog.clear()
    monkeypatch.setattr(refused.huey.storage, "dequeue", _raises(RedisTimeoutError))
    with caplog.at_level(logging.INFO):
        assert refused.huey.dequeue() is None
    said = [(r.levelname, r.getMessage().split(";")[0]) for r in caplog.records]
    assert said == [("WARNING", "the job queue (Redis) cannot be reached (TimeoutError)")]


def _raises(error: type[Exception]) -> Any:
    def fail(*args: Any) -> Any:
        raise error("timed out")

    return fail


def test_a_sweep_while_redis_is_down_does_not_lengthen_a_queued_release_s_wait(
    settings: Settings,
) -> None:
    """The sweeper doubles a queued release's next wait each time it re-enqueues it (up to
    16 leases), as one unclaimed is taken to wait behind busy workers. While Redis is down
    nothing waits behind workers: every enqueue fails, and an outage of half an hour left
    each release to wait 16 leases more once Redis was back. A sweep that knows Redis down
    gives it one lease, as it gave its first."""
    url = f"redis://:hunter2@127.0.0.1:{_closed_port()}/0"
    app = create_app(settings.model_copy(update={"redis_url": url}))
    with TestClient(app) as client:
        services = services_of(client)
        curator = make_user(client, "curator")
        release_id = request_release(client, curator, dataset(client, curator)).json()["id"]
        assert services.queue.reachability is not None
        assert not services.queue.reachability.reachable  # its enqueue failed
        lease = services.settings.lease_seconds
        now = utcnow()
        with services.db.transaction() as session:
            session.execute(  # it waited two leases, and that is over
                update(Release).values(
                    updated_at=now - timedelta(seconds=3 * lease),
                    lease_expires_at=now - timedelta(seconds=lease),
                )
            )
        assert sweep(services) == 1
        with services.db.transaction() as session:
            release = session.get(Release, uuid.UUID(release_id))
            assert release is not None
            wait = (release.lease_expires_at - release.updated_at).total_seconds()
        assert wait == pytest.approx(lease, abs=1), wait


def test_a_change_of_reachability_is_told_while_it_is_recorded() -> None:
    """Each line that Redis was lost or is back is logged under the lock that records the
    change: logged after it, a failure and a success racing at an outage's start could log
    "reached again" before "cannot be reached", leaving the last line wrong until the next
    change. A handler checks that the lock is held when each record is emitted."""
    reachability = queue_module.Reachability("Redis")
    held: list[tuple[str, bool]] = []

    class Check(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append((record.levelname, reachability._lock.locked()))

    handler = Check()
    worker_log = logging.getLogger("curator.worker")
    level = worker_log.level
    worker_log.setLevel(logging.INFO)
    worker_log.addHandler(handler)
    try:
        reachability.lost(RedisTimeoutError("timed out"))
        reachability.lost(RedisTimeoutError("timed out"))  # no change: nothing told
        reachability.back()
        reachability.back()
    finally:
        worker_log.removeHandler(handler)
        worker_log.setLevel(level)
    assert held == [("WARNING", True), ("INFO", True)]
