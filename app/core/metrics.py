"""Operator metrics in Prometheus's text format (``GET /metrics``, :func:`metrics_response`).

Two kinds, because the installation runs as several processes (API processes, and workers,
which serve no HTTP):

- **The installation's state**, read from the database when a scrape asks for it
  (:class:`InstallationCollector`): releases by type and status, the age of the oldest
  queued release, running stages whose lease ran out, datasets, stored bytes and the
  ledger's totals. Every API process reports the same numbers, whichever one Prometheus
  reaches, and workers need no endpoint of their own. The reads are a few aggregate queries
  (:func:`read_installation`), kept for :data:`CACHE_SECONDS` and made by one scrape at a
  time (the others wait in the event loop: :meth:`ProcessMetrics.scrape`), so a storm of
  scrapes costs the database one read per period; on PostgreSQL a read waiting for a
  table's lock longer than ``CURATOR_LOCK_TIMEOUT`` fails. A read that fails
  gives ``curator_database_up 0`` (and counts ``curator_metrics_database_errors_total``),
  without the database's families, in an answer that is still a 200: the process's own
  metrics stay readable, as exporters do it (``pg_up`` of postgres_exporter), and an alert
  on ``curator_database_up == 0`` names the cause where a failed scrape would only say
  ``up == 0``.
- **This process's own** (:class:`HttpMetrics`, :func:`observe_slots`): requests by route
  template, method and status class, their latency, and the answer slots in use and
  waiting; plus prometheus_client's process collectors (memory, CPU, open files, GC).

Privacy (DESIGN rule 5): no label or value carries a data value, a dataset's, column's or
user's name, or an id. Labels are release types (the registry's names; any other value is
``other``), statuses (a fixed set), route *templates* (``/v1/releases/{release_id}``,
never the path asked for: it carries ids; a path no route matches is ``unmatched``), HTTP
methods (the standard ones; any other is ``other``) and status classes (``2xx``). Values
are counts, bytes, ages, and budget totals, which curators declare (public by rule 1), and
sums of the ledger's charges, which are public parameters of the releases
(``tests/core/test_metrics.py::test_no_name_or_id_reaches_the_scrape``).

Access: ``/metrics`` exists only when ``CURATOR_METRICS_TOKEN`` is set (404 otherwise, as
any unknown path), and answers only a request bearing that token (401 without a bearer
token, 403 with another one; :func:`check_token`). A dedicated token, not an API key:
Prometheus keeps its credential in a config file on another host, and a leaked metrics
token reads counts, where an admin key would create users and keys.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
from anyio.lowlevel import RunVar
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.routing import compile_path

from app.core.asgi import Scope
from app.core.db import Database, db_now
from app.core.errors import Forbidden, Unauthorized
from app.core.threads import ThreadLimit
from app.ledger.service import spent_and_reserved
from app.ledger.units import DELTA_SCALE, EPSILON_SCALE
from app.models import Dataset, LedgerEntry, Release
from app.models.release import ACTIVE_STATUSES, RELEASE_STATUSES
from app.releases.service import QUEUED

log = logging.getLogger("curator.metrics")

#: Seconds a read of the installation's state is served to scrapes before it is read
#: again (also a failed read: a database that is down is not asked by every scrape).
#: Prometheus scrapes every 15-60 s; a few scrapers (two Prometheus replicas) share a read.
CACHE_SECONDS = 5.0
#: Latency buckets (seconds): most routes answer in milliseconds, answers up to the work
#: bound's 12 s, downloads of large releases for minutes.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: Route label of a request that no route matched (its path is never a label).
UNMATCHED = "unmatched"
#: Method and release-type label of a value outside the known set.
OTHER = "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: Statuses whose stage a worker holds under a lease.
RUNNING_STATUSES = ("measuring", "synthesizing")
CONTENT_TYPE = CONTENT_TYPE_LATEST

# --- the installation's state, from the database ----------------------------------------


@dataclass
class Installation:
    """What :func:`read_installation` read: counts and sums only."""

    #: ``(mechanism, status) -> (releases, their stored bytes)``
    releases: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    oldest_queued_seconds: float = 0.0
    #: status -> running releases of that status whose lease has run out
    lease_expired: dict[str, int] = field(default_factory=dict)
    #: status -> active releases whose stage is enqueued and no worker has claimed
    waiting: dict[str, int] = field(default_factory=dict)
    datasets: int = 0
    epsilon: dict[str, float] = field(default_factory=dict)
    delta: dict[str, float] = field(default_factory=dict)
    read_seconds: float = 0.0


def adder(session: Session) -> Any:
    """The SQL sum of a column of ledger units over every dataset: exact on PostgreSQL
    (``sum``: ``numeric``); SQLite's ``sum`` of integers raises past 64 bits (ten datasets
    of epsilon 10^6 are 10^19 units), so there ``total``, a float sum."""
    return func.total if session.get_bind().dialect.name == "sqlite" else func.sum


def releases_by_type(add: Any) -> Select[Any]:
    """Releases and their stored bytes by type and status: a scan of
    ``ix_releases_mechanism_status_stored_bytes``, which holds every column it reads."""
    return select(
        Release.mechanism,
        Release.status,
        func.count(),
        func.coalesce(add(Release.stored_bytes), 0),
    ).group_by(Release.mechanism, Release.status)


def ledger_by_kind(add: Any) -> Select[Any]:
    """The ledger's sums by kind: a scan of ``ix_ledger_entries_kind_epsilon_delta``."""
    return select(LedgerEntry.kind, add(LedgerEntry.epsilon), add(LedgerEntry.delta)).group_by(
        LedgerEntry.kind
    )


