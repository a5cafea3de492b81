"""Worker threads for long or lock-waiting work, counted apart from the request threadpool.

Starlette runs sync endpoints and dependencies under anyio's default thread limiter (40
tokens). Work that can hold a thread for minutes (validating an upload) or wait for the
SQLite write lock (an upload's own transaction) must not take those tokens, or enough of
it stalls every other request; a :class:`ThreadLimit` gives it a limiter of its own.
Waiting for a free slot holds no thread.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import ParamSpec, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from anyio.lowlevel import RunVar

P = ParamSpec("P")
T = TypeVar("T")


class ThreadLimit:
    """At most ``total`` calls at once, each in a worker thread."""

    def __init__(self, name: str, total: int) -> None:
        self.total = total
        # An anyio limiter belongs to the event loop that first uses it (a process serving
        # requests has one; the tests start one per client): one limiter per loop.
        self._limiters: RunVar[CapacityLimiter] = RunVar(name)

    def limiter(self) -> CapacityLimiter:
        try:
            return self._limiters.get()
        except LookupError:
            limiter = CapacityLimiter(self.total)
            self._limiters.set(limiter)
            return limiter

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args, **kwargs)`` in a worker thread, once a slot is free."""
        return await anyio.to_thread.run_sync(
            partial(function, *args, **kwargs), limiter=self.limiter()
        )
