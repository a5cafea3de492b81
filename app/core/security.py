"""API keys: generated with ``secrets`` (32 random bytes), shown once, stored as a hash.

Keys carry 256 bits of entropy, so a fast unsalted SHA-256 is the right hash: nobody can
brute-force the preimage, and lookups by hash stay indexable. The first characters
(``prefix``) are stored in clear so that a user can tell their keys apart.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import Unauthorized
from app.models import ApiKey, User

KEY_PREFIX = "cur_"
KEY_BYTES = 32
DISPLAY_PREFIX_CHARS = 12

#: The 401 messages of a request without a key and of one with an unknown or revoked key.
MISSING_KEY = "missing API key: send 'Authorization: Bearer <key>'"
INVALID_KEY = "invalid or revoked API key"


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def display_prefix(key: str) -> str:
    return key[:DISPLAY_PREFIX_CHARS]


def active_key(session: Session, secret: str) -> tuple[ApiKey, User] | None:
    """The key ``secret`` and its user, or None if no such key exists or it is revoked."""
    key = session.scalars(
        select(ApiKey).where(ApiKey.key_hash == hash_api_key(secret))
    ).one_or_none()
    user = session.get(User, key.user_id) if key is not None else None
    if key is None or key.revoked_at is not None or user is None:
        return None
    return key, user


def ensure_key_active(session: Session, key_id: uuid.UUID) -> None:
    """Check again, in the request's own transaction, that the key it was authenticated
    with (``request.state.api_key_id``) has not been revoked since: every write transaction
    of a request does (:func:`app.core.deps.get_session`), and so does work that runs long
    after authentication outside it (an upload streams and is validated for minutes) and
    must not be committed on a key revoked meanwhile.

    On PostgreSQL the key's row is read ``FOR SHARE`` and stays locked until the
    transaction ends: a revocation (an update of that row) waits for every write that has
    checked the key, so the write commits before it, and one that checks later sees the
    revocation. A plain read under READ COMMITTED let a write that had checked the key and
    then waited for a dataset's lock commit after the revocation. (SQLite's ``BEGIN
    IMMEDIATE`` transactions are already serial.)"""
    statement = select(ApiKey).where(ApiKey.id == key_id)
    if session.get_bind().dialect.name != "sqlite":
        statement = statement.with_for_update(read=True)
    key = session.scalars(statement.execution_options(populate_existing=True)).one_or_none()
    if key is None or key.revoked_at is not None:
        raise Unauthorized(INVALID_KEY)


def lock_keys(session: Session, key_ids: set[uuid.UUID]) -> dict[uuid.UUID, ApiKey]:
    """The keys ``key_ids`` (those that exist), their rows locked ``FOR UPDATE`` in id order
    on PostgreSQL: a revocation locks the caller's key and the one it revokes this way,
    instead of :func:`ensure_key_active`'s shared lock first. Two revocations that each held
    a shared lock on a key the other then updated (two of one key, or two admins revoking
    each other's keys) waited for each other: a deadlock, which PostgreSQL ends by failing
    one of them."""
    statement = select(ApiKey).where(ApiKey.id.in_(key_ids)).order_by(ApiKey.id)
    if session.get_bind().dialect.name != "sqlite":
        statement = statement.with_for_update()
    return {
        key.id: key for key in session.scalars(statement.execution_options(populate_existing=True))
    }
