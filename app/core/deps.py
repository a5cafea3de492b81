"""Typed dependency aliases: the process's services, the request's session, the caller."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import Forbidden, Unauthorized
from app.core.security import hash_api_key
from app.core.services import Services
from app.models import ApiKey, User


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
    with services.db.transaction(read_only=read_only) as session:
        yield session


SessionDep = Annotated[
    Session,
    Depends(get_session, scope="function", max_concurrency=MAX_CONCURRENT_TRANSACTIONS),
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

_bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer <key>`")


def current_user(
    request: Request,
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> User:
    """The caller, looked up in a short read-only transaction of its own, so that a request
    holds no database lock before its endpoint runs (an upload may stream for minutes).
    The key's id is kept on ``request.state.api_key_id``
    (:func:`app.users.service.ensure_key_active`)."""
    if credentials is None or not credentials.credentials:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    with services.db.transaction(read_only=True) as session:
        key = session.scalars(
            select(ApiKey).where(ApiKey.key_hash == hash_api_key(credentials.credentials))
        ).one_or_none()
        user = session.get(User, key.user_id) if key is not None else None
        if key is None or key.revoked_at is not None or user is None:
            raise Unauthorized("invalid or revoked API key")
        request.state.api_key_id = key.id
        return user


CurrentUser = Annotated[User, Depends(current_user)]


def require_role(*roles: str) -> Callable[[User], User]:
    def check(user: CurrentUser) -> User:
        if user.role not in roles:
            raise Forbidden(f"this action needs the {' or '.join(roles)} role")
        return user

    return check


AdminUser = Annotated[User, Depends(require_role("admin"))]
CuratorUser = Annotated[User, Depends(require_role("curator"))]
