"""Answering queries from a release: post-processing of stored measurements, no budget."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from app.answers.schemas import AnswersOut
from app.core.errors import Conflict
from app.core.services import Services
from app.models import ReleaseMeasurement, User
from app.releases import registry
from app.releases.service import release_info, visible_release
from app.storage.artifacts import ArtifactStore

CACHE_SIZE = 16


Key = tuple[uuid.UUID, int]


class _LoadedReleases:
    """Decoded releases by (id, synthesis version): measurements are immutable and a
    version's artifacts never change, so entries never go stale."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Key, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Key) -> Any | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            return None

    def put(self, key: Key, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_cache = _LoadedReleases(CACHE_SIZE)


def answer(
    session: Session,
    services: Services,
    user: User,
    release_id: uuid.UUID,
    queries: Sequence[Mapping[str, Any]],
) -> AnswersOut:
    release = visible_release(session, user, release_id)
    if release.status != "succeeded":
        raise Conflict(f"the release is {release.status}; answers exist once it succeeded")
    mechanism = registry.get(release.mechanism)
    info = release_info(session, release)
    key = (release.id, release.synthesis_version)
    loaded = _cache.get(key)
    if loaded is None:
        measurement = session.get(ReleaseMeasurement, release.id)
        if measurement is None:
            raise Conflict("the release has no stored measurements")
        artifacts = ArtifactStore(services.settings.releases_dir).version_dir(
            release.id, release.synthesis_version
        )
        loaded = mechanism.load(measurement.payload, info, artifacts)
        _cache.put(key, loaded)
    answers = mechanism.answer(loaded, info, queries)
    return AnswersOut(
        release_id=release.id,
        mechanism=mechanism.name,
        guarantee=mechanism.guarantee,
        answers=answers,
    )
