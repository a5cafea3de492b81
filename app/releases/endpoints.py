"""Routes: release requests, status, cancellation, re-synthesis, previews, downloads."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import FileResponse

from app.core.deps import (
    CurrentUser,
    DeferredTransactionDep,
    ServicesDep,
    SessionDep,
)
from app.core.errors import (
    BudgetExhausted,
    Conflict,
    FilesDeleted,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    StorageQuotaExceeded,
    TooManyActiveReleases,
    Unauthorized,
    error_responses,
)
from app.core.pagination import DEFAULT_LIMIT, NEXT_LINK, AfterId, Limit, link_next
from app.releases import downloads, service
from app.releases.schemas import PreviewOut, ReleaseCreate, ReleaseOut, ResynthesizeRequest

router = APIRouter(prefix="/v1", tags=["releases"], responses=error_responses(Unauthorized))

#: The media types the downloads are served as (each artifact's own, see the adapters),
#: so that a generated client reads the body as a file (or JSON) instead of nothing.
_FILE: dict[str, Any] = {"schema": {"type": "string", "format": "binary"}}
_CSV = {"text/csv": {"schema": {"type": "string"}}}  # text (UTF-8): clients read it as such
_PARQUET = {"application/vnd.apache.parquet": _FILE}
_JSON = {"application/json": {"schema": {"type": "object", "additionalProperties": True}}}
_NPZ = {"application/octet-stream": _FILE}


def _download(description: str, content: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """A download's responses: the file, the byte ranges a ``Range: bytes=...`` header
    asks for (another unit, or one that does not parse, is ignored: the whole file), and
    416 for a range past the end (``Content-Range: bytes */<size>``)."""
    return {
        200: {"description": description, "content": content},
        206: {
            "description": "the byte range asked for (Range: bytes=a-b), or several as "
            "multipart/byteranges",
            "content": {
                **{media: {"schema": {"type": "string"}} for media in content},
                "multipart/byteranges": _FILE,
            },
        },
        416: {"description": "the range starts past the end of the file (no body)"},
    }


@router.post(
    "/datasets/{dataset_id}/releases",
    response_model=ReleaseOut,
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        200: {
            "model": ReleaseOut,
            "description": "replay of an earlier request with the same Idempotency-Key",
        },
        **error_responses(
            NotFound,
            Forbidden,
            InvalidRequest,
            BudgetExhausted,
            Conflict,
            IdempotencyConflict,
            TooManyActiveReleases,
            StorageQuotaExceeded,
            ServiceUnavailable,
        ),
    },
)
async def create_release(
    dataset_id: uuid.UUID,
    body: ReleaseCreate,
    request: Request,
    user: CurrentUser,
    services: ServicesDep,
    transaction: DeferredTransactionDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> ReleaseOut:
    """Request a release: the budget is reserved now (409 ``budget_exhausted`` if it does
    not fit) and a worker measures and synthesises in the background."""
    # No SessionDep: the checks may take seconds and must hold no write lock meanwhile;
    # only the recording takes a (deferred) write transaction.
    checked = await service.release_checks.run(
        service.validate_release, services, user, dataset_id, body, idempotency_key
    )
    release, created = await transaction.run(
        service.create_release,
        services,
        user,
        dataset_id,
        body,
        checked,
        idempotency_key,
        request.state.api_key_id,
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return release


@router.get(
    "/datasets/{dataset_id}/releases",
    response_model=list[ReleaseOut],
    responses={**NEXT_LINK, **error_responses(NotFound)},
)
def list_releases(
    dataset_id: uuid.UUID,
    user: CurrentUser,
    session: SessionDep,
    request: Request,
    response: Response,
    limit: Limit = DEFAULT_LIMIT,
    after_id: AfterId = None,
) -> list[ReleaseOut]:
    """The dataset's releases, oldest first, a page at a time (``Link`` header: the next
    page)."""
    page = service.list_releases(session, user, dataset_id, limit, after_id)
    link_next(request, response, "after_id", page)
    return page.items


@router.post(
    "/datasets/{dataset_id}/preview",
    response_model=PreviewOut,
    responses=error_responses(NotFound, Forbidden, InvalidRequest, Conflict),
)
async def preview(
    dataset_id: uuid.UUID, body: ReleaseCreate, user: CurrentUser, services: ServicesDep
) -> PreviewOut:
    """What a release request would resolve to, cost and achieve; no data is read and no
    budget is spent."""
    # No ReadSessionDep: the checks may take seconds; the service reads in its own short
    # transaction and holds no session slot while it computes, on one of the few threads
    # of ``release_checks``.
    return await service.release_checks.run(service.preview, services, user, dataset_id, body)


@router.get(
    "/releases/{release_id}", response_model=ReleaseOut, responses=error_responses(NotFound)
)
def get_release(release_id: uuid.UUID, user: CurrentUser, session: SessionDep) -> ReleaseOut:
    return service.to_out(session, service.visible_release(session, user, release_id))


@router.delete(
    "/releases/{release_id}",
    response_model=ReleaseOut,
    responses=error_responses(NotFound, Forbidden, Conflict),
)
def cancel_release(release_id: uuid.UUID, user: CurrentUser, session: SessionDep) -> ReleaseOut:
    """Cancel: the budget is refunded if nothing was measured yet; otherwise it stays spent."""
    return service.cancel_release(session, user, release_id)


@router.delete(
    "/releases/{release_id}/artifacts",
    response_model=ReleaseOut,
    responses=error_responses(NotFound, Forbidden, Conflict),
)
def delete_files(
    release_id: uuid.UUID, user: CurrentUser, session: SessionDep, services: ServicesDep
) -> ReleaseOut:
    """Delete the release's published files, freeing their storage: downloads and answers
    are 410 ``files_deleted`` until a re-synthesis (no budget) publishes it again. The
    measurements and the spend stay."""
    return service.delete_files(session, services, user, release_id)


@router.post(
    "/releases/{release_id}/resynthesize",
    response_model=ReleaseOut,
    status_code=status.HTTP_202_ACCEPTED,
    responses=error_responses(
        NotFound, Forbidden, Conflict, InvalidRequest, TooManyActiveReleases, StorageQuotaExceeded
    ),
)
def resynthesize(
    release_id: uuid.UUID,
    body: ResynthesizeRequest,
    user: CurrentUser,
    session: SessionDep,
    services: ServicesDep,
) -> ReleaseOut:
    """Post-process the stored measurements again with other parameters (no budget)."""
    return service.resynthesize(session, services, user, release_id, body.params)


@router.get(
    "/releases/{release_id}/artifacts/{name}",
    response_class=FileResponse,
    responses={
        **_download(
            "the artifact, as the media type its entry in the release's artifacts names",
            {**_CSV, **_PARQUET, **_JSON, **_NPZ},
        ),
        **error_responses(NotFound, Conflict, FilesDeleted),
    },
)
def artifact(
    release_id: uuid.UUID, name: str, user: CurrentUser, session: SessionDep, services: ServicesDep
) -> FileResponse:
    return downloads.artifact(session, services, user, release_id, name)


@router.get(
    "/releases/{release_id}/synthetic",
    response_class=FileResponse,
    responses={
        **_download("the rows as CSV or Parquet (format)", {**_CSV, **_PARQUET}),
        **error_responses(NotFound, Conflict, FilesDeleted),
    },
)
def synthetic(
    release_id: uuid.UUID,
    user: CurrentUser,
    session: SessionDep,
    services: ServicesDep,
    format: Annotated[Literal["csv", "parquet"], Query()] = "csv",
    kind: Annotated[
        Literal["sample", "support"],
        Query(description="m sampled rows, or the weighted support points"),
    ] = "sample",
) -> FileResponse:
    """The synthetic database in original units."""
    return downloads.artifact(session, services, user, release_id, f"{kind}.{format}")


@router.get(
    "/releases/{release_id}/synopsis",
    response_class=FileResponse,
    responses={
        **_download("the synopsis", _JSON),
        **error_responses(NotFound, Conflict, FilesDeleted),
    },
)
def synopsis(
    release_id: uuid.UUID, user: CurrentUser, session: SessionDep, services: ServicesDep
) -> FileResponse:
    """The synopsis (noisy moments, basis, bounds, noise) as JSON, for offline evaluation."""
    return downloads.artifact(session, services, user, release_id, "synopsis.json")
