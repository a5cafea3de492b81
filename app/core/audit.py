"""Recording audit events in the caller's transaction (so an event exists iff its change does)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from app.models import AuditEvent


def record(
    session: Session,
    actor_id: uuid.UUID | None,
    action: str,
    object_type: str,
    object_id: uuid.UUID | str,
    **details: Any,
) -> AuditEvent:
    """Append an audit event. ``details`` hold identifiers and parameters, never data values."""
    event = AuditEvent(
        actor_id=actor_id,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        details=details,
    )
    session.add(event)
    return event
