"""Users and API keys: creation, key rotation and revocation, the audit log."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core import pagination
from app.core.audit import record
from app.core.errors import Forbidden, NotFound
from app.core.pagination import Page
from app.core.security import (
    display_prefix,
    ensure_key_active,
    generate_api_key,
    hash_api_key,
    lock_keys,
)
from app.models import ApiKey, AuditEvent, Role, User
from app.models.base import utcnow


def _issue_key(session: Session, user: User) -> tuple[ApiKey, str]:
    secret = generate_api_key()
    key = ApiKey(user_id=user.id, key_hash=hash_api_key(secret), prefix=display_prefix(secret))
    session.add(key)
    session.flush()
    return key, secret


def create_user(
    session: Session, name: str, role: Role, actor_id: uuid.UUID | None
) -> tuple[User, ApiKey, str]:
    """Create a user and its first API key; the key's secret is returned once."""
    user = User(name=name, role=role.value)
    session.add(user)
    session.flush()
    key, secret = _issue_key(session, user)
    record(session, actor_id, "user.create", "user", user.id, role=role.value)
    record(session, actor_id, "api_key.create", "api_key", key.id, user_id=str(user.id))
    return user, key, secret


def get_user(session: Session, user_id: uuid.UUID) -> User:
    user = session.get(User, user_id)
    if user is None:
        raise NotFound("user not found")
    return user


def list_users(session: Session, limit: int, after_id: uuid.UUID | None) -> Page[User]:
    """A page of the users, oldest first (admins only: the route checks the role)."""
    return pagination.by_time(
        session, select(User), User.created_at, User.id, limit, after_id, lambda u: u.id
    )


def create_key(
    session: Session, user_id: uuid.UUID, actor_id: uuid.UUID | None
) -> tuple[ApiKey, str]:
    user = get_user(session, user_id)
    key, secret = _issue_key(session, user)
    record(session, actor_id, "api_key.create", "api_key", key.id, user_id=str(user.id))
    return key, secret


def keys_of(session: Session, user_id: uuid.UUID) -> list[ApiKey]:
    return list(
        session.scalars(select(ApiKey).where(ApiKey.user_id == user_id).order_by(ApiKey.created_at))
    )


def revoke_key(
    session: Session, key_id: uuid.UUID, actor: User, actor_key_id: uuid.UUID | None = None
) -> ApiKey:
    """Revoke a key: admins revoke any key, other users only their own.

    ``actor_key_id``, the key the request was authenticated with, is checked here (401 if
    revoked since), after locking it together with the key to revoke, in one order
    (:func:`~app.core.security.lock_keys`); the route's transaction does not check it first
    (:func:`app.core.deps.get_revocation_session`)."""
    lock_keys(session, key_id, actor_key_id)
    if actor_key_id is not None:
        ensure_key_active(session, actor_key_id)  # under the lock just taken: no new one
    key = session.get(ApiKey, key_id, populate_existing=True)
    if key is None or (actor.role != Role.admin and key.user_id != actor.id):
        raise NotFound("API key not found")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        record(session, actor.id, "api_key.revoke", "api_key", key.id, user_id=str(key.user_id))
    session.flush()
    return key


def audit_events(
    session: Session, actor: User, limit: int, before_id: int | None
) -> Page[AuditEvent]:
    """A page of the audit log, newest first, below ``before_id`` (admins only)."""
    if actor.role != Role.admin:
        raise Forbidden("the audit log is for admins")
    return pagination.by_id(
        session,
        select(AuditEvent),
        AuditEvent.id,
        limit,
        before_id,
        lambda e: e.id,
        newest_first=True,
    )
