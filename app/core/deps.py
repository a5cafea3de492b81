"""Typed dependency aliases: the process's services, the request's session, the caller."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any, Concatenate, ParamSpec, TypeVar, get_args

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.core.errors import Forbidden, Unauthorized
from app.core.security import INVALID_KEY, MISSING_KEY, active_key, ensure_key_active
from app.core.services import Services
from app.core.threads import REQUEST_THREADS, ThreadLimit
from app.models import User

P = ParamSpec("P")
T = TypeVar("T")


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


#: Requests holding a transaction at once. It must stay below the threadpool's size (40):
#: a request holding a lock needs a free thread to reach its commit, and requests waiting
#: for this limit hold no thread.
MAX_CONCURRENT_TRANSACTIONS = 16


def get_session(request: Request, services: ServicesDep) -> Iterator[Session]:
    """The request's transaction: committed after the endpoint returns and before the
    response is sent (``scope="function"``), rolled back if anything raises. GET and
    HEAD requests get read-only transactions."""
    read_only = request.method in ("GET", "HEAD")
    # a write waits for a lock CURATOR_LOCK_TIMEOUT at most (PostgreSQL), then is a 503:
    # one held long (a revocation waiting behind a slow write of its key) held every
    # request queued behind it, each in one of the slots below, for as long as it lasted
    lock_timeout = None if read_only else services.settings.lock_timeout
    with services.db.transaction(read_only=read_only, lock_timeout=lock_timeout) as session:
        key_id = getattr(request.state, "api_key_id", None)
        if key_id is not None and not read_only:
            # The caller was authenticated in a transaction of its own; a write may have
            # waited for the database's write lock since (up to 30 s on SQLite), and must
            # not be committed on a key revoked meanwhile. Every route lists its user
            # before its session, so the key is known here (tests/users pin it).
            ensure_key_active(session, key_id)
        yield session


SessionDep = Annotated[
    Session,
    Depends(get_session, scope="function", max_concurrency=MAX_CONCURRENT_TRANSACTIONS),
]


def get_revocation_session(services: ServicesDep) -> Iterator[Session]:
    """The write transaction of a key's revocation (``DELETE /v1/keys/{id}``): as
    :func:`get_session`, but without its key check, which
    :func:`app.users.service.revoke_key` makes itself, locking the caller's key and the one
    it revokes together, in one order. After :func:`get_session`'s shared lock on the
    caller's key, two revocations of each other's keys (or two of one key) each waited for
    the other's lock: a deadlock on PostgreSQL. Its lock waits are bounded as a write's
    (``CURATOR_LOCK_TIMEOUT``): one behind a slow write of the key it revokes is a 503 once
    that passes, and the writes queued behind it go on."""
    with services.db.transaction(lock_timeout=services.settings.lock_timeout) as session:
        yield session


#: Revocations holding a transaction at once: a limit of their own (FastAPI counts each
#: dependency apart), kept small so that it, :data:`SessionDep`'s and
#: :data:`ReadSessionDep`'s stay below the threadpool's 40 together (16 + 16 + 4).
MAX_CONCURRENT_REVOCATIONS = 4

RevocationSessionDep = Annotated[
    Session,
    Depends(get_revocation_session, scope="function", max_concurrency=MAX_CONCURRENT_REVOCATIONS),
]


def get_read_session(services: ServicesDep) -> Iterator[Session]:
    """A read-only transaction for endpoints that never write, whatever their method
    (answers, previews): on SQLite it does not take the write lock."""
    with services.db.transaction(read_only=True) as session:
        yield session


ReadSessionDep = Annotated[
    Session,
    Depends(get_read_session, scope="function", max_concurrency=MAX_CONCURRENT_TRANSACTIONS),
]

#: Deferred transactions at once (:class:`DeferredTransaction`). Not a share of
#: ``MAX_CONCURRENT_TRANSACTIONS``: they run on threads counted apart from the threadpool
#: (:mod:`app.core.threads`), so however many uploads finish together they cannot take the
#: threads that requests holding a session need to reach their commit. The limit bounds
#: what they hold besides: database connections, and threads parked waiting for SQLite's
#: write lock. Its users (uploads, release requests) validate first, outside it; their
#: transactions are short (a few inserts: the dataset or release, ledger and audit rows).
MAX_CONCURRENT_DEFERRED_TRANSACTIONS = 4
_deferred_transactions = ThreadLimit(
    "curator_deferred_transactions", MAX_CONCURRENT_DEFERRED_TRANSACTIONS, connections=1
)


#: The request dependencies that hold a session, each with its own ``max_concurrency``.
#: All are counted, also one that no route uses today (``ReadSessionDep``): a route that
#: starts using it cannot take the pool below what requests can hold.
SESSION_DEPENDENCIES = (SessionDep, ReadSessionDep, RevocationSessionDep)


def request_connections() -> int:
    """The most database connections the API's requests can hold at once, from the limits
    that bound them: every session dependency's ``max_concurrency`` (each holds its session
    from before the endpoint until its commit, also while it waits for a thread to commit
    in: no thread of its own then), every thread of the request threadpool (each can be in
    a short transaction of its own at the same time: the caller's lookup, a read of
    answers, ``/readyz``, a scrape's read of ``/metrics``), and the threads counted apart
    from the threadpool whose calls hold connections
    (:attr:`ThreadLimit.holding_connections`: the deferred transactions',
    and release requests' checks and previews, each reading in a short transaction of its
    own: :data:`app.releases.service.release_checks`). No code opens a second transaction
    in a thread that is in one. Upload checks hold none
    (:data:`app.datasets.upload.upload_checks`)."""
    held = sum(_max_concurrency(alias) for alias in SESSION_DEPENDENCIES)
    apart = sum(limit.total * limit.connections for limit in ThreadLimit.holding_connections)
    return held + REQUEST_THREADS + apart


def _max_concurrency(alias: Any) -> int:
    """The ``max_concurrency`` of an ``Annotated[..., Depends(...)]`` alias."""
    _type, depends = get_args(alias)
    limit: int = depends.max_concurrency
    return limit


class DeferredTransaction:
    """The request's transaction, begun only when the endpoint calls :meth:`run`: for an
    endpoint whose slow work comes first and must hold no database resource meanwhile (an
    upload streams and is validated for minutes; :data:`SessionDep` is resolved before the
    endpoint runs and would hold one of its slots all along)."""

    def __init__(self, services: Services) -> None:
        self._db = services.db
        self._lock_timeout = services.settings.lock_timeout

    async def run(
        self, function: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``function(session, *args, **kwargs)`` in a write transaction, committed before
        this returns (rolled back if anything raises), at most
        ``MAX_CONCURRENT_DEFERRED_TRANSACTIONS`` at once, its lock waits bounded as a
        request's (``CURATOR_LOCK_TIMEOUT``)."""

        def in_transaction() -> T:
            with self._db.transaction(lock_timeout=self._lock_timeout) as session:
                return function(session, *args, **kwargs)

        return await _deferred_transactions.run(in_transaction)


def get_deferred_transaction(services: ServicesDep) -> DeferredTransaction:
    return DeferredTransaction(services)


DeferredTransactionDep = Annotated[DeferredTransaction, Depends(get_deferred_transaction)]

_bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer <key>`")


def current_user(
    request: Request,
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> User:
    """The caller, looked up in a short read-only transaction of its own, so that a request
    holds no database lock before its endpoint runs (an upload may stream for minutes).
    The key's id is kept on ``request.state.api_key_id``
    (:func:`app.core.security.ensure_key_active`)."""
    if credentials is None or not credentials.credentials:
        raise Unauthorized(MISSING_KEY)
    with services.db.transaction(read_only=True) as session:
        found = active_key(session, credentials.credentials)
        if found is None:
            raise Unauthorized(INVALID_KEY)
        key, user = found
        request.state.api_key_id = key.id
        return user


def key_authenticates(services: Services, secret: str) -> bool:
    """Whether ``secret`` is an active API key (as :func:`current_user` decides), in a
    short read-only transaction: the check a large request body waits for before it is
    read (:class:`app.main.BodyLimit`)."""
    with services.db.transaction(read_only=True) as session:
        return active_key(session, secret) is not None


CurrentUser = Annotated[User, Depends(current_user)]


def require_role(*roles: str) -> Callable[[User], User]:
    def check(user: CurrentUser) -> User:
        if user.role not in roles:
            raise Forbidden(f"this action needs the {' or '.join(roles)} role")
        return user

    return check


AdminUser = Annotated[User, Depends(require_role("admin"))]
CuratorUser = Annotated[User, Depends(require_role("curator"))]
