"""SQLAlchemy ORM classes; importing this package registers every table on ``Base.metadata``."""

from app.models.audit import AuditEvent
from app.models.base import Base
from app.models.dataset import Dataset, Grant
from app.models.ledger import LedgerEntry
from app.models.release import Release, ReleaseMeasurement
from app.models.user import ApiKey, Role, User

__all__ = [
    "ApiKey",
    "AuditEvent",
    "Base",
    "Dataset",
    "Grant",
    "LedgerEntry",
    "Release",
    "ReleaseMeasurement",
    "Role",
    "User",
]
