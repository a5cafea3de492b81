"""Settings, read from the environment (prefix ``CURATOR_``) and checked before anything starts.

- ``CURATOR_DATA_DIR`` (default ``./curator-data``): encrypted datasets, artifacts, the
  SQLite database and the SQLite job queue.
- ``CURATOR_DATABASE_URL`` (default ``sqlite:///<DATA_DIR>/curator.db``): ``sqlite:///...``
  or ``postgresql+psycopg://...``.
- ``CURATOR_REDIS_URL`` (default unset): Redis for the job queue; unset means a SQLite
  queue in DATA_DIR.
- ``CURATOR_REDIS_CONNECT_TIMEOUT`` (default 5 s) and ``CURATOR_REDIS_TIMEOUT`` (default
  5 s, at least :data:`QUEUE_BLOCKING_READ_SECONDS` + 1): how long a connection to Redis
  may take to open, and a command to be answered, before it fails as Redis unreachable
  (:class:`app.worker.queue.Queue`): a Redis host that drops packets made an enqueue, a
  worker's read or ``/readyz`` wait for the kernel's TCP timeouts (minutes).
- ``CURATOR_DATA_KEY`` (default: generated once into ``<DATA_DIR>/data.key``, mode 0600,
  by the first process that builds the services while the database holds no stored
  dataset; with stored datasets a missing key is refused, :meth:`app.core.services.Services.build`):
  the Fernet key that protects raw files at rest; the key that signs the queue's messages
  is derived from it (:class:`app.worker.queue.AuthenticatedSerializer`).
- ``CURATOR_PREVIOUS_DATA_KEYS`` (default unset): comma-separated Fernet keys that still
  open files written under an earlier ``CURATOR_DATA_KEY``, until ``curator
  rotate-data-key`` has re-encrypted them.
- ``CURATOR_MAX_UPLOAD_BYTES`` (default 1 GiB): larger uploads get 413; a Parquet file
  may decode to at most half this many cells (:func:`app.datasets.validation.max_cells`).
- ``CURATOR_MIN_FREE_BYTES`` (default 128 MiB; 0: not checked): an upload or a new release
  request is a 503 while the data directory has less free (:mod:`app.core.disk`).
- ``CURATOR_MAX_JSON_BYTES`` (default 64 MiB): larger bodies on every other route get 413;
  one over 64 KiB is read only from a caller with an active key (``app.main.BodyLimit``).
- ``CURATOR_ANSWER_CACHE_BYTES`` (default 2 GiB): memory each API process keeps of decoded
  releases for answers.
- ``CURATOR_MAX_ACTIVE_RELEASES`` (default 16; 0: no limit): releases a curator may have
  queued or running (measuring, synthesising, a re-synthesis among them) at once; a request
  past it is a 429 before anything is reserved (``app.releases.service``). The queue is
  first come, first served: without a limit one curator's flood of cheap requests (epsilon
  1e-12 each) held every worker for hours while other curators' releases waited.
- ``CURATOR_MAX_RELEASE_BYTES`` (default 4 GiB; 0: no limit): the largest predicted size of
  one release's files; a request, preview or re-synthesis predicted past it is a 422 before
  anything is reserved (``app.releases.service.check_release_bytes``, the bounds in
  ``app.storage.sizes``). The default is above the largest legitimate prediction, a
  ``graph_cuts`` release at 20,000 vertices (about 3 GiB).
- ``CURATOR_MAX_CURATOR_BYTES`` (default 0: no limit): the bytes a curator's releases may
  store: their published versions' files and the predicted files of their queued or
  running runs; a request or re-synthesis that would pass it is a 422
  ``storage_quota_exceeded`` before anything is reserved
  (``app.releases.service.check_curator_bytes``).
- ``CURATOR_LOG_LEVEL`` (default ``INFO``).
- ``CURATOR_LOG_FORMAT`` (default ``text``; ``json``: one object per line, :mod:`app.core.logs`).
- ``CURATOR_WORKER_THREADS`` (default 1): threads of a worker.
- ``CURATOR_BLAS_THREADS`` (default 1): threads each BLAS library (OpenBLAS under numpy and
  scipy) may use for one matrix product in ``curator serve`` and ``curator worker``; 0
  leaves the libraries' own default (one per core). The service already runs requests and
  release stages in threads of their own, and a BLAS pool per call on top oversubscribes
  the cores (:func:`app.core.threads.limit_blas_threads`).
- ``CURATOR_LEASE_SECONDS`` (default 60): how long a worker holds a release stage without
  renewing it; after that a sweeper hands the stage to another worker.
- ``CURATOR_LOCK_TIMEOUT`` (default 10 s; 0: no limit): on PostgreSQL, how long a
  request's write transaction waits for a lock (a dataset's row, a release's, an API key's
  advisory lock) before it gives up with a 503 and rolls back
  (:meth:`app.core.db.Database.transaction`). Without it, a key's revocation waiting behind
  one slow write of that key made the key's later writes wait too, each holding one of the
  API's transaction slots. Workers' stages and the sweeper have none (their waits are
  bounded by their leases' holders). SQLite's own bound is its 30 s busy timeout.
- ``CURATOR_QUEUE_NAME`` (default ``curator``): the queue's name (Redis key prefix), so
  that several deployments can share one Redis.
- ``CURATOR_API_DOCS`` (default true): serve the interactive API pages ``/docs`` and
  ``/redoc``, which load their scripts from a public CDN; ``/openapi.json`` is always served.
- ``CURATOR_METRICS_TOKEN`` (default unset: no ``/metrics``, 404): the bearer token that
  ``GET /metrics`` (Prometheus's format, :mod:`app.core.metrics`) requires; at least 24
  characters. A token of its own, not an API key, so that the scraper's credential reads
  counts and nothing else.
"""