def read_installation(session: Session) -> Installation:
    """The installation's state, in one read-only transaction: six aggregate queries, each
    on an index. The two over every row, releases by type (:func:`releases_by_type`) and
    the ledger by kind (:func:`ledger_by_kind`), scan covering indexes rather than the wide
    tables (migration 0016: 10^5 releases and their ledger in tens of ms,
    ``bench/results/metrics_scrape_*.md``); the oldest queued release and the running ones
    whose lease ran out are read through ``ix_releases_status_lease`` (few rows: the live
    work), as are the stages enqueued and waiting for a worker. "Now" is the database's
    clock (:func:`db_now`), as leases' are; a release's ``created_at`` is the clock of the
    API host that wrote it, so the oldest queued age is off by their skew (README
    "Clocks")."""
    started = time.perf_counter()
    now = db_now(session)
    add = adder(session)
    out = Installation()
    for mechanism, status, count, stored in session.execute(releases_by_type(add)):
        out.releases[(mechanism, status)] = (int(count), int(stored))
    oldest: datetime | None = session.scalar(
        select(func.min(Release.created_at)).where(Release.status == "queued")
    )
    if oldest is not None:
        out.oldest_queued_seconds = max(0.0, (now - oldest).total_seconds())
    # a worker's lease only: a stage enqueued and not yet claimed (owner ``queued``: after
    # its measure, a re-synthesis, a sweep) waits behind busy workers, and its lease runs
    # out as it waits (the sweeper then enqueues it again)
    for status, count in session.execute(
        select(Release.status, func.count())
        .where(
            Release.status.in_(RUNNING_STATUSES),
            Release.lease_owner != QUEUED,
            Release.lease_expires_at < now,
        )
        .group_by(Release.status)
    ):
        out.lease_expired[status] = int(count)
    for status, count in session.execute(
        select(Release.status, func.count())
        .where(Release.status.in_(ACTIVE_STATUSES), Release.lease_owner == QUEUED)
        .group_by(Release.status)
    ):
        out.waiting[status] = int(count)
    count, eps_total, delta_total = session.execute(
        select(func.count(), add(Dataset.epsilon_total), add(Dataset.delta_total))
    ).one()
    out.datasets = int(count)
    sums = {
        kind: (float(eps or 0), float(dlt or 0))
        for kind, eps, dlt in session.execute(ledger_by_kind(add))
    }
    # a dataset's balance, summed over every dataset
    spent, reserved = spent_and_reserved(sums, 0.0)
    for index, (values, scale, total) in enumerate(
        ((out.epsilon, EPSILON_SCALE, eps_total), (out.delta, DELTA_SCALE, delta_total))
    ):
        values["total"] = float(total or 0) / scale
        values["spent"] = spent[index] / scale
        values["reserved"] = reserved[index] / scale
    out.read_seconds = time.perf_counter() - started
    return out


def by_status(
    name: str, documentation: str, statuses: Collection[str], counts: dict[str, int]
) -> GaugeMetricFamily:
    """A gauge of releases labelled by status, each of ``statuses`` (0 when it has none)."""
    family = GaugeMetricFamily(name, documentation, labels=["status"])
    for status in statuses:
        family.add_metric([status], counts.get(status, 0))
    return family


