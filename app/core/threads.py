"""Worker threads for long or lock-waiting work, counted apart from the request threadpool.

Starlette runs sync endpoints and dependencies under anyio's default thread limiter (40
tokens). Work that can hold a thread for minutes (validating an upload) or wait for the
SQLite write lock (an upload's own transaction) must not take those tokens, or enough of
it stalls every other request; a :class:`ThreadLimit` gives it a limiter of its own.
Waiting for a free slot holds no thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from functools import partial
from typing import ClassVar, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from anyio import CapacityLimiter
from anyio.lowlevel import RunVar
from starlette.requests import ClientDisconnect
from starlette.types import Receive
from threadpoolctl import ThreadpoolController

P = ParamSpec("P")
T = TypeVar("T")

#: Threads of the request threadpool (anyio's default limiter, which Starlette and FastAPI
#: run sync endpoints and dependencies on): anyio's own default, stated here and set by
#: :func:`limit_request_threads`, because the database pool is sized from it
#: (:func:`app.core.deps.request_connections`).
REQUEST_THREADS = 40


def limit_request_threads() -> None:
    """Give the running event loop's request threadpool :data:`REQUEST_THREADS` threads
    (call it in the loop: the limiter belongs to it)."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = REQUEST_THREADS


class ThreadLimit:
    """At most ``total`` calls at once, each in a worker thread. ``connections``: the
    database connections one call may hold at once (a short transaction of its own: 1);
    the API's pool counts those of every such limit
    (:func:`app.core.deps.request_connections`, :attr:`holding_connections`).
    ``per_caller``: at most that many of the calls of one caller (:meth:`run_while_connected`'s
    ``caller``) hold a slot at once, so that one caller's long calls leave slots to
    the others."""

    #: The limits whose calls hold database connections, in the order they were made.
    holding_connections: ClassVar[list[ThreadLimit]] = []

    def __init__(
        self, name: str, total: int, *, connections: int = 0, per_caller: int | None = None
    ) -> None:
        self.total = total
        self.connections = connections
        self.per_caller = per_caller
        if connections:
            ThreadLimit.holding_connections.append(self)
        # An anyio limiter belongs to the event loop that first uses it (a process serving
        # requests has one; the tests start one per client): one limiter per loop.
        self._limiters: RunVar[CapacityLimiter] = RunVar(name)
        # each caller's limiter while it has calls waiting or running, per loop
        self._callers: RunVar[dict[Hashable, CapacityLimiter]] = RunVar(f"{name}_callers")

    def limiter(self) -> CapacityLimiter:
        try:
            return self._limiters.get()
        except LookupError:
            limiter = CapacityLimiter(self.total)
            self._limiters.set(limiter)
            return limiter

    def usage(self) -> tuple[int, int]:
        """``(running, waiting)``: the calls holding a slot, and those waiting for one or
        for one of their caller's (``per_caller``), in the running event loop (call it
        there); ``(0, 0)`` before its first call."""
        try:
            statistics = self._limiters.get().statistics()
        except LookupError:
            return 0, 0
        callers = self._callers.get({})
        waiting = sum(limiter.statistics().tasks_waiting for limiter in callers.values())
        return statistics.borrowed_tokens, statistics.tasks_waiting + waiting

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args, **kwargs)`` in a worker thread, once a slot is free."""
        return await anyio.to_thread.run_sync(
            partial(function, *args, **kwargs), limiter=self.limiter()
        )

    @asynccontextmanager
    async def _caller_turn(self, caller: Hashable) -> AsyncIterator[None]:
        """Held while one of ``caller``'s at most :attr:`per_caller` calls runs."""
        if self.per_caller is None:
            yield
            return
        try:
            callers = self._callers.get()
        except LookupError:
            callers = {}
            self._callers.set(callers)
        limiter = callers.get(caller)
        if limiter is None:
            limiter = callers[caller] = CapacityLimiter(self.per_caller)
        try:
            async with limiter:
                yield
        finally:
            statistics = limiter.statistics()
            if not statistics.borrowed_tokens and not statistics.tasks_waiting:
                callers.pop(caller, None)

    async def run_while_connected(
        self,
        receive: Receive,
        caller: Hashable,
        function: Callable[P, T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """:meth:`run` for a request whose body has been read, as one of ``caller``'s
        (``per_caller``; ``receive``: the request's ASGI receive, whose next message is
        then its ``http.disconnect``): a client that
        disconnects while its call waits for a slot is not computed for (its call would
        hold the slot later for nobody while others wait), and raises
        :class:`ClientDisconnect` (answered by no one, logged by ``ErrorBarrier``). A
        call already running in its thread runs to its end (a thread cannot be stopped),
        and its result is dropped the same way."""
        gone = False
        outcome: list[T] = []
        failure: Exception | None = None
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                nonlocal gone
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone = True
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                async with self._caller_turn(caller):
                    outcome.append(await self.run(function, *args, **kwargs))
            except Exception as exc:  # raised as itself below, not in an exception group
                failure = exc
            group.cancel_scope.cancel()
        if gone:
            raise ClientDisconnect()
        if failure is not None:
            raise failure
        return outcome[0]


def limit_blas_threads(threads: int) -> list[int]:
    """Let each BLAS library of the process (OpenBLAS under numpy, and scipy's own) use at
    most ``threads`` threads for one matrix product (``0``: leave them as they are).
    Returns each BLAS library's thread count afterwards.

    The service runs requests in a threadpool and release stages in worker threads, so
    several products run at once already; each also spreading over every core
    oversubscribes them. Measured on 2 cores under load (scale audit): ``10^4`` answers
    from a tree release in 500-query blocks took 43.8 s with OpenBLAS's default, 1.6 s
    with one thread; through the service, 25 s against 3.4 s. scipy's BLAS is loaded
    here first (it is loaded on first use otherwise, and a limit set before then would
    not reach it)."""
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS so that the limit reaches it)

    controller = ThreadpoolController()
    if threads > 0:
        controller.limit(limits=threads, user_api="blas")
        controller = ThreadpoolController()
    return [int(info["num_threads"]) for info in controller.select(user_api="blas").info()]
