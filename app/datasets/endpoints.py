"""Routes: datasets, their budgets and grants."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response, status
from starlette.concurrency import run_in_threadpool

from app.core.deps import (
    CuratorUser,
    CurrentUser,
    DeferredTransactionDep,
    ServicesDep,
    SessionDep,
)
from app.core.disk import ensure_free_space
from app.core.errors import (
    Conflict,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    InvalidUpload,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    Unauthorized,
    UnsupportedMediaType,
    check_idempotency_key,
    error_responses,
)
from app.core.pagination import (
    DEFAULT_LIMIT,
    NEXT_LINK,
    AfterId,
    AfterIntId,
    Limit,
    link_next,
)
from app.datasets import service
from app.datasets.schemas import (
    UPLOAD_DECLARATIONS,
    BudgetOut,
    BudgetUpdate,
    DatasetOut,
    DatasetUpdate,
    GrantCreate,
    GrantOut,
)
from app.datasets.upload import fingerprint_keys, receive_multipart, upload_checks

router = APIRouter(prefix="/v1", tags=["datasets"], responses=error_responses(Unauthorized))

_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "schema"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "a table: CSV (UTF-8, with a header row) or "
                            "Parquet; a graph: an edge list, one edge 'u,v' a line",
                        },
                        "schema": {
                            "oneOf": [
                                {"$ref": f"#/components/schemas/{model.__name__}"}
                                for model in UPLOAD_DECLARATIONS
                            ],
                            "description": "the declaration, as JSON: a table {name, kind: "
                            "'table' (default), columns, budget, out_of_bounds, "
                            "allow_non_dp_releases}; a graph {name, kind: 'graph', vertices, "
                            "budget}",
                        },
                    },
                },
                # the schema part is JSON (a client sends it so); the server reads the
                # part by its name, whatever its content type
                "encoding": {"schema": {"contentType": "application/json"}},
            }
        },
    }
}


@router.post(
    "/datasets",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetOut,
    responses={
        200: {
            "model": DatasetOut,
            "description": "replay of an earlier upload with the same Idempotency-Key",
        },
        **error_responses(
            Forbidden,
            InvalidRequest,
            InvalidUpload,
            PayloadTooLarge,
            UnsupportedMediaType,
            ServiceUnavailable,
            IdempotencyConflict,
        ),
    },
    openapi_extra=_UPLOAD_BODY,
)
async def create_dataset(
    request: Request,
    response: Response,
    curator: CuratorUser,
    services: ServicesDep,
    transaction: DeferredTransactionDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> DatasetOut:
    """Upload a table with its declared schema and budget (multipart: ``file``, ``schema``).
    With an ``Idempotency-Key``, a retry of the same upload (same declaration, same file)
    returns the dataset the first created (200), and the key with another upload is 409."""
    check_idempotency_key(idempotency_key)
    # No SessionDep: the body streams and the file is validated and stored for minutes,
    # holding no database resource; only the recording takes a (deferred) transaction.
    # before a byte is spooled: the spool and the stored table take about twice the
    # upload's length, when it says its length
    length = request.headers.get("content-length", "")
    writes = 2 * int(length) if length.isdigit() else 0
    ensure_free_space(services.settings, "upload", writes)
    upload = await receive_multipart(
        request,
        services.settings.tmp_dir,
        services.settings.max_upload_bytes,
        fingerprint_keys(services.data_key),
    )
    try:
        declaration = service.parse_declaration(upload.fields.get("schema"))
        replayed = await run_in_threadpool(
            service.replayed_upload,
            services,
            curator,
            idempotency_key,
            declaration,
            upload.fingerprints,
            request.state.api_key_id,
        )
        if replayed is not None:  # a retry: nothing validated or stored again
            response.status_code = status.HTTP_200_OK
            return replayed
        stored = await upload_checks.run(
            service.store_dataset, services, curator, declaration, upload
        )
    finally:
        upload.discard()
    try:
        out, created = await transaction.run(
            service.record_dataset,
            curator,
            stored,
            request.state.api_key_id,
            idempotency_key,
        )
    except BaseException:
        stored.discard()  # not recorded: rolled back, or the transaction never began
        raise
    if not created:  # a concurrent copy recorded it: this one's file is not needed
        stored.discard()
        response.status_code = status.HTTP_200_OK
    return out


@router.get("/datasets", response_model=list[DatasetOut], responses=NEXT_LINK)
def list_datasets(
    user: CurrentUser,
    session: SessionDep,
    request: Request,
    response: Response,
    limit: Limit = DEFAULT_LIMIT,
    after_id: AfterId = None,
) -> list[DatasetOut]:
    """The datasets the caller may see, oldest first, a page at a time (``Link`` header:
    the next page)."""
    page = service.list_datasets(session, user, limit, after_id)
    link_next(request, response, "after_id", page)
    return page.items


@router.get(
    "/datasets/{dataset_id}", response_model=DatasetOut, responses=error_responses(NotFound)
)
def get_dataset(dataset_id: uuid.UUID, user: CurrentUser, session: SessionDep) -> DatasetOut:
    return service.get_dataset(session, user, dataset_id)


@router.patch(
    "/datasets/{dataset_id}",
    response_model=DatasetOut,
    responses=error_responses(NotFound, Forbidden, InvalidRequest),
)
def update_dataset(
    dataset_id: uuid.UUID, body: DatasetUpdate, user: CurrentUser, session: SessionDep
) -> DatasetOut:
    """Switch the curator's opt-in for releases that are not differentially private."""
    return service.update_dataset(session, user, dataset_id, body.allow_non_dp_releases)


