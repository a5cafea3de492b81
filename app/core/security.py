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

from app.core.db import advisory_lock_key, take_advisory_lock, uses_row_locks
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


def key_lock(key_id: uuid.UUID) -> int:
    """The PostgreSQL advisory lock of an API key: 64 bits of SHA-256 of its id. Two keys
    sharing one (2^-64) would only make a revocation of one wait for the other's writes."""
    return advisory_lock_key(b"curator api key ", key_id)


def _take_key_lock(session: Session, key_id: uuid.UUID, *, exclusive: bool) -> None:
    """Take the key's advisory lock (:func:`key_lock`) until the transaction ends."""
    take_advisory_lock(session, key_lock(key_id), exclusive=exclusive)


def ensure_key_active(session: Session, key_id: uuid.UUID) -> None:
    """Check again, in the request's own transaction, that the key it was authenticated
    with (``request.state.api_key_id``) has not been revoked since: every write transaction
    of a request does (:func:`app.core.deps.get_session`), and so does work that runs long
    after authentication outside it (an upload streams and is validated for minutes) and
    must not be committed on a key revoked meanwhile.

    On PostgreSQL the transaction first takes the key's advisory lock (:func:`key_lock`)
    in shared mode, held until it ends; a revocation takes it exclusively
    (:func:`lock_keys`). So a write that has checked the key commits before a revocation
    of it, and one that checks later sees the revocation. A plain read under READ
    COMMITTED let a write that had checked the key and then waited for a dataset's lock
    commit after the revocation. Not a ``FOR SHARE`` lock on the key's row: a new shared
    row lock does not queue behind a waiting ``FOR UPDATE``, so a key with overlapping
    writes held its revocation off for as long as it kept writing; the advisory lock's
    queue is fair (a shared request waits behind a waiting exclusive one). (SQLite's
    ``BEGIN IMMEDIATE`` transactions are already serial.)"""
    if uses_row_locks(session):
        _take_key_lock(session, key_id, exclusive=False)
    key = session.get(ApiKey, key_id, populate_existing=True)
    if key is None or key.revoked_at is not None:
        raise Unauthorized(INVALID_KEY)


def lock_keys(session: Session, revoked: uuid.UUID, caller: uuid.UUID | None) -> None:
    """Take the advisory locks of a revocation on PostgreSQL: ``revoked``'s exclusively
    (it waits for the writes that have checked that key, and later ones wait for it), the
    caller's shared (as a write's check, :func:`ensure_key_active`, which the caller then
    makes), both in the locks' order. A revocation locks them this way instead of
    :func:`ensure_key_active` first: two revocations that each held a lock on a key the
    other then wanted exclusively (two of one key, or two admins revoking each other's
    keys) waited for each other, a deadlock PostgreSQL ends by failing one of them."""
    if not uses_row_locks(session):
        return
    exclusive = {revoked: True}
    if caller is not None:
        exclusive.setdefault(caller, False)  # exclusive already when it is the revoked key
    for key_id in sorted(exclusive, key=key_lock):
        _take_key_lock(session, key_id, exclusive=exclusive[key_id])
