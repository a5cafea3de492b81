"""What one pass of the sweeper costs as finished work piles up.

Run from the repository root:

    python -m bench.sweeper_history [--finished 1000,10000,100000] [--database-url URL]
        [--name sweeper_history]

Why: the sweeper (:class:`app.releases.stages.Sweeper`) runs every ``lease_seconds / 2``
(30 s by default) for the whole life of the service. Its work should follow the live work
(releases not yet ended, files that exist), not every release and dataset ever recorded.

Protocol: a fresh database (a SQLite file, or the PostgreSQL database of
``--database-url``, whose ``public`` schema is dropped and migrated again) holding, per
step, ``F`` finished releases (``succeeded``; each with a ``v1`` directory of one file on
disk, as a published release has), 10 live ones (``measuring``, lease not expired),
``F / 10`` datasets with a stored file and ``F / 10`` whose data were deleted (file gone).
One pass is what :class:`~app.releases.stages.Sweeper` runs: :func:`sweep`, then
:func:`remove_stray_files` and :func:`remove_stale_work` in one read-only transaction;
each is timed alone, median of ``--repeat`` passes. ``rows`` counts the rows the pass's
statements returned (``cursor.rowcount`` in SQLAlchemy's ``after_cursor_execute``,
on PostgreSQL only: sqlite3 does not count a SELECT's rows) and ``entries`` the
directory entries it listed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, insert, text

from app.config import Settings
from app.core import migrations
from app.core.services import Services
from app.datasets.service import remove_stray_files
from app.models import Dataset, Release, User
from app.models.base import utcnow
from app.releases.stages import remove_stale_work, sweep
from bench._common import Run

LIVE = 10


def _reset_postgres(url: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("DROP SCHEMA public CASCADE"))
        connection.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@contextmanager
def fresh_services(database_url: str | None) -> Iterator[Services]:
    """The services of a new, migrated database: a SQLite file in a temporary directory
    (with the data directory), or the PostgreSQL database of ``database_url``, whose
    ``public`` schema is dropped and migrated again."""
    with tempfile.TemporaryDirectory(prefix="curator-bench-") as tmp:
        url = database_url or f"sqlite:///{tmp}/curator.db"
        if database_url:
            _reset_postgres(url)
        migrations.upgrade(url)
        settings = Settings(data_dir=Path(tmp) / "data", database_url=url, redis_url=None)
        services = Services.build(settings)
        try:
            yield services
        finally:
            services.close()


def steps_on_fresh_databases(
    database_url: str | None,
    sizes: str,
    key: str,
    step: Callable[[Services, int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """``step(services, size)`` for each of the comma-separated ``sizes``, each on a fresh
    database (:func:`fresh_services`); each result is printed as it comes and returned
    with its size under ``key``."""
    steps = []
    for size in (int(part) for part in sizes.split(",")):
        with fresh_services(database_url) as services:
            result = {key: size, **step(services, size)}
        print(result, flush=True)
        steps.append(result)
    return steps


def _populate(services: Services, finished: int) -> None:
    settings = services.settings
    now = utcnow()
    user_id = uuid.uuid4()
    datasets: list[dict[str, Any]] = []
    for i in range(max(1, finished // 5)):
        deleted = i % 2 == 1
        dataset_id = uuid.uuid4()
        name = f"{dataset_id}.parquet"  # as store_dataset names it
        if not deleted:
            (settings.datasets_dir / name).write_bytes(b"x")
            old = now.timestamp() - 86_400 * 30
            os.utime(settings.datasets_dir / name, (old, old))
        datasets.append(
            {
                "id": dataset_id,
                "owner_id": user_id,
                "name": f"d{i}",
                "columns": [],
                "n_rows": 10,
                "out_of_bounds": "clip",
                "epsilon_total": 10**12,
                "delta_total": 0,
                "storage_name": name,
                "validation": {},
                "created_at": now,
                "data_deleted_at": now if deleted else None,
            }
        )
    releases: list[dict[str, Any]] = []
    for i in range(finished + LIVE):
        live = i >= finished
        release_id = uuid.uuid4()
        if not live:
            version = settings.releases_dir / str(release_id) / "v1"
            version.mkdir(parents=True)
            (version / "synopsis.json").write_bytes(b"{}")
        releases.append(
            {
                "id": release_id,
                "dataset_id": datasets[(i % len(datasets)) & ~1]["id"],
                "mechanism": "smooth_synopsis",
                "status": "measuring" if live else "succeeded",
                "epsilon": 1,
                "delta": 0,
                "params": {},
                "created_by": user_id,
                "created_at": now,
                "updated_at": now,
                "columns": [],
                "resolved": {},
                "synthesis_params": {},
                "artifacts": {},
                "lease_owner": "bench" if live else None,
                "lease_expires_at": now.replace(year=now.year + 1) if live else None,
                "published_version": None if live else 1,
                "finished_at": None if live else now,
            }
        )
    with services.db.transaction() as session:
        session.execute(
            insert(User),
            [{"id": user_id, "name": "bench", "role": "curator", "created_at": now}],
        )
        for start in range(0, len(datasets), 5000):
            session.execute(insert(Dataset), datasets[start : start + 5000])
        for start in range(0, len(releases), 5000):
            session.execute(insert(Release), releases[start : start + 5000])
    if services.db.engine.dialect.name == "postgresql":
        with services.db.engine.connect() as connection:
            connection.execute(text("ANALYZE"))
            connection.commit()


class _Counter:
    """Rows fetched by the statements run while it is on, and directory entries listed."""

    def __init__(self, services: Services) -> None:
        self.rows = 0
        self.entries = 0
        self.on = False
        engine = services.db.engine

        @event.listens_for(engine, "after_cursor_execute")
        def _count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if self.on and statement.lstrip().upper().startswith("SELECT"):
                # psycopg counts a SELECT's rows; sqlite3 says -1 (not counted)
                self.rows += max(cursor.rowcount, 0)

        real_glob = Path.glob

        def glob(path: Path, pattern: str, *a: Any, **k: Any) -> Any:
            found = list(real_glob(path, pattern, *a, **k))
            if self.on:
                self.entries += len(found)
            return iter(found)

        Path.glob = glob  # type: ignore[method-assign]


def _time_pass(services: Services, counter: _Counter, repeat: int) -> dict[str, Any]:
    parts: dict[str, list[float]] = {"sweep": [], "remove_stray_files": [], "remove_stale_work": []}
    counts: dict[str, dict[str, int]] = {}

    def timed(name: str, call: Any) -> None:
        counter.rows = counter.entries = 0
        counter.on = True
        started = time.perf_counter()
        call()
        parts[name].append(time.perf_counter() - started)
        counter.on = False
        counts[name] = {"rows": counter.rows, "entries": counter.entries}

    for _ in range(repeat):
        timed("sweep", lambda: sweep(services))
        with services.db.transaction(read_only=True) as session:
            timed("remove_stray_files", lambda: remove_stray_files(session, services))
            timed("remove_stale_work", lambda: remove_stale_work(session, services))
    result = {
        name: {"median_ms": round(1000 * statistics.median(times), 2), **counts[name]}
        for name, times in parts.items()
    }
    result["pass_ms"] = round(sum(r["median_ms"] for r in result.values()), 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", default="1000,10000,100000")
    parser.add_argument("--database-url", default=None, help="PostgreSQL; SQLite when absent")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--name", default="sweeper_history")
    args = parser.parse_args(argv)
    run = Run(args.name, "python -m bench.sweeper_history " + " ".join(argv or sys.argv[1:]))

    def step(services: Services, finished: int) -> dict[str, Any]:
        _populate(services, finished)
        return _time_pass(services, _Counter(services), args.repeat)

    steps = steps_on_fresh_databases(args.database_url, args.finished, "finished", step)
    backend = "PostgreSQL" if args.database_url else "SQLite"
    lines = [
        f"# One sweeper pass against finished history ({backend})",
        "",
        "Median of the passes; rows: rows the pass's SELECTs returned; entries: directory "
        "entries it listed (bench/sweeper_history.py's docstring has the protocol).",
        "",
        "| finished releases | sweep ms (rows) | remove_stray_files ms (rows, entries) | "
        "remove_stale_work ms (rows, entries) | pass ms |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in steps:
        a, b, c = s["sweep"], s["remove_stray_files"], s["remove_stale_work"]
        lines.append(
            f"| {s['finished']} | {a['median_ms']} ({a['rows']}) | "
            f"{b['median_ms']} ({b['rows']}, {b['entries']}) | "
            f"{c['median_ms']} ({c['rows']}, {c['entries']}) | {s['pass_ms']} |"
        )
    run.write("\n".join(lines), {"backend": backend, "live": LIVE, "steps": steps})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