@router.delete(
    "/datasets/{dataset_id}/data",
    response_model=DatasetOut,
    responses=error_responses(NotFound, Forbidden, Conflict),
)
def delete_data(
    dataset_id: uuid.UUID, user: CurrentUser, session: SessionDep, services: ServicesDep
) -> DatasetOut:
    """Delete the dataset's stored rows; its ledger, releases and their measurements stay,
    and it takes no new release. 409 while a release has yet to read the rows."""
    return service.delete_data(session, services, user, dataset_id)


@router.get(
    "/datasets/{dataset_id}/budget",
    response_model=BudgetOut,
    responses={**NEXT_LINK, **error_responses(NotFound)},
)
def get_budget(
    dataset_id: uuid.UUID,
    user: CurrentUser,
    session: SessionDep,
    request: Request,
    response: Response,
    limit: Limit = DEFAULT_LIMIT,
    after_id: AfterIntId = None,
) -> BudgetOut:
    """Totals, spent, reserved and remaining over every ledger entry, and a page of the
    entries, oldest first (``Link`` header: the next page)."""
    budget, page = service.get_budget(session, user, dataset_id, limit, after_id)
    link_next(request, response, "after_id", page)
    return budget


@router.patch(
    "/datasets/{dataset_id}/budget",
    response_model=BudgetOut,
    responses={**NEXT_LINK, **error_responses(NotFound, Forbidden, Conflict)},
)
def update_budget(
    dataset_id: uuid.UUID,
    body: BudgetUpdate,
    user: CurrentUser,
    session: SessionDep,
    request: Request,
    response: Response,
) -> BudgetOut:
    """Change the totals: up freely, down never below spent + reserved. Answers as the
    budget's first page (``Link`` header: the URL of the next one, for a GET)."""
    budget, page = service.update_budget(session, user, dataset_id, body.epsilon, body.delta)
    link_next(request, response, "after_id", page)
    return budget


@router.get(
    "/datasets/{dataset_id}/grants",
    response_model=list[GrantOut],
    responses={**NEXT_LINK, **error_responses(NotFound, Forbidden)},
)
def list_grants(
    dataset_id: uuid.UUID,
    user: CurrentUser,
    session: SessionDep,
    request: Request,
    response: Response,
    limit: Limit = DEFAULT_LIMIT,
    after_id: AfterId = None,
) -> list[GrantOut]:
    """The dataset's grants, oldest first, a page at a time; ``after_id`` is the last
    grant's ``user_id`` (``Link`` header: the next page)."""
    page = service.list_grants(session, user, dataset_id, limit, after_id)
    link_next(request, response, "after_id", page)
    return [GrantOut.model_validate(g) for g in page.items]


@router.post(
    "/datasets/{dataset_id}/grants",
    response_model=GrantOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": GrantOut, "description": "the grant already existed"},
        **error_responses(NotFound, Forbidden, InvalidRequest),
    },
)
def create_grant(
    dataset_id: uuid.UUID,
    body: GrantCreate,
    user: CurrentUser,
    session: SessionDep,
    response: Response,
) -> GrantOut:
    grant, created = service.grant(session, user, dataset_id, body.user_id)
    if not created:
        response.status_code = status.HTTP_200_OK
    return GrantOut.model_validate(grant)


@router.delete(
    "/datasets/{dataset_id}/grants/{user_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(NotFound, Forbidden),
)
def revoke_grant(
    dataset_id: uuid.UUID, user_id: uuid.UUID, user: CurrentUser, session: SessionDep
) -> Response:
    service.revoke_grant(session, user, dataset_id, user_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
