"""The job queue: Huey on SQLite (embedded default) or Redis (``CURATOR_REDIS_URL``).

Tasks are plain functions registered by name with :func:`task` in the domain packages'
``tasks.py`` (listed in ``TASK_MODULES``); a :class:`Queue` binds them to its Huey
instance. Jobs carry ids only; a task re-reads its rows in its own transaction.

Huey pickles its messages, and unpickling runs code the bytes name: whoever can write to
the queue's storage (the Redis list ``huey.redis.<name>``, the SQLite ``queue.db``) would
run code in every worker. So every message is authenticated before it is unpickled
(:class:`AuthenticatedSerializer`), with a key derived from the data key that the API and
the workers share already.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import importlib
import logging
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from huey import RedisHuey, SqliteHuey
from huey.api import Huey
from huey.consumer import Consumer
from huey.serializer import Serializer
from huey.storage import RedisStorage
from redis import ConnectionPool
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.config import QUEUE_BLOCKING_READ_SECONDS, Settings
from app.core.errors import frames_only
from app.storage.tables import KEY_RING_SEPARATOR

log = logging.getLogger("curator.worker")

#: Modules whose import registers tasks.
TASK_MODULES: tuple[str, ...] = ("app.releases.tasks",)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    fn: Callable[..., None]
    retries: int
    retry_delay: int


_REGISTRY: dict[str, TaskSpec] = {}


class TaskFailed(RuntimeError):
    """What a failed task raises to Huey: the original exception's type only."""


