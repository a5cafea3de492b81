"""Running Alembic from the service: ``curator migrate``, and the check ``serve`` makes."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from app.config import ConfigError
from app.core.db import make_engine

#: The migrations ship inside the package (``app/migrations``: ``alembic.ini``, ``env.py``,
#: the revisions), so an install from a wheel migrates as a checkout does.
PACKAGED_INI = Path(__file__).resolve().parents[1] / "migrations" / "alembic.ini"


def alembic_ini() -> Path:
    """``CURATOR_ALEMBIC_INI`` or the package's own :data:`PACKAGED_INI`."""
    explicit = os.environ.get("CURATOR_ALEMBIC_INI")
    path = Path(explicit) if explicit else PACKAGED_INI
    if not path.is_file():
        raise ConfigError(
            f"alembic.ini not found at {path}; set CURATOR_ALEMBIC_INI to its location"
        )
    return path


def alembic_config(url: str, *, configure_logging: bool = False) -> Config:
    config = Config(str(alembic_ini()))
    config.attributes["url"] = url
    config.attributes["configure_logging"] = configure_logging
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def resolve_revision(url: str, revision: str) -> str | None:
    """The revision id ``revision`` names (``head``, an id or a unique prefix); raises
    Alembic's ``CommandError`` or ``RevisionError`` when it names none or several."""
    script = ScriptDirectory.from_config(alembic_config(url))
    found = script.get_revision(revision)
    return None if found is None else found.revision


def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