class InstallationCollector(Collector):
    """The installation's state (:func:`read_installation`) as metric families, read at
    most once per ``max_age`` seconds (``clock``: monotonic seconds) and by one scrape at a
    time: the others wait for its read and share it. ``mechanisms``: the release types a
    label may name (the registry's, read at each scrape)."""

    def __init__(
        self,
        db: Database,
        mechanisms: Callable[[], Collection[str]],
        *,
        max_age: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        lock_timeout: float | None = None,
    ) -> None:
        self.db = db
        self.mechanisms = mechanisms
        self.max_age = max_age
        self.clock = clock
        self.lock_timeout = lock_timeout
        self.errors = 0
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._state: Installation | None = None

    def expire(self) -> None:
        """Read again at the next scrape."""
        with self._lock:
            self._read_at = None

    def state(self) -> Installation | None:
        """The cached read, or a new one once it is older than ``max_age``; ``None`` when
        the last read failed (logged by the error's type only: a driver's message can
        quote SQL parameters)."""
        with self._lock:
            now = self.clock()
            if self._read_at is None or now - self._read_at >= self.max_age:
                try:
                    # a table locked by a migration or VACUUM FULL fails the read after
                    # lock_timeout (PostgreSQL): it would hold the scrape, and the next
                    # ones behind it, until the lock was released
                    with self.db.transaction(
                        read_only=True, lock_timeout=self.lock_timeout
                    ) as session:
                        self._state = read_installation(session)
                except Exception as exc:
                    self.errors += 1
                    self._state = None
                    log.warning("metrics: the database read failed (%s)", type(exc).__name__)
                self._read_at = now
            return self._state

    def collect(self) -> Iterator[Metric]:
        state = self.state()
        yield GaugeMetricFamily(
            "curator_database_up",
            "1 if the last read of the installation's state from the database succeeded",
            value=0 if state is None else 1,
        )
        yield CounterMetricFamily(
            "curator_metrics_database_errors",
            "Reads of the installation's state that failed, in this process",
            value=self.errors,
        )
        if state is None:
            return
        yield GaugeMetricFamily(
            "curator_metrics_database_read_seconds",
            "How long the last read of the installation's state took",
            value=state.read_seconds,
        )
        known = set(self.mechanisms())
        releases = GaugeMetricFamily(
            "curator_releases", "Releases by type and status", labels=["mechanism", "status"]
        )
        stored = GaugeMetricFamily(
            "curator_release_stored_bytes",
            "Bytes the releases' published files take on disk, by type",
            labels=["mechanism"],
        )
        counts: dict[tuple[str, str], int] = {(m, s): 0 for m in known for s in RELEASE_STATUSES}
        stored_bytes: dict[str, int] = dict.fromkeys(known, 0)
        for (mechanism, status), (count, size) in state.releases.items():
            label = mechanism if mechanism in known else OTHER
            counts[(label, status)] = counts.get((label, status), 0) + count
            stored_bytes[label] = stored_bytes.get(label, 0) + size
        for (mechanism, status), count in sorted(counts.items()):
            releases.add_metric([mechanism, status], count)
        for mechanism, size in sorted(stored_bytes.items()):
            stored.add_metric([mechanism], size)
        yield releases
        yield stored
        yield GaugeMetricFamily(
            "curator_releases_oldest_queued_age_seconds",
            "Age of the oldest queued release (0 when none is queued)",
            value=state.oldest_queued_seconds,
        )
        yield by_status(
            "curator_releases_lease_expired",
            "Running releases whose worker's lease ran out (a dead or stalled worker; the "
            "sweeper hands them on)",
            RUNNING_STATUSES,
            state.lease_expired,
        )
        yield by_status(
            "curator_releases_waiting",
            "Releases whose stage is enqueued and not yet claimed by a worker, by status "
            "(queued: to be measured; synthesizing: measured, or re-synthesised, and waiting "
            "for its synthesis; measuring: a stage the sweeper enqueued again)",
            ACTIVE_STATUSES,
            state.waiting,
        )
        yield GaugeMetricFamily("curator_datasets", "Datasets", value=state.datasets)
        for name, values in (("epsilon", state.epsilon), ("delta", state.delta)):
            family = GaugeMetricFamily(
                f"curator_budget_{name}",
                f"Privacy budget {name} summed over every dataset: declared (total), spent "
                "(measured) and reserved (by releases not yet measured)",
                labels=["state"],
            )
            for state_name in ("total", "spent", "reserved"):
                family.add_metric([state_name], values[state_name])
            yield family


# --- this process's own -----------------------------------------------------------------