def guarded(name: str, fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` with its failures logged by type and frames only and re-raised as
    :class:`TaskFailed` without the original attached: Huey logs a task's exception with
    its message, which can carry data values (privacy rule 5). Task arguments are ids."""

    @functools.wraps(fn)
    def run(*args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            failed = type(exc).__name__
            log.error("task %s%r failed with %s\n%s", name, args, failed, frames_only(exc))
            raise TaskFailed(f"task {name} failed with {type(exc).__name__}") from None

    return run


def task(
    name: str, retries: int = 0, retry_delay: int = 0
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``fn`` as the task ``name`` (bound to every :class:`Queue`)."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        _REGISTRY[name] = TaskSpec(name, fn, retries, retry_delay)
        return fn

    return register


#: What the queue's signing keys are derived from, under each Fernet key of the data key ring.
SIGNING_LABEL = b"curator queue signing v1"
#: Length of a message's tag (HMAC-SHA256), which precedes the pickle.
TAG_BYTES = hashlib.sha256().digest_size


class UnauthenticatedMessage(ValueError):
    """A queue message whose tag no signing key verifies. Its message never quotes the
    message's bytes."""


def signing_keys(data_key: bytes) -> list[bytes]:
    """The queue's signing keys of a data key ring (:func:`app.storage.tables.key_ring`),
    in its order: HMAC-SHA256 of :data:`SIGNING_LABEL` under each Fernet key's bytes."""
    return [
        hmac.new(base64.urlsafe_b64decode(key), SIGNING_LABEL, hashlib.sha256).digest()
        for key in data_key.split(KEY_RING_SEPARATOR)
    ]


class AuthenticatedSerializer(Serializer):  # type: ignore[misc]
    """Huey's pickle serializer with every message prefixed by an HMAC-SHA256 tag of the
    pickle, made with the signing key of the current data key and verified (in constant
    time) against those of the current and the previous keys (``CURATOR_PREVIOUS_DATA_KEYS``)
    *before* anything is unpickled: a message queued before a data-key rotation is still
    taken, and a forged one (unsigned, or signed with another key) is never unpickled.

    A message that fails verification makes :meth:`deserialize` log a warning (its length
    only, never its bytes) and raise :class:`UnauthenticatedMessage`, whose text is fixed.
    Huey has removed the message from its storage by then: its consumer logs "Error
    reading from queue" with that exception and drops the message (the scheduler's reader
    likewise logs "Unable to deserialize task." and drops it). A genuine job lost so
    (one queued before this check existed, or under a key no longer configured) carried a
    release id only: the release still holds its lease (``lease_owner`` ``queued`` until
    ``lease_expires_at``), and when that expires the sweeper
    (:func:`app.releases.stages.sweep`) enqueues it again, signed."""

    def __init__(self, data_key: bytes) -> None:
        super().__init__()
        keys = signing_keys(data_key)
        self._signing_key = keys[0]
        self._verifying_keys = tuple(keys)

    def _tag(self, key: bytes, body: bytes) -> bytes:
        return hmac.new(key, body, hashlib.sha256).digest()

    def _serialize(self, data: Any) -> bytes:
        body = pickle.dumps(data, self.pickle_protocol)
        return self._tag(self._signing_key, body) + body

    def _deserialize(self, data: bytes) -> Any:
        data = bytes(data)
        tag, body = data[:TAG_BYTES], data[TAG_BYTES:]
        verified = False
        for key in self._verifying_keys:
            verified |= hmac.compare_digest(tag, self._tag(key, body))
        if not verified:
            log.warning(
                "dropped a queue message of %d bytes that failed authentication (forged, "
                "or signed under a data key no longer configured); a release it named is "
                "re-enqueued by the sweeper when its lease expires",
                len(data),
            )
            raise UnauthenticatedMessage("queue message failed authentication; not unpickled")
        return pickle.loads(body)  # noqa: S301 - the tag above authenticates it


#: How long a standalone worker told to stop (SIGTERM) lets its running stages finish.
SHUTDOWN_SECONDS = 30
#: How long a consumer's worker waits before it reads a queue it could not reach again
#: (the consumer's longest wait between two reads of an empty queue, ``max_delay``).
UNREACHABLE_RETRY_SECONDS = 1.0
#: Errors of Redis itself not answering (refused, dropped, timed out, still loading its
#: data), not of a command or a message: a Redis that is down or restarting.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError)


class Reachability:
    """Whether the queue's storage can be reached, told once a change: one warning when it
    cannot (by the error's type only: a Redis URL can carry its password) and one info line
    when it can again. One per :class:`Queue`, so per process: shared by a consumer's
    worker threads, its scheduler, and every enqueue (the API's release requests, the
    stages, the sweeper).

    Redis refusing the credentials (redis-py's ``AuthenticationError``, a
    ``ConnectionError``: a wrong password or user, ``NOAUTH``, a disabled ACL user) is
    taken as quietly, but told as an ERROR that says it is the configuration, not an
    outage: no sweep can succeed until an operator fixes the URL or Redis."""

    def __init__(self, what: str) -> None:
        self.what = what
        #: Why it cannot be reached: None while it can, else "refused" or "unreachable".
        self._why: str | None = None
        self._lock = threading.Lock()

    @property
    def reachable(self) -> bool:
        return self._why is None

    def _change(self, why: str | None, tell: Callable[[], None]) -> None:
        """Record ``why`` (None: reached) and, when it changed, ``tell`` it, both under the
        lock: told after it, a failure and a success racing at an outage's start could log
        "reached again" before "cannot be reached", the last line wrong until the next
        change."""
        with self._lock:
            if self._why == why:
                return
            self._why = why
            tell()

    def lost(self, exc: BaseException) -> None:
        refused = isinstance(exc, RedisAuthenticationError)
        if refused:
            tell = functools.partial(
                log.error,
                "the job queue (%s) refuses the credentials of CURATOR_REDIS_URL (%s): a "
                "configuration error, not an outage; fix the URL's user and password or "
                "Redis's (requirepass, ACL). Queued releases wait and releases are not "
                "enqueued until then (said again when it is reached)",
                self.what,
                type(exc).__name__,
            )
        else:
            tell = functools.partial(
                log.warning,
                "the job queue (%s) cannot be reached (%s); queued releases wait, workers "
                "read it again every %g s, and a release that could not be enqueued meanwhile "
                "is enqueued again by the sweeper when its lease runs out (said again when it "
                "is back)",
                self.what,
                type(exc).__name__,
                UNREACHABLE_RETRY_SECONDS,
            )
        self._change("refused" if refused else "unreachable", tell)

    def back(self) -> None:
        # read without the lock first: the common case, after every read of the queue
        if not self.reachable:
            self._change(
                None,
                functools.partial(log.info, "the job queue (%s) can be reached again", self.what),
            )


class _TimedOutReadsRaise(RedisStorage):  # type: ignore[misc]
    """Huey's Redis storage whose blocking read (``BRPOP``) lets redis's ``TimeoutError``
    through: Huey's takes it as an empty queue and returns nothing, so a worker reading a
    Redis that never answers (a host that drops packets: what ``CURATOR_REDIS_TIMEOUT``
    is for) was never told unreachable, and each timed-out read told Redis "reached
    again". An empty queue is ``BRPOP``'s nil after its own timeout
    (:data:`app.config.QUEUE_BLOCKING_READ_SECONDS`), well within the socket's."""

    def dequeue(self) -> Any:
        if not self.blocking:
            return super().dequeue()
        popped = self.conn.brpop(self.queue_key, timeout=self.read_timeout)
        return None if popped is None else popped[1]


class _ReportsUnreachableRedis(RedisHuey):  # type: ignore[misc]
    """Huey on Redis whose consumer reads (``dequeue``, ``read_schedule``) take Redis not
    answering quietly: Huey's consumer logged "Error reading from queue" (and "Error
    reading schedule.") with a full traceback about every second, from each worker thread
    and the scheduler, for as long as Redis was down. Such a read now returns nothing (a
    worker waits :data:`UNREACHABLE_RETRY_SECONDS` first, as Huey waited after its error),
    and :class:`Reachability` says once that Redis was lost and once that it is back. Any
    other error (a message that fails authentication, a Redis that refuses a command) is
    still raised, and logged by Huey as before; so is every task's failure (Huey has no
    setting or hook for its own read errors: its consumer logs every one)."""

    storage_class = _TimedOutReadsRaise

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reachability = Reachability("Redis")

    def dequeue(self) -> Any:
        try:
            task = super().dequeue()
        except UNREACHABLE as exc:
            self.reachability.lost(exc)
            time.sleep(UNREACHABLE_RETRY_SECONDS)
            return None
        self.reachability.back()
        return task

    def read_schedule(self, timestamp: Any = None) -> list[Any]:
        try:
            tasks: list[Any] = super().read_schedule(timestamp)
        except UNREACHABLE as exc:
            self.reachability.lost(exc)
            return []  # the scheduler reads again after its interval (1 s)
        self.reachability.back()
        return tasks


class _EmbeddedConsumer(Consumer):  # type: ignore[misc]
    """A consumer inside another process (the API server): it leaves the host's signal
    handlers alone; the host stops it."""

    def _set_signal_handlers(self) -> None:
        return None


def redis_pool(settings: Settings) -> ConnectionPool:
    """The connections to ``settings.redis_url`` of a process's queue (its enqueues, its
    consumer's reads, ``/readyz``'s ping), each with timeouts from the settings: a
    connection fails (redis ``TimeoutError``, taken as Redis unreachable) after
    ``redis_connect_timeout`` seconds to open and ``redis_timeout`` seconds without an
    answer, not after the kernel's TCP timeouts (minutes) when the host drops packets.
    redis-py before 8.0 set no timeout at all (8.0 sets 5 s); Huey's ``url=`` takes none.
    The read timeout is longer than a worker's blocking read of an empty queue
    (:data:`app.config.QUEUE_BLOCKING_READ_SECONDS`, Settings checks it). Options in the
    URL's query string (``?socket_timeout=...``) win over these (redis-py's rule)."""
    assert settings.redis_url is not None
    return ConnectionPool.from_url(
        settings.redis_url,
        socket_connect_timeout=settings.redis_connect_timeout,
        socket_timeout=settings.redis_timeout,
    )


class Queue:
    """The queue of ``settings``; its messages are authenticated with keys derived from
    ``data_key``, the data key ring (:class:`AuthenticatedSerializer`)."""

    def __init__(self, settings: Settings, data_key: bytes) -> None:
        self.backend = "redis" if settings.redis_url else "sqlite"
        self.huey: Huey
        #: Whether Redis answers, told once a change (None on SQLite: a file, always there).
        self.reachability: Reachability | None = None
        serializer = AuthenticatedSerializer(data_key)
        if settings.redis_url:
            redis_huey = _ReportsUnreachableRedis(
                settings.queue_name,
                connection_pool=redis_pool(settings),
                blocking=True,
                read_timeout=QUEUE_BLOCKING_READ_SECONDS,
                results=False,
                serializer=serializer,
            )
            self.huey, self.reachability = redis_huey, redis_huey.reachability
        else:
            settings.queue_path.parent.mkdir(parents=True, exist_ok=True)
            self.huey = SqliteHuey(
                settings.queue_name,
                filename=str(settings.queue_path),
                results=False,
                serializer=serializer,
            )
        for module in TASK_MODULES:
            importlib.import_module(module)
        self._tasks: dict[str, Any] = {
            spec.name: self.huey.task(
                name=spec.name, retries=spec.retries, retry_delay=spec.retry_delay
            )(guarded(spec.name, spec.fn))
            for spec in _REGISTRY.values()
        }

    @property
    def task_names(self) -> list[str]:
        return sorted(self._tasks)

    def enqueue(self, name: str, *args: Any) -> bool:
        """Queue the job ``name(*args)``; whether it was queued. Redis not answering
        (:data:`UNREACHABLE`) is not raised: it is told once per outage by the queue's
        :class:`Reachability` (a warning, the error's type only), and the job is left to
        the sweeper. Every job names a release whose row holds a ``queued`` lease, taken in
        the transaction this enqueue follows, and when that lease runs out the sweeper
        (:func:`app.releases.stages.sweep`) enqueues the release again. Before, each such
        enqueue was a commit hook's ERROR with its frames: one per release request, and
        one per release at every sweep, for as long as Redis was down. Any other error is
        raised (a commit hook logs it with its frames: a bug)."""
        try:
            self._tasks[name](*args)
        except UNREACHABLE as exc:
            if self.reachability is None:
                raise
            self.reachability.lost(exc)
            log.debug(
                "job %s%r not enqueued (%s); left to the sweeper", name, args, type(exc).__name__
            )
            return False
        if self.reachability is not None:
            self.reachability.back()
        return True

    def ping(self) -> None:
        """Raise if the queue's storage cannot be reached."""
        if self.backend == "redis":
            self.huey.storage.conn.ping()
        else:
            self.huey.pending_count()

    def pending(self) -> int:
        return int(self.huey.pending_count())

    def consumer(self, workers: int, *, embedded: bool) -> Consumer:
        """A consumer of this queue. A standalone worker stops gracefully on SIGTERM (what
        ``docker stop`` and systemd send; Huey's default is SIGINT): it takes no new task
        and lets a running stage finish for up to ``SHUTDOWN_SECONDS`` before it is
        interrupted (its lease then runs out and another worker takes the stage over, one
        of its ``MAX_*_ATTEMPTS`` used). SIGINT (Ctrl-C) stops it at once."""
        cls = _EmbeddedConsumer if embedded else Consumer
        return cls(
            self.huey,
            workers=workers,
            worker_type="thread",
            periodic=True,
            initial_delay=0.05,
            max_delay=1.0,
            shutdown_timeout=SHUTDOWN_SECONDS,
            graceful_signal="TERM",
        )
