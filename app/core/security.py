"""API keys: generated with ``secrets`` (32 random bytes), shown once, stored as a hash.

Keys carry 256 bits of entropy, so a fast unsalted SHA-256 is the right hash: nobody can
brute-force the preimage, and lookups by hash stay indexable. The first characters
(``prefix``) are stored in clear so that a user can tell their keys apart.
"""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "cur_"
KEY_BYTES = 32
DISPLAY_PREFIX_CHARS = 12


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def display_prefix(key: str) -> str:
    return key[:DISPLAY_PREFIX_CHARS]