class ProcessMetrics:
    """The metrics of one API process, in a registry of its own (a process serves one app;
    tests build many)."""

    def __init__(self, installation: InstallationCollector, slots: ThreadLimit) -> None:
        self.registry = CollectorRegistry()
        # one scrape at a time, per event loop (a lock belongs to the loop that uses it)
        self._gate: RunVar[anyio.Lock] = RunVar("curator_metrics_scrape")
        self.installation = installation
        self.slots = slots
        self.registry.register(installation)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.requests = Counter(
            "curator_http_requests",
            "HTTP requests answered by this process, by route template, method and status "
            "class (none: the client left before an answer)",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "curator_http_request_duration_seconds",
            "Time from a request's arrival to the end of its answer, by route template",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.slots_total = Gauge(
            "curator_answer_slots",
            "Answers this process computes at once at most",
            registry=self.registry,
        )
        self.slots_in_use = Gauge(
            "curator_answer_slots_in_use", "Answer requests computing now", registry=self.registry
        )
        self.slots_waiting = Gauge(
            "curator_answer_slots_waiting",
            "Answer requests waiting for a slot (or for one of their user's)",
            registry=self.registry,
        )

    def observe_slots(self) -> None:
        """Read the answer slots' use (in the event loop: the limiter belongs to it)."""
        in_use, waiting = self.slots.usage()
        self.slots_total.set(self.slots.total)
        self.slots_in_use.set(in_use)
        self.slots_waiting.set(waiting)

    def exposition(self) -> bytes:
        """The scrape's body (reads the database when the cache is old: a thread's work)."""
        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """:meth:`observe_slots`, then :meth:`exposition` in a thread of the request
        threadpool (its database read is one of that thread's short transactions:
        :func:`app.core.deps.request_connections`), one scrape at a time: the others wait
        in the event loop, holding no thread, and are then answered from the cache. Waiting
        in a thread instead, scrapes behind a slow read each held one of the threadpool's
        threads, which every other request needs."""
        self.observe_slots()
        try:
            gate = self._gate.get()
        except LookupError:
            gate = anyio.Lock()
            self._gate.set(gate)
        async with gate:
            return await run_in_threadpool(self.exposition)


def route_templates(app: Any) -> list[tuple[re.Pattern[str], str]]:
    """Every route template of ``app`` with the pattern of the paths it takes: its own
    routes' (``/openapi.json``, ``/healthz``, ``/metrics``) and those of its routers, which
    the OpenAPI schema lists (FastAPI keeps included routers' routes apart, with no public
    listing)."""
    own = [
        route.path for route in app.router.routes if isinstance(getattr(route, "path", None), str)
    ]
    templates = dict.fromkeys([*own, *app.openapi()["paths"]])
    return [(compile_path(template)[0], template) for template in templates]


class HttpMetrics:
    """ASGI middleware counting each HTTP request and timing it (to its answer's last
    byte) in :class:`ProcessMetrics`, labelled by the template of the route that took it
    (Starlette's router puts the route into the scope), never by its path."""

    def __init__(self, app: Any, metrics: ProcessMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self._templates: list[tuple[re.Pattern[str], str]] | None = None

    def route(self, scope: Scope) -> str:
        """The template of the route that took the request, or :data:`UNMATCHED`. FastAPI's
        routes put themselves into the scope as they take it; a request answered before
        the router ran (a 413 or 401 of ``app.main.BodyLimit``) and Starlette's own routes
        (``/openapi.json``, ``/docs``) leave none there: theirs is found by matching the
        path against the app's templates (:func:`route_templates`), as the router would."""
        path = getattr(scope.get("route"), "path", None)
        if isinstance(path, str):
            return path
        app = scope.get("app")
        if app is None:
            return UNMATCHED
        if self._templates is None:
            self._templates = route_templates(app)
        asked = str(scope.get("path", ""))
        root = str(scope.get("root_path", ""))
        asked = asked[len(root) :] if root and asked.startswith(root) else asked
        return next((t for pattern, t in self._templates if pattern.match(asked)), UNMATCHED)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = "none"

        async def watched(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = f"{int(message['status']) // 100}xx"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            route = self.route(scope)
            method = str(scope.get("method", ""))
            method = method if method in METHODS else OTHER
            self.metrics.requests.labels(route, method, status).inc()
            self.metrics.latency.labels(route, method).observe(time.perf_counter() - started)


def check_token(expected: str, authorization: str | None) -> None:
    """Raise 401 without a bearer token, 403 with a token other than ``expected``.

    Compared in constant time as SHA-256 digests: :func:`hmac.compare_digest` of the
    tokens themselves returns at once when their lengths differ, so its time told the
    token's length."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the metrics need Authorization: Bearer <CURATOR_METRICS_TOKEN>")
    sent = hashlib.sha256(token.strip().encode()).digest()
    if not hmac.compare_digest(sent, hashlib.sha256(expected.encode()).digest()):
        raise Forbidden("this is not the metrics token")
