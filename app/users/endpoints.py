"""Routes: users, API keys, the audit log."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from app.core.deps import AdminUser, CurrentUser, RevocationSessionDep, SessionDep
from app.core.errors import Forbidden, NotFound, Unauthorized, error_responses
from app.core.pagination import DEFAULT_LIMIT, MAX_INT_ID, NEXT_LINK, AfterId, Limit, link_next
from app.models import Role
from app.users import service
from app.users.schemas import (
    ApiKeyOut,
    AuditEventOut,
    KeyCreated,
    Me,
    UserCreate,
    UserCreated,
    UserOut,
)

router = APIRouter(prefix="/v1", tags=["users"], responses=error_responses(Unauthorized))


@router.post(
    "/users",
    status_code=status.HTTP_201_CREATED,
    response_model=UserCreated,
    responses=error_responses(Forbidden),
)
def create_user(body: UserCreate, admin: AdminUser, session: SessionDep) -> UserCreated:
    """Create a user with a role and a first API key (shown once)."""
    user, key, secret = service.create_user(session, body.name, body.role, admin.id)
    return UserCreated(
        id=user.id,
        name=user.name,
        role=Role(user.role),
        created_at=user.created_at,
        key_id=key.id,
        api_key=secret,
    )


@router.get(
    "/users", response_model=list[UserOut], responses={**NEXT_LINK, **error_responses(Forbidden)}
)
def list_users(
    _admin: AdminUser,
    session: SessionDep,
    request: Request,
    response: Response,
    limit: Limit = DEFAULT_LIMIT,
    after_id: AfterId = None,
) -> list[UserOut]:
    """The users, oldest first, a page at a time (``Link`` header: the next page)."""
    page = service.list_users(session, limit, after_id)
    link_next(request, response, "after_id", page)
    return [UserOut.model_validate(u) for u in page.items]


@router.get("/users/me", response_model=Me)
def me(user: CurrentUser, session: SessionDep) -> Me:
    keys = [ApiKeyOut.model_validate(k) for k in service.keys_of(session, user.id)]
    return Me(**UserOut.model_validate(user).model_dump(), keys=keys)


@router.post(
    "/users/{user_id}/keys",
    status_code=status.HTTP_201_CREATED,
    response_model=KeyCreated,
    responses=error_responses(Forbidden, NotFound),
)
def create_key(user_id: uuid.UUID, admin: AdminUser, session: SessionDep) -> KeyCreated:
    """Issue another API key for a user (shown once)."""
    key, secret = service.create_key(session, user_id, admin.id)
    return KeyCreated(key_id=key.id, api_key=secret)


@router.delete(
    "/keys/{key_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(NotFound),
)
def revoke_key(
    key_id: uuid.UUID, user: CurrentUser, request: Request, session: RevocationSessionDep
) -> Response:
    """Revoke an API key (admins: any key; others: their own). Revoked keys get 401."""
    service.revoke_key(session, key_id, user, getattr(request.state, "api_key_id", None))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/audit",
    response_model=list[AuditEventOut],
    responses={**NEXT_LINK, **error_responses(Forbidden)},
)
def audit(
    user: CurrentUser,
    session: SessionDep,
    request: Request,
    response: Response,
    limit: Limit = DEFAULT_LIMIT,
    before_id: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_INT_ID,
            description="the id of the last event of the previous page: this page has "
            'the older ones (the Link header\'s rel="next" URL sets it)',
        ),
    ] = None,
) -> list[AuditEventOut]:
    """The audit log, newest first, a page at a time (admins only; ``Link`` header: the
    next page)."""
    page = service.audit_events(session, user, limit, before_id)
    link_next(request, response, "before_id", page)
    return [AuditEventOut.model_validate(e) for e in page.items]
