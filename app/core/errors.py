"""One error base class and the handlers that render every error the same way.

Every client-facing error is ``{"error": {"code": ..., "message": ..., ..., "request_id":
...}}`` (:func:`error_body`).
4xx are the client's mistakes; 422 is payload validation; a 5xx is a bug, and its
response says nothing about the cause (the log has the traceback, without the
exception message, which could quote a data value).
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import traceback
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from app.core.logs import request_id

log = logging.getLogger("curator.errors")


def frames_only(exc: BaseException) -> str:
    """The stack frames of ``exc`` for a log line: never its message nor its chained
    causes, which can carry data values (privacy rule 5). Every failure the service logs
    (a request, a task, a release stage) goes through here."""
    return "".join(traceback.format_tb(exc.__traceback__))


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The body of an error response, with the id of the request being handled
    (:class:`app.core.logs.RequestIds`, also in its ``X-Request-ID``), which a user quotes
    to the operator to find the request's log lines."""
    detail = {"code": code, "message": message, **extra}
    identifier = request_id.get()
    if identifier is not None:
        detail["request_id"] = identifier
    return {"error": detail}


def logged_path(scope: Mapping[str, Any]) -> str:
    """The request's path for a log line, percent-encoded as uvicorn's access line quotes
    it: the scope's path is the client's, percent-decoded, and a ``%0A`` in it would start
    a line of the client's choosing (one ending with another request's id, say) and a
    ``%1B`` a terminal escape."""
    return urllib.parse.quote(str(scope.get("path", "")))


class ServiceError(Exception):
    """Base of every error a service raises for the client."""

    status_code: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, **self.extra)


class Unauthorized(ServiceError):
    status_code = 401
    code = "unauthorized"


class Forbidden(ServiceError):
    status_code = 403
    code = "forbidden"


class NotFound(ServiceError):
    status_code = 404
    code = "not_found"


class Conflict(ServiceError):
    status_code = 409
    code = "conflict"


class FilesDeleted(ServiceError):
    """The release's published files were deleted by its curator: nothing to download or
    answer from until a re-synthesis publishes a version again."""

    status_code = 410
    code = "files_deleted"


class BudgetExhausted(ServiceError):
    status_code = 409
    code = "budget_exhausted"


