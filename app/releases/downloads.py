"""Serving release artifacts (DP outputs) to the dataset's curator and granted analysts."""

from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session
from starlette.responses import MalformedRangeHeader
from starlette.types import Receive, Scope, Send

from app.core.errors import NotFound
from app.core.services import Services
from app.models import User
from app.releases.service import served_version, visible_release
from app.storage.artifacts import ArtifactStore


class OpenedFileResponse(FileResponse):
    """A :class:`FileResponse` (ranges, ``ETag``, ``HEAD``) over a file opened when the
    response is made, in the endpoint, not when it is sent.

    A publish prunes the versions before the one it replaces
    (:func:`app.releases.stages._publish_synthesis`): a download that read version ``v``
    as published, then two publishes, used to find the path gone when the response opened
    it (Starlette's ``RuntimeError``: a 500). An open file stays readable once unlinked,
    so the response serves the version it read. Every read of the body opens a duplicate
    of the descriptor; the descriptor is closed once the response is sent (or collected).
    """

    def __init__(self, path: Path, **kwargs: Any) -> None:
        fd = os.open(path, os.O_RDONLY)
        self._close = weakref.finalize(self, os.close, fd)
        self._fd = fd
        super().__init__(path, stat_result=os.fstat(fd), **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            # never the ASGI "pathsend" extension, which would send the path by its name
            scope = {
                **scope,
                "extensions": {
                    k: v
                    for k, v in scope.get("extensions", {}).items()
                    if k != "http.response.pathsend"
                },
            }
            await super().__call__(scope, receive, send)
        finally:
            self._close()

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        """The byte ranges asked for; none (the whole file, a 200) for a ``Range`` whose
        unit is not ``bytes`` or that does not parse (``bytes=5-1``), which RFC 9110
        section 14.2 says to ignore: Starlette answered them with a plain-text 400,
        outside the service's error body and its documented statuses. A range past the
        end is still a 416."""
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader:
            return []

    @asynccontextmanager
    async def _open_file(self) -> AsyncIterator[anyio.AsyncFile[bytes]]:
        file = anyio.wrap_file(os.fdopen(os.dup(self._fd), "rb"))
        try:
            yield file
        finally:
            with anyio.CancelScope(shield=True):
                await file.aclose()


#: Reads of the release a download makes when the file of the version it read is gone.
OPEN_ATTEMPTS = 3


def artifact(
    session: Session, services: Services, user: User, release_id: uuid.UUID, name: str
) -> FileResponse:
    """The file ``name`` of the release's published version, held open
    (:class:`OpenedFileResponse`).

    A file gone between reading the release and opening it was taken away by a change the
    release has since committed: its curator deleted the files (``DELETE
    /v1/releases/{id}/artifacts``), or two publishes pruned the version read. The release
    is read again, in a new snapshot (the request's read-only transaction is rolled back:
    on SQLite it kept reading the old one), so the download answers as a request made after
    that change: 410 ``files_deleted``, or the newest version. It answered 404 "missing on
    disk" for either. A file missing with nothing changed is still that 404."""
    store = ArtifactStore(services.settings.releases_dir)
    for attempt in range(OPEN_ATTEMPTS):
        if attempt:
            session.rollback()
        release = visible_release(session, user, release_id)
        version = served_version(release, "artifacts")
        meta = release.artifacts.get(name)
        if meta is None:
            available = ", ".join(sorted(release.artifacts)) or "none"
            raise NotFound(f"this release has no artifact {name!r} (available: {available})")
        path = store.path(release.id, version, str(meta["file"]))
        try:
            if not path.is_file():
                raise FileNotFoundError(path)
            return OpenedFileResponse(
                path,
                media_type=str(meta["media_type"]),
                filename=f"{release.mechanism}-{str(release.id)[:8]}-{name}",
            )
        except FileNotFoundError:
            continue
    raise NotFound(f"artifact {name!r} is missing on disk")
