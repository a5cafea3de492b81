"""The process-wide services (settings, database, raw-data key, queue), outside FastAPI so
that the worker builds the same thing the API does."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, inspect, select

from app.config import KEY_FILE_NAME, ConfigError, Settings
from app.core.db import DEFAULT_CONNECTIONS, Database
from app.ledger.journal import SESSION_KEY, SpendJournal
from app.models import Dataset
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
        Raises :class:`~app.config.ConfigError` when the configuration cannot work,
        among which a missing data key while the database holds stored datasets."""
        settings.prepare_directories()
        db = Database(settings.resolved_database_url, connections=connections)
        try:
            if settings.existing_key() is None:
                _refuse_a_new_key_for_stored_data(db, settings)
            key = key_ring(settings.load_key(), settings.previous_keys())
        except BaseException:
            db.dispose()
            raise
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


def _refuse_a_new_key_for_stored_data(db: Database, settings: Settings) -> None:
    """Raise :class:`~app.config.ConfigError` rather than generate a data key while the
    database holds datasets with stored files: they were sealed with the service's key,
    which this process was started without (``CURATOR_DATA_KEY`` unset, ``data.key``
    missing: a restore that left the key behind, a container without its secret, a
    command run from another environment). A generated key opens none of them, and a
    later start with the real key would not open files uploaded under the generated one.
    A key set explicitly, even a new one, is the operator's choice and is not refused
    (``curator serve`` then logs how many datasets it does not open).

    Every dataset whose data were not deleted counts, whether or not it has file keys of
    its own: a file stored before revision 0012 (``file_keys`` null) has its data keys
    wrapped with the service key directly. A database of a revision before 0009 (no
    ``data_deleted_at``: no data were ever deleted) counts all its datasets."""
    with db.engine.connect() as connection:
        inspector = inspect(connection)
        if not inspector.has_table(Dataset.__tablename__):
            return  # a database not migrated yet holds no dataset
        columns = {column["name"] for column in inspector.get_columns(Dataset.__tablename__)}
        query = select(func.count()).select_from(Dataset.__table__)
        if Dataset.data_deleted_at.key in columns:
            query = query.where(Dataset.__table__.c.data_deleted_at.is_(None))
        stored = connection.scalar(query)
    if stored:
        raise ConfigError(
            f"no data key: CURATOR_DATA_KEY is not set and {settings.data_dir / KEY_FILE_NAME} "
            f"does not exist, but the database holds {stored} dataset(s) whose files were "
            "sealed with the service's key; no new key was generated. Set CURATOR_DATA_KEY "
            "(or put data.key back) to the key they were sealed with; if it is lost, set "
            "CURATOR_DATA_KEY to a new key deliberately: those files then stay unreadable"
        )


_current: Services | None = None


def set_current(services: Services | None) -> None:
    """Make ``services`` what worker tasks in this process use."""
    global _current
    _current = services


def current() -> Services:
    if _current is None:
        raise RuntimeError("no services configured in this process (curator serve/worker set them)")
    return _current
