"""Serving release artifacts (DP outputs) to the dataset's curator and granted analysts."""

from __future__ import annotations

import uuid

from fastapi.responses import FileResponse
from sqlalchemy.orm import Session

from app.core.errors import Conflict, NotFound
from app.core.services import Services
from app.models import User
from app.releases.service import visible_release
from app.storage.artifacts import ArtifactStore


def artifact(
    session: Session, services: Services, user: User, release_id: uuid.UUID, name: str
) -> FileResponse:
    release = visible_release(session, user, release_id)
    if release.published_version is None:
        raise Conflict(f"the release is {release.status}; artifacts exist once it succeeded")
    meta = release.artifacts.get(name)
    if meta is None:
        available = ", ".join(sorted(release.artifacts)) or "none"
        raise NotFound(f"this release has no artifact {name!r} (available: {available})")
    store = ArtifactStore(services.settings.releases_dir)
    path = store.path(release.id, release.published_version, str(meta["file"]))
    if not path.is_file():
        raise NotFound(f"artifact {name!r} is missing on disk")
    return FileResponse(
        path,
        media_type=str(meta["media_type"]),
        filename=f"{release.mechanism}-{str(release.id)[:8]}-{name}",
    )
