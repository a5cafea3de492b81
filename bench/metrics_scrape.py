"""What a ``/metrics`` scrape costs the database as releases pile up.

Run from the repository root:

    python -m bench.metrics_scrape [--releases 1000,10000,100000] [--database-url URL]
        [--repeat 20] [--name metrics_scrape_sqlite]

Why: every API process answers ``GET /metrics`` with the installation's state read from
the database (:func:`app.core.metrics.read_installation`), at most once per
``CACHE_SECONDS`` per process. That read must stay cheap on an installation with years of
history: it is a few aggregate queries, one of them a grouped scan of ``releases``.

Protocol: a fresh database (a SQLite file, or the PostgreSQL database of
``--database-url``, whose ``public`` schema is dropped and migrated again) holding, per
step, ``R`` releases spread over the five release types and six statuses (most of them
finished, as in a real history; 1 % queued, 1 % measuring with half their leases run
out), ``R / 10`` datasets, and ledger entries as releases leave them (a reserve each; a
commit for the measured, a refund for the cancelled): about ``1.9 R`` entries. Timed:
``read`` (one :func:`read_installation` in its read-only transaction) and ``scrape`` (the
whole text a scrape answers, :meth:`ProcessMetrics.exposition`, its cache expired), median
and maximum of ``--repeat`` runs each after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import insert, text

from app.answers.service import answer_slots
from app.core.metrics import InstallationCollector, ProcessMetrics, read_installation
from app.core.services import Services
from app.models import Dataset, LedgerEntry, Release, User
from app.models.base import utcnow
from bench._common import Run
from bench.sweeper_history import steps_on_fresh_databases

MECHANISMS = (
    "smooth_synthetic",
    "smooth_synopsis",
    "compressed",
    "randomized_response",
    "graph_cuts",
)
#: Statuses of every 100 releases: a history, mostly finished.
STATUS_MIX = (
    ["succeeded"] * 80
    + ["failed"] * 10
    + ["cancelled"] * 7
    + ["queued", "measuring", "synthesizing"]
)


def _populate(services: Services, count: int) -> None:
    now = utcnow()
    user_id = uuid.uuid4()
    datasets = [
        {
            "id": uuid.uuid4(),
            "owner_id": user_id,
            "name": f"d{i}",
            "columns": [],
            "n_rows": 10,
            "out_of_bounds": "clip",
            "epsilon_total": 10**13,
            "delta_total": 10**12,
            "storage_name": f"d{i}.parquet",
            "validation": {},
            "created_at": now,
        }
        for i in range(max(1, count // 10))
    ]
    releases: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    for i in range(count):
        status = STATUS_MIX[i % len(STATUS_MIX)]
        running = status in ("measuring", "synthesizing")
        release_id = uuid.uuid4()
        dataset_id = datasets[i % len(datasets)]["id"]
        releases.append(
            {
                "id": release_id,
                "dataset_id": dataset_id,
                "mechanism": MECHANISMS[i % len(MECHANISMS)],
                "status": status,
                "epsilon": 10**10,
                "delta": 0,
                "params": {},
                "created_by": user_id,
                "created_at": now - timedelta(seconds=count - i),
                "updated_at": now,
                "columns": [],
                "resolved": {},
                "synthesis_params": {},
                "artifacts": {},
                "lease_owner": "bench" if running else None,
                "lease_expires_at": now + timedelta(seconds=60 * (1 if i % 2 else -1))
                if running
                else None,
                "stored_bytes": 4096 if status == "succeeded" else 0,
            }
        )
        entry = {"dataset_id": dataset_id, "release_id": release_id, "delta": 0}
        entry |= {"actor": "bench", "actor_id": None, "created_at": now}
        entries.append(entry | {"kind": "reserve", "epsilon": 10**10})
        if status in ("succeeded", "failed", "synthesizing"):
            entries.append(entry | {"kind": "commit", "epsilon": 10**10})
        elif status == "cancelled":
            entries.append(entry | {"kind": "refund", "epsilon": 10**10})
    with services.db.transaction() as session:
        session.execute(
            insert(User), [{"id": user_id, "name": "bench", "role": "curator", "created_at": now}]
        )
        for table, rows in ((Dataset, datasets), (Release, releases), (LedgerEntry, entries)):
            for start in range(0, len(rows), 5000):
                session.execute(insert(table), rows[start : start + 5000])
    if services.db.engine.dialect.name == "postgresql":
        engine = services.db.engine.execution_options(isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(text("VACUUM ANALYZE"))


def _timed(call: Any, repeat: int) -> dict[str, float]:
    call()  # warm-up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return {
        "median_ms": round(1000 * statistics.median(times), 2),
        "max_ms": round(1000 * max(times), 2),
    }


def _measure(services: Services, repeat: int) -> dict[str, Any]:
    def read() -> None:
        with services.db.transaction(read_only=True) as session:
            read_installation(session)

    collector = InstallationCollector(services.db, lambda: MECHANISMS)
    metrics = ProcessMetrics(collector, answer_slots)

    def scrape() -> None:
        collector.expire()
        metrics.exposition()

    return {"read": _timed(read, repeat), "scrape": _timed(scrape, repeat)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default="1000,10000,100000")
    parser.add_argument("--database-url", default=None, help="PostgreSQL; SQLite when absent")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--name", default="metrics_scrape_sqlite")
    args = parser.parse_args(argv)
    run = Run(args.name, "python -m bench.metrics_scrape " + " ".join(argv or sys.argv[1:]))

    def step(services: Services, count: int) -> dict[str, Any]:
        _populate(services, count)
        return _measure(services, args.repeat)

    steps = steps_on_fresh_databases(args.database_url, args.releases, "releases", step)
    backend = "PostgreSQL" if args.database_url else "SQLite"
    lines = [
        f"# A /metrics scrape's database read against release history ({backend})",
        "",
        "read: `read_installation` in its transaction; scrape: the whole exposition with its "
        "cache expired (read included). Median and maximum of the runs, ms "
        "(bench/metrics_scrape.py's docstring has the protocol).",
        "",
        "| releases | read median | read max | scrape median | scrape max |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in steps:
        r, c = s["read"], s["scrape"]
        lines.append(
            f"| {s['releases']} | {r['median_ms']} | {r['max_ms']} | "
            f"{c['median_ms']} | {c['max_ms']} |"
        )
    run.write("\n".join(lines), {"backend": backend, "steps": steps})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
