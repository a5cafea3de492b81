"""The process-wide services (settings, database, raw-data key, queue), outside FastAPI so
that the worker builds the same thing the API does."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.config import Settings
from app.core.db import DEFAULT_CONNECTIONS, Database
from app.ledger.journal import SESSION_KEY, SpendJournal
from app.storage.tables import key_ring
from app.worker.queue import Queue


@dataclass
class Services:
    settings: Settings
    db: Database
    #: The key ring of raw files (:func:`app.storage.tables.key_ring`): the current key, then
    #: the previous ones. Never in a repr that a log line could format.
    data_key: bytes = field(repr=False)
    queue: Queue

    @classmethod
    def build(cls, settings: Settings, *, connections: int = DEFAULT_CONNECTIONS) -> Services:
        """Prepare the data directory and key, connect the database (a pool of
        ``connections``, the most the process can hold at once), bind the queue.
        Raises :class:`~app.config.ConfigError` when the configuration cannot work."""
        key = key_ring(settings.prepare(), settings.previous_keys())
        db = Database(settings.resolved_database_url, connections=connections)
        # every spend the ledger commits is also journalled in DATA_DIR (app.ledger.journal)
        db.sessions.configure(info={SESSION_KEY: SpendJournal(settings.spend_journal_path)})
        return cls(
            settings=settings,
            db=db,
            data_key=key,
            queue=Queue(settings, key),
        )

    def close(self) -> None:
        self.db.dispose()


_current: Services | None = None


def set_current(services: Services | None) -> None:
    """Make ``services`` what worker tasks in this process use."""
    global _current
    _current = services


def current() -> Services:
    if _current is None:
        raise RuntimeError("no services configured in this process (curator serve/worker set them)")
    return _current
