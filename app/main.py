"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.concurrency import run_in_threadpool
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware

from app import __version__
from app.answers.endpoints import router as answers_router
from app.answers.service import answer_slots
from app.config import Settings, load_settings
from app.core.asgi import ASGIApp, Headers, Message, Receive, ResponseHeaders, Scope, Send
from app.core.deps import key_authenticates, request_connections
from app.core.disk import space_is_low
from app.core.errors import (
    ErrorBarrier,
    Unauthorized,
    error_body,
    error_response,
    install_error_handlers,
    install_error_schema,
)
from app.core.logs import RequestIds
from app.core.metrics import (
    CONTENT_TYPE,
    HttpMetrics,
    InstallationCollector,
    ProcessMetrics,
    check_token,
)
from app.core.security import INVALID_KEY, MISSING_KEY
from app.core.services import Services, set_current
from app.core.threads import limit_request_threads
from app.datasets.endpoints import router as datasets_router
from app.datasets.schemas import UPLOAD_DECLARATIONS
from app.releases.endpoints import router as releases_router
from app.releases.registry import REGISTRY
from app.releases.stages import Sweeper, worker_connections
from app.users.endpoints import router as users_router

log = logging.getLogger("curator")

#: Responses of at least this size are gzip-compressed for clients that accept it: answers
#: repeat their mechanism's note (10^4 answers: 9.1 MB of JSON, 45 KB compressed) and
#: synthetic CSVs compress well. Small responses (an API key at user creation) are never
#: compressed, which keeps secrets out of reach of compression side channels (BREACH).
GZIP_MINIMUM_BYTES = 4096
#: zlib level 1. Starlette compresses on the event loop, so speed matters more than the
#: last percent: on 2.2 MB of answers level 1 ran at 206 MB/s to 5.6 % of the size against
#: level 5's 104 MB/s to 5.0 %; on 16 MB of synthetic CSV 24 MB/s to 52 % against 8.5 MB/s
#: to 46 % (a 1.75 GiB sample.csv took 184 s at level 5; other requests' median latency
#: went from 9 to 59 ms meanwhile: scale audit).
GZIP_LEVEL = 1
#: Already compressed artifacts (Parquet, NumPy archives) are served as stored.
GZIP_EXCLUDED = ("application/vnd.apache.parquet", "application/octet-stream")


class WithheldMultipartDetail(logging.Filter):
    """The multipart parser's warnings quote bytes of the body it could not parse (``Found
    invalid character ... in header``): DESIGN rule 5 allows no raw value in a log line, so
    the record keeps its level and loses its detail."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            record.msg = "malformed multipart body (the parser's detail is withheld)"
            record.args = ()
        return True


def withhold_multipart_detail() -> None:
    parser_log = logging.getLogger("python_multipart.multipart")
    if not any(isinstance(f, WithheldMultipartDetail) for f in parser_log.filters):
        parser_log.addFilter(WithheldMultipartDetail())


#: The one route whose body is a dataset file (``upload_limit``); every other body is JSON.
UPLOAD_PATH = "/v1/datasets"


#: A JSON body larger than this is read only from a caller with an active API key.
UNAUTHENTICATED_BODY_BYTES = 64 << 10
#: Requests whose JSON body is larger than this are handled one at a time per process:
#: parsing holds the interpreter (``json.loads``: 60 MB of queries, about 3 s) and takes
#: about 30 times the body's size in memory (63 MiB of small arrays: about 2 GB).
LARGE_BODY_BYTES = 1 << 20


class BodyLimit:
    """Refuse request bodies over their route's limit with 413: ``upload_limit`` for the
    dataset upload (``POST /v1/datasets``, also counted as it streams, see
    :mod:`app.datasets.upload`), ``json_limit`` for every other request. The limit is
    checked on Content-Length up front and, for the JSON routes, on the bytes actually
    received (a chunked body has no Content-Length): such a body is read into memory up to
    the limit and handed to the route only when it fits.

    FastAPI reads and parses a route's JSON body before it resolves the route's
    dependencies, the caller's key among them; and ``json_limit`` is large (answers
    batches of 10^4 queries run to tens of MB). So a body larger than
    :data:`UNAUTHENTICATED_BODY_BYTES` (by Content-Length, or once that many bytes have
    arrived) is read further only if ``authenticate`` (run in the threadpool) accepts the
    request's bearer key: otherwise 401, as the route would answer. Every route that takes
    a body needs a key; the upload checks its key before it reads (:mod:`app.datasets.upload`).
    Requests whose body is over :data:`LARGE_BODY_BYTES` then wait their turn: one at a
    time, so that callers with keys sending many at once cannot multiply the memory their
    parsing takes."""

    def __init__(
        self,
        app: ASGIApp,
        upload_limit: int,
        json_limit: int,
        authenticate: Callable[[str], bool],
    ) -> None:
        self.app = app
        self.upload_limit = upload_limit
        self.json_limit = json_limit
        self.authenticate = authenticate
        self._large_body_locks: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Lock
        ] = weakref.WeakKeyDictionary()

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int, setting: str) -> None:
        message = f"the request body is larger than {limit} bytes ({setting})"
        response = JSONResponse(error_body("payload_too_large", message), status_code=413)
        await response(scope, receive, send)

    async def _admitted(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Whether a large body may be read: the request's bearer key is active. If not,
        the route's 401 (:data:`MISSING_KEY` or :data:`INVALID_KEY`) has been sent."""
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        scheme, secret = get_authorization_scheme_param(header.decode("latin-1"))
        if scheme.lower() != "bearer" or not secret:
            refusal = MISSING_KEY
        elif await run_in_threadpool(self.authenticate, secret):
            return True
        else:
            refusal = INVALID_KEY
        await error_response(Unauthorized(refusal))(scope, receive, send)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # the upload route, also under a proxy's path prefix (root_path)
        path = str(scope.get("path", "")).rstrip("/")
        upload = scope.get("method") == "POST" and path.endswith(UPLOAD_PATH)
        limit, setting = (
            (self.upload_limit, "CURATOR_MAX_UPLOAD_BYTES")
            if upload
            else (self.json_limit, "CURATOR_MAX_JSON_BYTES")
        )
        declared = 0
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit():
                declared = int(value)
        if declared > limit:
            await self._refuse(scope, receive, send, limit, setting)
            return
        if upload:
            await self.app(scope, receive, send)
            return
        checked = declared > UNAUTHENTICATED_BODY_BYTES
        if checked and not await self._admitted(scope, receive, send):
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > limit:
                await self._refuse(scope, receive, send, limit, setting)
                return
            if size > UNAUTHENTICATED_BODY_BYTES and not checked:
                checked = True
                if not await self._admitted(scope, receive, send):
                    return
            if not message.get("more_body", False):
                break
        pending = iter(messages)

        async def replay() -> Message:
            return next(pending, None) or await receive()

        if size <= LARGE_BODY_BYTES:
            await self.app(scope, replay, send)
            return
        async with self._large_body_turn():
            await self.app(scope, replay, send)

    def _large_body_turn(self) -> asyncio.Lock:
        """The lock that takes requests with a body over :data:`LARGE_BODY_BYTES` one at
        a time, one per event loop (a lock is bound to the loop it first waits on)."""
        loop = asyncio.get_running_loop()
        lock = self._large_body_locks.get(loop)
        if lock is None:
            lock = self._large_body_locks[loop] = asyncio.Lock()
        return lock


