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


def get_session(services: ServicesDep) -> Iterator[Session]:
    """The request's transaction: committed after the endpoint returns and before the
    response is sent (``scope="function"``), rolled back if anything raises."""
    with services.db.transaction() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]

_bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer <key>`")


def current_user(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> User:
    if credentials is None or not credentials.credentials:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    key = session.scalars(
        select(ApiKey).where(ApiKey.key_hash == hash_api_key(credentials.credentials))
    ).one_or_none()
    if key is None or key.revoked_at is not None:
        raise Unauthorized("invalid or revoked API key")
    user = session.get(User, key.user_id)
    if user is None:
        raise Unauthorized("invalid or revoked API key")
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
