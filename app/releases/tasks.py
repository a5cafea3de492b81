"""Queue tasks of the release lifecycle (ids only; the stages re-read their rows)."""

from __future__ import annotations

import uuid

from app.core.services import current
from app.releases.service import MEASURE_TASK, SYNTHESIZE_TASK
from app.releases.stages import run_measure, run_synthesize
from app.worker.queue import task


@task(MEASURE_TASK)
def measure(release_id: str) -> None:
    run_measure(current(), uuid.UUID(release_id))


@task(SYNTHESIZE_TASK)
def synthesize(release_id: str) -> None:
    run_synthesize(current(), uuid.UUID(release_id))