from __future__ import annotations

import os
import secrets
import stat
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from cryptography.fernet import Fernet
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

KEY_FILE_NAME = "data.key"
#: How long a worker's read of an empty Redis queue blocks (Huey's ``BRPOP`` timeout,
#: its ``read_timeout``): ``CURATOR_REDIS_TIMEOUT`` must be longer, or every read of an
#: empty queue would time out and reconnect.
QUEUE_BLOCKING_READ_SECONDS = 1
#: Shortest ``CURATOR_METRICS_TOKEN`` taken (a guessable token reads the metrics).
MIN_METRICS_TOKEN_CHARS = 24
#: SQLAlchemy drivers the service is installed with (a bare ``postgresql://`` means psycopg2
#: in SQLAlchemy 2.0, which is not installed).
_DATABASE_DRIVERS = frozenset({"sqlite", "sqlite+pysqlite", "postgresql+psycopg"})


class ConfigError(Exception):
    """The configuration cannot work; the message says what to change."""


class Settings(BaseSettings):
    # a refused value is not quoted in the error (pydantic's "input_value=..."): it may be a
    # secret (the metrics token, a database URL's password) and the error reaches a
    # traceback or a log (load_settings raises from it)
    model_config = SettingsConfigDict(
        env_prefix="CURATOR_", extra="ignore", hide_input_in_errors=True
    )

    data_dir: Path = Path("./curator-data")
    database_url: str | None = None
    redis_url: str | None = None
    #: Seconds a connection to Redis may take to open (a host that drops packets).
    redis_connect_timeout: float = Field(default=5.0, gt=0, le=300)
    #: Seconds Redis may take to answer a command; longer than a worker's blocking read.
    redis_timeout: float = Field(default=5.0, ge=QUEUE_BLOCKING_READ_SECONDS + 1, le=300)
    data_key: SecretStr | None = None
    #: Keys that wrapped files before ``data_key`` (comma-separated): files still open with
    #: them until ``curator rotate-data-key`` has re-encrypted them under ``data_key``.
    previous_data_keys: SecretStr | None = None
    max_upload_bytes: int = Field(default=1 << 30, gt=0)
    #: Free space the data directory must have for an upload or a release request to be
    #: taken (:func:`app.core.disk.ensure_free_space`); 0: not checked.
    min_free_bytes: int = Field(default=128 << 20, ge=0)
    #: Largest body of every request but the dataset upload (JSON: releases, answers).
    max_json_bytes: int = Field(default=64 << 20, gt=0)
    #: Releases a curator may have queued or running at once (0: no limit).
    max_active_releases: int = Field(default=16, ge=0)
    #: Largest predicted size of one release's files (one synthesis version, every format),
    #: checked before anything is reserved (0: no limit). The prediction is an upper bound
    #: (:meth:`app.releases.registry.Mechanism.artifact_bytes`); see the README's limits.
    max_release_bytes: int = Field(default=4 << 30, ge=0)
    #: Bytes a curator's releases may store, published and predicted (0: no limit).
    max_curator_bytes: int = Field(default=0, ge=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: ``text`` lines, or ``json``: one object per line, for a log aggregator
    #: (:mod:`app.core.logs`).
    log_format: Literal["text", "json"] = "text"
    worker_threads: int = Field(default=1, ge=1, le=64)
    #: Threads per BLAS library for one matrix product; 0: the libraries' default.
    blas_threads: int = Field(default=1, ge=0, le=256)
    queue_name: str = Field(default="curator", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    lease_seconds: float = Field(default=60.0, ge=0.5, le=3600)
    #: Seconds a request's write transaction waits for a lock on PostgreSQL (0: no limit).
    lock_timeout: float = Field(default=10.0, ge=0, le=3600)
    #: Memory each API process keeps of decoded releases for answers (estimated by
    #: :func:`app.core.footprint.footprint`); a release larger than this is decoded per
    #: request and not kept. 0 keeps none.
    answer_cache_bytes: int = Field(default=2 << 30, ge=0)
    #: Serve ``/docs`` and ``/redoc`` (FastAPI's pages load Swagger UI and ReDoc from
    #: cdn.jsdelivr.net, and a user may paste a key into them).
    api_docs: bool = True
    #: The bearer token ``GET /metrics`` requires (:mod:`app.core.metrics`); unset: no
    #: ``/metrics`` (404).
    metrics_token: SecretStr | None = None

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("metrics_token")
    @classmethod
    def _strong_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None  # unset, or set empty (docker-compose passes an unset variable so)
        token = value.get_secret_value()
        if len(token) < MIN_METRICS_TOKEN_CHARS or any(c.isspace() for c in token):
            raise ValueError(
                f"must be at least {MIN_METRICS_TOKEN_CHARS} characters without spaces "
                '(generate one: python3 -c "import secrets; print(secrets.token_urlsafe(32))")'
            )
        return value

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            url = make_url(value)
        except (ArgumentError, ValueError):
            raise ValueError(
                "is not a database URL (sqlite:///<path> or postgresql+psycopg://<user>@<host>/<db>)"
            ) from None
        if url.drivername.startswith("postgresql") and "@" in f"{url.host}{url.database}":
            # make_url ends the password at its first @: the rest became the host, and the
            # driver's error would print it
            raise ValueError("has an unescaped @ in its user or password: write it as %40")
        if url.drivername not in _DATABASE_DRIVERS:
            raise ValueError(
                f"names the driver {url.drivername!r}; use sqlite:///<path> or "
                "postgresql+psycopg://<user>@<host>/<db>"
            )
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value == "":
            return None
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        if value is not None:
            # the query string's options win over CURATOR_REDIS_TIMEOUT (redis-py's rule):
            # held to its least value too (the message never quotes the URL: its password)
            for timeout in parse_qs(urlsplit(value).query).get("socket_timeout", []):
                try:
                    shorter = float(timeout) < QUEUE_BLOCKING_READ_SECONDS + 1
                except ValueError:
                    raise ValueError("has a socket_timeout that is not a number") from None
                if shorter:
                    raise ValueError(
                        f"has a socket_timeout under {QUEUE_BLOCKING_READ_SECONDS + 1} s: "
                        f"a worker's read of an empty queue blocks {QUEUE_BLOCKING_READ_SECONDS}"
                        " s in Redis"
                    )
        return value

    # Derived locations -----------------------------------------------------------------------

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'curator.db').resolve()}"

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def releases_dir(self) -> Path:
        return self.data_dir / "releases"

    @property
    def tmp_dir(self) -> Path:
        return self.data_dir / "tmp"

    @property
    def spend_journal_path(self) -> Path:
        return self.data_dir / "spends.jsonl"

    @property
    def queue_path(self) -> Path:
        return self.data_dir / "queue.db"

    def prepare(self) -> bytes:
        """Create the data directories and return the Fernet key (bytes) for raw files,
        generated into ``<DATA_DIR>/data.key`` when the service has none.

        Raises :class:`ConfigError` with a message that says what to fix.
        """
        self.prepare_directories()
        return self.load_key()

    def prepare_directories(self) -> None:
        """Create the data directories (no key: :meth:`prepare`). Raises
        :class:`ConfigError` with a message that says what to fix."""
        try:
            os.fsencode(self.data_dir).decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(
                f"CURATOR_DATA_DIR ({self.data_dir}) is not a UTF-8 path: the dataset and "
                "release files are written by pyarrow, which names files in UTF-8 only; "
                "rename the directory or choose another"
            ) from None
        try:
            # owner-only (0700) where we create them: raw tables are encrypted, but the
            # database, the queue and the release artifacts are not, and the default key
            # file sits here too. An existing directory keeps the mode it was given (the
            # curator command warns when it is open to others, and its umask keeps the
            # files it writes closed to them).
            for path in (self.data_dir, self.datasets_dir, self.releases_dir, self.tmp_dir):
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"CURATOR_DATA_DIR ({self.data_dir}) cannot be created: {exc.strerror}"
            ) from exc
        if not os.access(self.data_dir, os.W_OK):
            raise ConfigError(f"CURATOR_DATA_DIR ({self.data_dir}) is not writable")

    def previous_keys(self) -> list[bytes]:
        """``CURATOR_PREVIOUS_DATA_KEYS`` as Fernet keys (each checked), in order."""
        text = "" if self.previous_data_keys is None else self.previous_data_keys.get_secret_value()
        if not text.strip():
            return []  # unset, or set empty (docker-compose passes an unset variable so)
        keys = []
        for position, part in enumerate(text.split(",")):
            key = part.strip().encode()
            _check_fernet_key(key, f"CURATOR_PREVIOUS_DATA_KEYS (key {position + 1})")
            keys.append(key)
        return keys

    def existing_key(self) -> bytes | None:
        """The data key the service has (``CURATOR_DATA_KEY``, or ``<DATA_DIR>/data.key``),
        checked; ``None`` when it has none yet (:meth:`prepare` would generate one)."""
        if self.data_key is not None:
            key = self.data_key.get_secret_value().encode()
            _check_fernet_key(key, "CURATOR_DATA_KEY")
            return key
        key_file = self.data_dir / KEY_FILE_NAME
        if not key_file.exists():
            return None
        mode = stat.S_IMODE(key_file.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"{key_file} is readable by other users (mode {oct(mode)}); "
                f"run: chmod 600 {key_file}"
            )
        key = key_file.read_bytes().strip()
        _check_fernet_key(key, str(key_file))
        return key

    def load_key(self) -> bytes:
        """The data key the service has (:meth:`existing_key`), else one generated once
        into ``<DATA_DIR>/data.key`` (directories first: :meth:`prepare_directories`)."""
        key = self.existing_key()
        if key is not None:
            return key
        key_file = self.data_dir / KEY_FILE_NAME
        # Written whole beside it, then published with a hard link, which fails if the
        # name exists: processes starting at once on a new directory (two APIs, an API
        # and a worker) all end with the first key published, and none reads a file
        # created but not yet written.
        key = Fernet.generate_key()
        written = self.data_dir / f".{KEY_FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(key + b"\n")
            try:
                os.link(written, key_file)
            except FileExistsError:
                return self.load_key()  # another process published its key first
            except OSError:
                # no hard links on this filesystem (vfat, some SMB and FUSE mounts): the
                # name is created exclusively and then written, as before the link; a
                # process starting at that very instant may read it empty and refuse it
                return self._create_key_file(key_file, key)
        finally:
            written.unlink(missing_ok=True)
        return key

    def _create_key_file(self, key_file: Path, key: bytes) -> bytes:
        try:
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self.load_key()  # another process created it first
        with os.fdopen(fd, "wb") as handle:
            handle.write(key + b"\n")
        return key


def _check_fernet_key(key: bytes, where: str) -> None:
    try:
        Fernet(key)
    except ValueError as exc:
        raise ConfigError(
            f"{where} is not a Fernet key (32 url-safe base64-encoded bytes); "
            'generate one with: python -c "from cryptography.fernet import Fernet; '
            'print(Fernet.generate_key().decode())"'
        ) from exc


def load_settings() -> Settings:
    """Read the settings from the environment; raise :class:`ConfigError` on a bad value."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"CURATOR_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from exc


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
