"""Request and response bodies of the users endpoints."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from app.core.types import Name
from app.models import Role


class UserCreate(BaseModel):
    """A new user: a name (a label; two users may share one) and a role."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "carol", "role": "curator"}]}
    )

    name: Name
    role: Role


class UserOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    name: str
    role: Role
    created_at: datetime


class ApiKeyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class KeyCreated(BaseModel):
    """A new key. ``api_key`` is shown once and never stored in clear."""

    key_id: uuid.UUID
    api_key: str


class UserCreated(UserOut, KeyCreated):
    pass


class Me(UserOut):
    keys: list[ApiKeyOut]


class AuditEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    actor_id: uuid.UUID | None
    action: str
    object_type: str
    object_id: str
    details: dict[str, object]
    created_at: datetime
