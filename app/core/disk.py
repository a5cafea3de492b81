"""Free space of the data directory.

A release measured on a full disk is spent, then fails at synthesis (its measurements
are kept, and a re-synthesis once space is freed costs nothing); but its curator, seeing
it fail, asks again and pays again, and a full disk accepted every such request
(fault-injection audit). So an upload or a release request is refused with a 503 before
anything is stored or reserved while the data directory has less than
``CURATOR_MIN_FREE_BYTES`` free, and ``/readyz`` reports it; a release queued before is
not measured meanwhile (:func:`app.releases.stages.run_measure` leaves it queued, its
reservation kept). Downloads and answers, which only read, go on.
"""

from __future__ import annotations

import shutil

from app.config import Settings
from app.core.errors import ServiceUnavailable


def free_bytes(settings: Settings) -> int:
    """The fewest bytes free on the file systems of the data directory's parts (the
    stored datasets, the releases' files, the upload spools: one file system unless the
    operator mounted them apart)."""
    parts = (settings.datasets_dir, settings.releases_dir, settings.tmp_dir)
    return min(shutil.disk_usage(path).free for path in parts)


def space_is_low(settings: Settings, writes: int = 0) -> bool:
    """Whether the data directory has less than ``CURATOR_MIN_FREE_BYTES`` free beside the
    ``writes`` bytes about to be written (never, with the setting at 0)."""
    return settings.min_free_bytes > 0 and free_bytes(settings) < settings.min_free_bytes + writes


def ensure_free_space(settings: Settings, what: str, writes: int = 0) -> None:
    """:class:`ServiceUnavailable` (503) for ``what`` (an upload, a release request)
    while :func:`space_is_low` beside the ``writes`` bytes it is about to write (an
    upload's spool and stored table: about twice its declared length): nothing is stored
    or reserved."""
    if space_is_low(settings, writes):
        beside = f" beside the {writes} it would write" if writes else ""
        raise ServiceUnavailable(
            f"the service's data directory has less than {settings.min_free_bytes} bytes "
            f"free (CURATOR_MIN_FREE_BYTES){beside}: no {what} is taken until its operator "
            "frees space; nothing was stored or reserved"
        )