#: Headers every response carries (unless it set its own): no content-type sniffing
#: (``nosniff``: a downloaded CSV or JSON is never run as a script or page).
SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"),)
#: What the API's own responses (``/v1``) carry unless they set it: a new API key, rows of
#: synthetic data and budgets are not for a shared or browser cache to keep.
API_CACHE_CONTROL = (b"cache-control", b"no-store")


class SecurityHeaders(ResponseHeaders):
    """Adds :data:`SECURITY_HEADERS` to every HTTP response and :data:`API_CACHE_CONTROL` to
    those under ``/v1`` (also under a proxy's path prefix), leaving a header the response
    set itself as it is. Added outside ``ErrorBarrier``, so the generic 500 gets them too."""

    def rewrite(self, scope: Scope, headers: Headers) -> Headers:
        extra = list(SECURITY_HEADERS)
        if "/v1/" in f"{scope.get('path', '')}/":
            extra.append(API_CACHE_CONTROL)
        present = {name.lower() for name, _ in headers}
        return headers + [(name, value) for name, value in extra if name not in present]


class EncodedValidators(ResponseHeaders):
    """Around the gzip middleware: a response it compressed gets a weak ``ETag`` and no
    ``Last-Modified``. A download's validators are the stored file's (Starlette's
    :class:`~starlette.responses.FileResponse`), and ``If-Range`` with either asks for a
    206 of the file's plain bytes, which the gzip middleware leaves uncompressed: a
    client resuming a compressed download with them appended plain bytes to its
    compressed part. The compressed body is the same content in another encoding, which
    a weak validator may name (RFC 9110, section 8.8.1) and ``If-Range`` never matches
    (section 13.1.5: the whole file again); a plain response keeps both and resumes."""

    def rewrite(self, scope: Scope, headers: Headers) -> Headers:
        if not any(name.lower() == b"content-encoding" for name, _ in headers):
            return headers
        kept = []
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"last-modified":
                continue
            if lowered == b"etag" and not value.startswith(b"W/"):
                value = b"W/" + value
            kept.append((name, value))
        return kept


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI ``operationId``: its function's name (``create_release``), which
    generated clients name their methods after; FastAPI's default appends the path and
    method (``create_release_v1_datasets__dataset_id__releases_post``). Function names
    are unique across the routers (``tests/test_app.py``)."""
    return route.name


def publish_schemas(app: FastAPI, models: Sequence[type[BaseModel]]) -> None:
    """Add the request schemas of ``models`` (and of the models they use) to
    ``/openapi.json``'s components, for bodies that a route reads itself and describes in
    its ``openapi_extra`` (the upload's ``schema`` part): FastAPI publishes the models of
    the parameters it parses only. A name already published must have the same schema."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        _, top = models_json_schema(
            [(model, "validation") for model in models],
            ref_template="#/components/schemas/{model}",
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in top.get("$defs", {}).items():
            if components.setdefault(name, definition) != definition:
                raise RuntimeError(f"two different schemas are named {name!r}")
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


class Readiness(BaseModel):
    """The body of ``GET /readyz``, with 200 (ready) or 503 (not ready: the database or
    the queue cannot be reached). ``storage`` is ``low`` while the data directory has
    less than ``CURATOR_MIN_FREE_BYTES`` free (``unreadable``: its free space cannot be
    read): uploads and release requests are refused (503) meanwhile, but the process
    stays ready, as downloads and answers, which only read, go on."""

    status: Literal["ready", "not ready"]
    database: Literal["ok", "unreachable"]
    queue: Literal["ok", "unreachable"]
    storage: Literal["ok", "low", "unreadable"]


def create_app(settings: Settings | None = None, *, embedded_worker: bool = False) -> FastAPI:
    """Build the API. With ``embedded_worker`` the process also runs a queue consumer
    (threads), started and stopped with the server."""
    settings = settings or load_settings()
    withhold_multipart_detail()
    connections = request_connections()
    if embedded_worker:
        connections += worker_connections(settings.worker_threads)
    services = Services.build(settings, connections=connections)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        limit_request_threads()  # what the pool was sized for
        set_current(services)
        consumer, sweeper = None, None
        if embedded_worker:
            consumer = services.queue.consumer(settings.worker_threads, embedded=True)
            consumer.start()
            sweeper = Sweeper(services).start()
            log.info("embedded worker started (%s queue)", services.queue.backend)
        try:
            yield
        finally:
            if consumer is not None and sweeper is not None:
                sweeper.stop()
                await run_in_threadpool(consumer.stop, True)
                log.info("embedded worker stopped")
            set_current(None)
            services.close()

    app = FastAPI(
        title="privacy curator",
        version=__version__,
        description="Differentially private synthetic data and synopses of sensitive tables.",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        docs_url="/docs" if settings.api_docs else None,
        redoc_url="/redoc" if settings.api_docs else None,
    )
    app.state.services = services
    install_error_handlers(app)
    install_error_schema(app)
    publish_schemas(app, UPLOAD_DECLARATIONS)
    app.include_router(users_router)
    app.include_router(datasets_router)
    app.include_router(releases_router)
    app.include_router(answers_router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "not ready"}},
    )
    def readyz() -> JSONResponse:
        """Readiness: the database and the queue are reachable (and whether the data
        directory has room for uploads and releases: :class:`Readiness`)."""
        checks: dict[str, str] = {}
        for name, ping in (("database", services.db.ping), ("queue", services.queue.ping)):
            try:
                ping()
                checks[name] = "ok"
            except Exception as exc:
                log.warning("readiness: %s unreachable (%s)", name, type(exc).__name__)
                checks[name] = "unreachable"
        ready = all(v == "ok" for v in checks.values())
        try:
            storage = "low" if space_is_low(services.settings) else "ok"
        except OSError as exc:
            log.warning("readiness: free space unreadable (%s)", type(exc).__name__)
            storage = "unreadable"
        return JSONResponse(
            {"status": "ready" if ready else "not ready", **checks, "storage": storage},
            status_code=200 if ready else 503,
        )

    installation = InstallationCollector(
        services.db, REGISTRY.keys, lock_timeout=settings.lock_timeout
    )
    metrics = ProcessMetrics(installation, answer_slots)
    app.state.metrics = metrics
    if settings.metrics_token is not None:
        token = settings.metrics_token.get_secret_value()

        # not in the OpenAPI schema: an operator's endpoint, for Prometheus, not the API's
        # clients (and absent from the app when no token is set)
        @app.get("/metrics", include_in_schema=False)
        async def prometheus_metrics(request: Request) -> Response:
            """Prometheus's text format (:mod:`app.core.metrics`), for the bearer of
            ``CURATOR_METRICS_TOKEN``."""
            check_token(token, request.headers.get("authorization"))
            return Response(await metrics.scrape(), media_type=CONTENT_TYPE)

    app.add_middleware(
        BodyLimit,
        upload_limit=settings.max_upload_bytes + (8 << 20),
        json_limit=settings.max_json_bytes,
        authenticate=functools.partial(key_authenticates, services),
    )
    app.add_middleware(
        GZipMiddleware,
        minimum_size=GZIP_MINIMUM_BYTES,
        compresslevel=GZIP_LEVEL,
        exclude_content_types=(*DEFAULT_EXCLUDED_CONTENT_TYPES, *GZIP_EXCLUDED),
    )
    app.add_middleware(EncodedValidators)
    app.add_middleware(ErrorBarrier)
    # outside ErrorBarrier: the generic 500 and its log line have the request's id
    app.add_middleware(RequestIds)
    app.add_middleware(SecurityHeaders)
    # outermost: it sees every answer's status, the generic 500's too, and its last byte
    app.add_middleware(HttpMetrics, metrics=metrics)
    return app
