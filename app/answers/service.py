"""Answering queries from a release: post-processing of stored measurements, no budget."""

from __future__ import annotations

import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.answers.schemas import AnswersOut
from app.core.errors import Conflict, InvalidRequest
from app.core.footprint import footprint
from app.core.services import Services
from app.core.threads import ThreadLimit
from app.models import ReleaseMeasurement, User
from app.releases import registry
from app.releases.service import release_info, served_version, visible_release
from app.storage.artifacts import ArtifactStore

#: Answer requests computed at once in a process, on threads counted apart from the
#: request threadpool (:mod:`app.core.threads`): one computes for up to seconds, and on the
#: threadpool 100 at once (200 queries each, 0.2 s alone) held its 40 threads, so every
#: other request of every user waited behind them: ``GET /v1/releases/{id}`` took 26 s
#: (95th percentile; 0.07 s with this limit and :data:`MAX_ANSWERS_PER_USER`, and the 100
#: requests ended in 27 s, not 33 s; 40 at once: 20-21.5 s either way;
#: ``bench/results/answer_concurrency.md``).
#: Requests beyond it wait for a slot, holding their parsed body and no thread.
MAX_CONCURRENT_ANSWERS = 4
#: Of which one user's requests hold at most this many: when one user's 4 held every slot,
#: another user's small request waited for the whole of theirs (12 s each at the work
#: bound). Measured on 2 cores, one user's 4 requests of 300 Gaussian-mixture queries
#: (0.3 s alone) and another's 10-query requests (0.03 s alone): the first of those took
#: 0.89-0.97 s with 4 slots a user, 0.09-0.15 s with 2 (0.2-0.3 s when every request
#: shared the threadpool), and the 4 ended in 1.5 s either way. Requests over 1 MiB are
#: taken one at a time anyway (``app.main.LARGE_BODY_BYTES``).
MAX_ANSWERS_PER_USER = 2
#: Each reads in a short transaction of its own, which the API's pool counts
#: (``connections=1``; :func:`app.core.deps.request_connections`).
answer_slots = ThreadLimit(
    "curator_answers", MAX_CONCURRENT_ANSWERS, connections=1, per_caller=MAX_ANSWERS_PER_USER
)

#: Decoded releases each process keeps at most (besides the byte limit of the settings).
CACHE_SIZE = 16
#: Reads of a release's published version an answer may make when the version's files
#: are gone by the time it loads them (:func:`answer`): each miss needs two publishes in
#: between (a publish keeps the version it replaces).
LOAD_ATTEMPTS = 3


Key = tuple[uuid.UUID, int]


class _LoadedReleases:
    """Decoded releases by (id, synthesis version), least recently used first out:
    measurements are immutable and a version's artifacts never change, so entries never go
    stale. Bounded by count and by estimated bytes (a 20000-vertex graph release decodes
    to 3 GB; sixteen of them would not fit)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Key, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __contains__(self, key: Key) -> bool:
        return key in self._items

    def get(self, key: Key) -> Any | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
            return None

    def put(self, key: Key, value: Any, nbytes: int, max_bytes: int) -> None:
        """Keep ``value`` (``nbytes`` estimated) unless it alone exceeds ``max_bytes``;
        drop the least recently used until the count and the bytes fit."""
        with self._lock:
            if key in self._items:
                held, counted = self._items.pop(key)
                self._bytes -= counted
                if held is value:  # measured again: a concurrent answer may have measured
                    nbytes = max(nbytes, counted)  # it later, with more tables built
            if nbytes > max_bytes:
                return
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while len(self._items) > self.size or self._bytes > max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


_cache = _LoadedReleases(CACHE_SIZE)


def answer(
    services: Services,
    user: User,
    release_id: uuid.UUID,
    queries: Sequence[Mapping[str, Any]],
) -> AnswersOut:
    """Answers from a release's published version (also while a re-synthesis runs). The
    release, its dataset's columns and (unless the decoded release is cached) its
    measurements are read in a short read-only transaction; decoding and answering, which
    may take seconds, hold no session (as an upload's validation does not: the process has
    few session slots)."""
    for attempt in range(LOAD_ATTEMPTS):
        with services.db.transaction(read_only=True) as session:
            release = visible_release(session, user, release_id)
            version = served_version(release, "answers")
            mechanism = registry.get(release.mechanism)
            guarantee = mechanism.guarantee_for(release.params)
            info = release_info(session, release)
            key = (release.id, version)
            loaded = _cache.get(key)
            payload = None
            if loaded is None:
                measurement = session.get(ReleaseMeasurement, release.id)
                if measurement is None:
                    raise Conflict("the release has no stored measurements")
                payload = measurement.payload
        if loaded is not None:
            break
        assert payload is not None
        artifacts = ArtifactStore(services.settings.releases_dir).version_dir(*key)
        try:
            loaded = mechanism.load(payload, info, artifacts)
            break
        except FileNotFoundError:
            # two publishes since the version was read pruned its files: read the
            # release again (its newest version is on disk); a file missing for another
            # reason stays missing
            if attempt == LOAD_ATTEMPTS - 1:
                raise InvalidRequest(
                    "this release's synthesised files are missing on disk; re-synthesise it"
                ) from None
    # A query's coefficients may overflow a float (1e308 is valid JSON): answered with
    # numpy's overflow warnings silenced, then refused by position if not finite.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        answers = mechanism.answer(loaded, info, queries)
    _refuse_non_finite(answers)
    # measured after every answer, a cached one too: an answer fills lazily built tables
    # (a product query's parent chain over the index set: 6.4 MB at R = 2 10^5, d = 30)
    # that a first answer of another kind did not, and an entry measured once kept them
    # uncounted; one that outgrows the limit is dropped
    _cache.put(key, loaded, footprint(loaded), services.settings.answer_cache_bytes)
    return AnswersOut(
        release_id=release_id,
        mechanism=mechanism.name,
        guarantee=guarantee,
        answers=answers,
    )


def _refuse_non_finite(answers: list[dict[str, Any]]) -> None:
    """422 naming the first query one of whose numbers (value, stderr, interval ends and
    every other number an answer carries, also inside lists and objects) is not finite:
    pydantic would write it as ``null``, an answer that looks like "no answer" (a
    synopsis's interval came back as ``[null, null]`` where its value was finite)."""
    for position, item in enumerate(answers):
        for field, content in item.items():
            if _holds_non_finite(content):
                what = "a finite number" if isinstance(content, float) else "made of finite numbers"
                raise InvalidRequest(
                    f"queries.{position}: its {field} is not {what} (the query's "
                    "coefficients or weights overflow a float); scale the query down"
                )


def _holds_non_finite(content: Any) -> bool:
    if isinstance(content, float):
        return not math.isfinite(content)
    if isinstance(content, Mapping):
        return any(_holds_non_finite(v) for v in content.values())
    if isinstance(content, list | tuple):
        return any(_holds_non_finite(v) for v in content)
    return False
