"""The job queue: Huey on SQLite (embedded default) or Redis (``CURATOR_REDIS_URL``).

Tasks are plain functions registered by name with :func:`task` in the domain packages'
``tasks.py`` (listed in ``TASK_MODULES``); a :class:`Queue` binds them to its Huey
instance. Jobs carry ids only; a task re-reads its rows in its own transaction.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from huey import RedisHuey, SqliteHuey
from huey.api import Huey
from huey.consumer import Consumer

from app.config import Settings
from app.core.errors import frames_only

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


#: How long a standalone worker told to stop (SIGTERM) lets its running stages finish.
SHUTDOWN_SECONDS = 30


class _EmbeddedConsumer(Consumer):  # type: ignore[misc]
    """A consumer inside another process (the API server): it leaves the host's signal
    handlers alone; the host stops it."""

    def _set_signal_handlers(self) -> None:
        return None


class Queue:
    def __init__(self, settings: Settings) -> None:
        self.backend = "redis" if settings.redis_url else "sqlite"
        self.huey: Huey
        if settings.redis_url:
            self.huey = RedisHuey(settings.queue_name, url=settings.redis_url, results=False)
        else:
            settings.queue_path.parent.mkdir(parents=True, exist_ok=True)
            self.huey = SqliteHuey(
                settings.queue_name, filename=str(settings.queue_path), results=False
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

    def enqueue(self, name: str, *args: Any) -> None:
        self._tasks[name](*args)

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
