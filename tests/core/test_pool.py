"""The database pool of each process holds at least as many connections as the process
can hold at once, counted from the limits that bound them (not from the constants that
size the pool)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any, get_type_hints

import anyio.to_thread
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from app.answers import service as answers
from app.config import Settings
from app.core import deps
from app.core.db import pool_capacity
from app.core.services import Services
from app.main import create_app
from app.releases import service as releases
from app.releases.stages import worker_connections


def _held_sessions(app: FastAPI) -> int:
    """The sessions the app's request dependencies can hold at once: each dependency that
    yields a session must have a ``max_concurrency`` (one without could hold any number),
    and one ``Depends`` shared by many routes is one limit."""
    limits: dict[int, int] = {}

    def visit(dependant: Any) -> None:
        for sub in dependant.dependencies:
            call = sub.call
            holds = inspect.isgeneratorfunction(call) and (
                get_type_hints(call).get("return") == Iterator[Session]
            )
            if holds:
                assert sub.concurrency is not None, f"{call.__name__}: no max_concurrency"
                limits[id(sub.concurrency)] = sub.concurrency.max_concurrency
            visit(sub)

    def routes(within: list[Any]) -> Iterator[APIRoute]:
        for route in within:
            if isinstance(route, APIRoute):
                yield route
            elif hasattr(route, "original_router"):  # an included router (FastAPI >= 0.16x)
                yield from routes(route.original_router.routes)

    for route in routes(app.routes):
        visit(route.dependant)
    assert limits, "no session dependency found"
    return sum(limits.values())


def _worker_needs(threads: int) -> int:
    """A worker's connections at once: each stage thread's transaction and its
    heartbeat's (from a thread of its own), and the sweeper's."""
    return 2 * threads + 1


@pytest.mark.parametrize("embedded_worker", [False, True])
def test_the_pool_holds_what_the_api_can_hold_at_once(
    settings: Settings, embedded_worker: bool
) -> None:
    """The pool was 10 + 20 = 30 connections, fewer than the API's requests could hold at
    once: 16 + 16 + 4 sessions of its dependencies (held also while they wait for a thread
    to commit in), one short transaction in each of the request threadpool's 40 threads,
    the 4 deferred transactions, the 4 release checks' and previews' reads, and an embedded worker's stages, heartbeats and sweeper.
    A request beyond the pool waited 30 s (``pool_timeout``) and failed."""
    settings = settings.model_copy(update={"worker_threads": 3})
    app = create_app(settings, embedded_worker=embedded_worker)
    with TestClient(app) as client:
        threads = client.portal.call(
            lambda: anyio.to_thread.current_default_thread_limiter().total_tokens
        )
        services: Services = app.state.services
        needed = (
            _held_sessions(app)
            + int(threads)
            + deps._deferred_transactions.total
            + releases.release_checks.total
        )
        if embedded_worker:
            needed += _worker_needs(settings.worker_threads)
        assert pool_capacity(services.db.engine) >= needed
        if services.db.is_sqlite:
            # and the pool hands them out, all at once, without waiting
            with ExitStack() as held:
                for _ in range(needed):
                    held.enter_context(services.db.engine.connect())
                assert services.db.engine.pool.checkedout() == needed  # type: ignore[attr-defined]


def test_the_pool_counts_the_threads_apart_that_read_the_database() -> None:
    """Release requests' checks and previews read in short transactions of their own, on
    threads apart from the request threadpool since they run a few at a time
    (``release_checks``); the pool counted only the deferred transactions' threads among
    those, 4 connections short (hidden while no route uses ``ReadSessionDep``, whose 16
    are counted all the same). Answer requests too (``answer_slots``)."""
    apart = (
        deps._deferred_transactions.total
        + releases.release_checks.total
        + answers.answer_slots.total
    )
    sessions = sum(deps._max_concurrency(alias) for alias in deps.SESSION_DEPENDENCIES)
    assert deps.request_connections() == sessions + deps.REQUEST_THREADS + apart


@pytest.mark.parametrize("threads", [1, 4])
def test_the_pool_holds_what_a_worker_can_hold_at_once(settings: Settings, threads: int) -> None:
    services = Services.build(settings, connections=worker_connections(threads))
    try:
        assert pool_capacity(services.db.engine) >= _worker_needs(threads)
    finally:
        services.close()