class PayloadTooLarge(ServiceError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status_code = 415
    code = "unsupported_media_type"


class InvalidRequest(ServiceError):
    """The request is well-formed JSON but asks for something impossible."""

    status_code = 422
    code = "invalid_request"


class IdempotencyConflict(Conflict):
    """An ``Idempotency-Key`` the caller used for another request (a release's, an
    upload's)."""

    code = "idempotency_key_reused"


def check_idempotency_key(key: str | None) -> None:
    """An ``Idempotency-Key`` (a release request's, an upload's): 1 to 200 characters."""
    if key is not None and not 1 <= len(key) <= 200:
        raise InvalidRequest("Idempotency-Key must be 1 to 200 characters")


class TooManyActiveReleases(ServiceError):
    """The caller has as many releases queued or running as
    ``CURATOR_MAX_ACTIVE_RELEASES`` allows: retry once one has ended (``Retry-After``)."""

    status_code = 429
    code = "too_many_active_releases"


class StorageQuotaExceeded(ServiceError):
    """The caller's releases store, or may store, as many bytes as
    ``CURATOR_MAX_CURATOR_BYTES`` allows: waiting does not help (the curator deletes
    releases' files, or an administrator raises it)."""

    status_code = 422
    code = "storage_quota_exceeded"


class ServiceUnavailable(ServiceError):
    """The service cannot do it now, through no fault of the request: its database cannot
    be reached or its disk takes no more files. Answered with ``Retry-After``."""

    status_code = 503
    code = "service_unavailable"


#: Write errors of a data directory that is full or read-only (the operator's to fix).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
#: ``Retry-After`` of a :class:`ServiceUnavailable` (seconds).
RETRY_AFTER_SECONDS = 30


def is_storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused by a full or read-only disk (pyarrow's write
    errors carry the errno too)."""
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


def unavailable(exc: BaseException) -> ServiceUnavailable | None:
    """The 503 for an infrastructure failure under a request, or None for anything else
    (a bug: 500). A database error of the connection (refused, dropped, a restart, a
    SQLite lock held past its busy timeout, a full SQLite disk) or a full or read-only
    data directory is not the request's fault nor a bug, and a retry later may succeed."""
    if is_storage_full(exc):
        return ServiceUnavailable(
            "the service cannot store files now (its data directory is full or read-only); "
            "try again later"
        )
    if lock_timed_out(exc):
        return ServiceUnavailable(
            "the request waited too long for other work on the same records to finish "
            "(its lock wait, CURATOR_LOCK_TIMEOUT, ran out); nothing was changed; try again "
            "later"
        )
    if database_unavailable(exc):
        return ServiceUnavailable("the database is unavailable now; try again later")
    return None


#: SQLite's primary result codes of a database that cannot be used now, whatever the
#: statement: BUSY, LOCKED (a lock held past the busy timeout), NOMEM, READONLY, IOERR,
#: FULL, CANTOPEN, PROTOCOL. The rest of its ``OperationalError`` is the statement's
#: (SQLITE_ERROR: no such table or column, a syntax error, "cannot commit - no
#: transaction is active"): a bug, which a retry does not cure.
_SQLITE_UNAVAILABLE = frozenset({5, 6, 7, 8, 10, 13, 14, 15})
#: PostgreSQL's ``lock_not_available``: a lock waited for longer than ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"
#: SQLSTATE classes of a PostgreSQL that cannot serve the transaction now: connection
#: exception, transaction rollback (serialization failure, deadlock), insufficient
#: resources (disk full, too many connections), operator intervention (shutdown, a
#: statement cancelled), system error. Psycopg raises ``OperationalError`` for several
#: others that are the statement's (54 program limit exceeded, 55 object not in
#: prerequisite state, 3B savepoint exception, ...).
_POSTGRES_UNAVAILABLE = ("08", "40", "53", "57", "58", LOCK_NOT_AVAILABLE)


def lock_timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL giving up a lock wait (``lock_timeout``, set on a
    request's write transactions: :meth:`app.core.db.Database.transaction`)."""
    cause = exc.orig if isinstance(exc, DBAPIError) else None
    return getattr(cause, "sqlstate", None) == LOCK_NOT_AVAILABLE


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is a database error of the connection or of the database's state
    (refused, dropped, restarted, a lock held past its timeout, a full disk), which the
    same transaction may get past later, and not of the statement (a bug). A driver
    error with no code (a connection refused before any statement, or one this does not
    know) counts as the connection's."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    cause = exc.orig
    if isinstance(cause, sqlite3.Error):
        code = getattr(cause, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in _SQLITE_UNAVAILABLE
    sqlstate = getattr(cause, "sqlstate", None)
    return not isinstance(sqlstate, str) or sqlstate.startswith(_POSTGRES_UNAVAILABLE)


class InvalidUpload(ServiceError):
    """An uploaded file does not match its declared schema. ``problems`` lists each
    problem as ``{"column", "problem", "rows"}``; never a value."""

    status_code = 422
    code = "invalid_upload"


class ErrorDetail(BaseModel):
    """What went wrong: a stable ``code`` and a message for people (never a data value);
    some errors add fields (``problems`` of an upload, what remains of a budget).
    ``request_id`` is the request's ``X-Request-ID``: quote it to the operator."""

    model_config = ConfigDict(extra="allow")

    code: str
    message: str
    request_id: str


class ErrorOut(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


def error_responses(*errors: type[ServiceError]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the errors an endpoint can raise: one per status,
    described by its codes (``invalid_request or invalid_upload``), with the error body."""
    out: dict[int | str, dict[str, Any]] = {}
    for err in errors:
        entry = out.setdefault(err.status_code, {"description": err.code, "model": ErrorOut})
        if err.code not in entry["description"].split(" or "):
            entry["description"] += f" or {err.code}"
    return out


_VALIDATION_ERROR_REF = "#/components/schemas/HTTPValidationError"


def install_error_schema(app: FastAPI) -> None:
    """Make ``/openapi.json`` tell the error bodies the handlers send: FastAPI documents
    its own 422 body (``{"detail": [...]}``), which this service never sends (its
    validation errors are ``validation_error`` in the error envelope), and no route
    documents the 413 of :class:`app.main.BodyLimit`."""

    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        error_ref = {"$ref": "#/components/schemas/ErrorOut"}
        for operation in (op for ops in schema["paths"].values() for op in ops.values()):
            responses = operation["responses"]
            body = operation.get("requestBody", {}).get("content", {})
            invalid = responses.get("422")
            if invalid is not None:
                content = invalid.get("content", {}).get("application/json", {})
                if content.get("schema", {}).get("$ref") == _VALIDATION_ERROR_REF:
                    invalid["description"] = "validation_error"
                    content["schema"] = error_ref
                elif operation.get("parameters") or "application/json" in body:
                    invalid["description"] += " or validation_error"
            if body and "413" not in responses:
                responses["413"] = {
                    "description": "payload_too_large",
                    "content": {"application/json": {"schema": error_ref}},
                }
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def describe_errors(errors: Sequence[Mapping[str, Any]], prefix: str = "") -> str:
    """``"loc.path: message; ..."`` for pydantic errors, without the submitted values."""
    parts = []
    for err in errors:
        if err.get("type") == "json_invalid" and err.get("msg") == "JSON decode error":
            # FastAPI's loc for a body that does not parse is ("body", character offset)
            offset = next((p for p in err.get("loc", ())[1:] if isinstance(p, int)), None)
            reason = str((err.get("ctx") or {}).get("error", "")).strip()
            parts.append(
                "the request body is not valid JSON"
                + (f": {reason}" if reason else "")
                + (f" (at character {offset})" if offset is not None else "")
            )
            continue
        location = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        location = f"{prefix}.{location}" if prefix and location else (location or prefix or "body")
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{location}: {message}")
    return "; ".join(parts) or "invalid request"


NOT_JSON_MESSAGE = (
    "the request body must be a JSON object sent with Content-Type: application/json "
    "(curl -d sends application/x-www-form-urlencoded unless told otherwise)"
)


def _not_sent_as_json(request: Request, errors: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a JSON route's whole body was refused because the client did not say it
    is JSON: FastAPI then validates the raw bytes and says only "Input should be a valid
    dictionary or object to extract fields from" at ``body``."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        return False
    return any(tuple(err.get("loc", ())) == ("body",) for err in errors)


#: FastAPI's 400 detail for a JSON body it could not decode: invalid UTF-8 (a
#: ``UnicodeDecodeError``) or nesting past the parser's recursion limit (a
#: ``RecursionError``); a body that decodes but is not JSON is its ``json_invalid`` 422.
_BODY_NOT_PARSED = "There was an error parsing the body"
BODY_NOT_PARSED_MESSAGE = (
    "the request body is not valid JSON: it is not UTF-8 text, or it is nested too deeply"
)

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def error_response(exc: ServiceError) -> JSONResponse:
    """The response of ``exc``: its body and status, and for a 401 the
    ``WWW-Authenticate`` challenge (the route's handler and ``app.main.BodyLimit``)."""
    headers: dict[str, str] | None = None
    if exc.status_code == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    elif exc.status_code in (429, 503):
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)


#: The methods a 405's ``Allow`` header may name (RFC 9110's and PATCH).
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


def _allowed(request: Request) -> dict[str, str]:
    """The ``Allow`` header of a 405: every method a route of the application takes on the
    request's path. FastAPI makes a route per method and path, and Starlette's router
    answers a 405 from the first route whose path matched, naming its methods alone
    (``Allow: GET`` on a release's path, which also takes DELETE). Each method is tried
    against the routes (``BaseRoute.matches``, which FastAPI's included routers answer
    too). Empty when none matches (the header the exception carries stays)."""
    routes = request.app.router.routes
    methods = [
        method
        for method in HTTP_METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]
    return {"Allow": ", ".join(methods)} if methods else {}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The message names fields and rules only; pydantic's "input" (the submitted value)
        # is deliberately left out.
        errors = exc.errors()
        message = describe_errors(errors)
        if _not_sent_as_json(request, errors):
            message = NOT_JSON_MESSAGE
        return JSONResponse(error_body("validation_error", message), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == _BODY_NOT_PARSED:
            # a JSON body FastAPI could not decode at all (not UTF-8, or nested past the
            # parser's depth): the 422 of any other body that is not JSON, which every
            # JSON route documents (it was an undocumented 400 "bad_request")
            body = error_body("validation_error", BODY_NOT_PARSED_MESSAGE)
            return JSONResponse(body, status_code=422)
        code = _STATUS_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), **_allowed(request)}
        return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=headers)

    # Any other exception is answered by ErrorBarrier (an exception handler for Exception
    # would run in Starlette's ServerErrorMiddleware, which re-raises after it).


class ErrorBarrier:
    """Outermost ASGI guard for unhandled exceptions. Starlette's ``ServerErrorMiddleware``
    re-raises every exception after its 500 handler has answered, and the server (uvicorn)
    then logs it with its message and chained causes, which can carry data values (privacy
    rule 5). This middleware, added last but three (only ``app.core.logs.RequestIds``,
    ``app.main.SecurityHeaders`` and ``app.core.metrics.HttpMetrics``, which raise nothing,
    run before it), answers the generic 500 itself, logs the exception by type and frames
    only, and does not re-raise."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except ClientDisconnect:
            # the client went away while its body streamed (an aborted upload): not a bug,
            # and there is nobody to answer
            method, path = scope.get("method", ""), logged_path(scope)
            log.info("client disconnected during %s %s", method, path)
        except Exception as exc:
            method, path = scope.get("method", ""), logged_path(scope)
            name = type(exc).__name__
            refusal = unavailable(exc)
            if refusal is not None:
                # the infrastructure's failure, not a bug: a line for the operator (type
                # and errno only) and a 503 the client may retry
                number = exc.errno if isinstance(exc, OSError) else None
                code = errno.errorcode.get(number, "") if number is not None else ""
                name += f" {code}" if code else ""
                log.warning("%s on %s %s: answered 503", name, method, path)
                if not started:
                    await error_response(refusal)(scope, receive, send)
                return
            log.error("unhandled %s on %s %s\n%s", name, method, path, frames_only(exc))
            if not started:
                body = error_body("internal_error", "internal error; this is a bug")
                await JSONResponse(body, status_code=500)(scope, receive, send)
