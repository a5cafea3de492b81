"""The FastAPI application factory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app import __version__
from app.answers.endpoints import router as answers_router
from app.config import Settings, load_settings
from app.core.errors import install_error_handlers
from app.core.services import Services, set_current
from app.datasets.endpoints import router as datasets_router
from app.releases.endpoints import router as releases_router
from app.releases.stages import Sweeper
from app.users.endpoints import router as users_router

log = logging.getLogger("curator")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """Refuse request bodies larger than ``limit`` bytes with 413 (by Content-Length up
    front; uploads are also counted as they stream, see :mod:`app.datasets.upload`)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", []):
                if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                    response = JSONResponse(
                        {
                            "error": {
                                "code": "payload_too_large",
                                "message": f"the request body is larger than {self.limit} bytes "
                                "(CURATOR_MAX_UPLOAD_BYTES)",
                            }
                        },
                        status_code=413,
                    )
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def create_app(settings: Settings | None = None, *, embedded_worker: bool = False) -> FastAPI:
    """Build the API. With ``embedded_worker`` the process also runs a queue consumer
    (threads), started and stopped with the server."""
    settings = settings or load_settings()
    services = Services.build(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
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
    )
    app.state.services = services
    install_error_handlers(app)
    app.include_router(users_router)
    app.include_router(datasets_router)
    app.include_router(releases_router)
    app.include_router(answers_router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "not ready"}})
    def readyz() -> JSONResponse:
        """Readiness: the database and the queue are reachable."""
        checks: dict[str, str] = {}
        for name, ping in (("database", services.db.ping), ("queue", services.queue.ping)):
            try:
                ping()
                checks[name] = "ok"
            except Exception as exc:
                log.warning("readiness: %s unreachable (%s)", name, type(exc).__name__)
                checks[name] = "unreachable"
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse(
            {"status": "ready" if ready else "not ready", **checks},
            status_code=200 if ready else 503,
        )

    app.add_middleware(BodyLimit, limit=settings.max_upload_bytes + (8 << 20))
    return app
