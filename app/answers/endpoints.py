"""Route: answers from a release."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from app.answers import service
from app.answers.schemas import AnswerRequest, AnswersOut
from app.core.deps import CurrentUser, ServicesDep
from app.core.errors import (
    Conflict,
    FilesDeleted,
    InvalidRequest,
    NotFound,
    Unauthorized,
    error_responses,
)

router = APIRouter(prefix="/v1", tags=["answers"], responses=error_responses(Unauthorized))


@router.post(
    "/releases/{release_id}/answers",
    response_model=AnswersOut,
    responses=error_responses(NotFound, Conflict, FilesDeleted, InvalidRequest),
)
async def answers(
    release_id: uuid.UUID,
    body: AnswerRequest,
    user: CurrentUser,
    services: ServicesDep,
    request: Request,
) -> AnswersOut:
    """Answer a batch of queries from a release, with standard errors where the mechanism
    allows. Post-processing: no budget is spent."""
    # No ReadSessionDep: answering may take seconds and must not hold a session slot; the
    # service reads what it needs in a short transaction of its own, on one of the few
    # threads of ``answer_slots``, not the request threadpool's; a client that leaves
    # while its request waits for a slot is not computed for.
    return await service.answer_slots.run_while_connected(
        request.receive, user.id, service.answer, services, user, release_id, body.queries
    )
