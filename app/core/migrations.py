"""Running Alembic from the service: ``curator migrate``, and the check ``serve`` makes."""

from __future__ import annotations

import os
import re
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

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


#: ``+N`` (N revisions past the database's) or ``ID+N`` (N past revision ``ID``), as
#: Alembic's relative identifiers for an upgrade.
_RELATIVE = re.compile(r"^(?P<base>[0-9A-Za-z_]+)?\+(?P<steps>[1-9][0-9]*)$")


def resolve_revision(url: str, revision: str) -> str | None:
    """The revision id ``revision`` names: ``head``, an id or a unique prefix, or a
    relative ``+N`` / ``ID+N`` (counted along the revisions from base to head; ``+N``
    from the database's current revision, so it reads the database). Raises Alembic's
    ``CommandError`` or ``RevisionError`` when it names none, several, or one past head."""
    script = ScriptDirectory.from_config(alembic_config(url))
    relative = _RELATIVE.match(revision)
    if relative is None:
        found = script.get_revision(revision)
        return None if found is None else found.revision
    order = [r.revision for r in reversed(list(script.walk_revisions()))]  # base to head
    if relative["base"] is not None:
        start = script.get_revision(relative["base"])
        position = -1 if start is None else order.index(start.revision)
    else:
        current = current_revision(url)
        if current is not None and current not in order:
            raise CommandError(f"the database is at revision {current}, unknown to this code")
        position = -1 if current is None else order.index(current)
    target = position + int(relative["steps"])
    if target >= len(order):
        raise CommandError(
            f"{revision} is {target - len(order) + 1} past the head revision {order[-1]}"
        )
    return None if target < 0 else order[target]


def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
