"""What ties a log line to its request or its release stage, and the two formats of a line.

Each HTTP request has an id (:class:`RequestIds`): the client's ``X-Request-ID`` when it is
well-formed, else one generated here; every response carries it and every error body quotes
it (``request_id``), so a user can hand the operator the id of a failed request. A release
stage runs under its release's id and stage name (:func:`release_context`). Both live in
context variables, which anyio copies into the threadpool that runs sync endpoints and
into :class:`app.core.threads.ThreadLimit`'s threads; :class:`LogContext` stamps them on
each record a handler emits, and the formatters append them: ``text`` (``<time> <level>
<logger>: <message> [<request id>]``) or ``json`` (one object per line, for a log
aggregator). Privacy rule 5: an id is this service's own or a client's string checked to
be a short run of ``[A-Za-z0-9._:-]``; anything else is never echoed nor logged.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal

from app.core.asgi import Headers, Receive, ResponseHeaders, Scope, Send

REQUEST_ID_HEADER = b"x-request-id"
#: Where :class:`RequestIds` keeps the request's id in its scope, for its response.
SCOPE_KEY = "curator.request_id"
#: A client's ``X-Request-ID`` that is used as it is; any other is replaced.
WELL_FORMED_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")

#: The id of the HTTP request being handled (``None`` outside one).
request_id: ContextVar[str | None] = ContextVar("curator_request_id", default=None)
#: ``(release id, stage)`` of the release stage being run (``None`` outside one).
release_stage: ContextVar[tuple[str, str] | None] = ContextVar("curator_release", default=None)

LogFormat = Literal["text", "json"]


def accepted_request_id(value: bytes | None) -> str:
    """``value`` (a client's ``X-Request-ID``) if it is well-formed, else a new id."""
    if value is not None:
        text = value.decode("latin-1")
        if WELL_FORMED_REQUEST_ID.fullmatch(text):
            return text
    return uuid.uuid4().hex


@contextmanager
def release_context(release_id: uuid.UUID, stage: str) -> Iterator[None]:
    """Log records emitted inside (in this thread, or in threads started with a copy of
    its context) carry ``release_id`` and ``stage``."""
    token = release_stage.set((str(release_id), stage))
    try:
        yield
    finally:
        release_stage.reset(token)


class RequestIds(ResponseHeaders):
    """ASGI middleware: each HTTP request runs with its id in :data:`request_id`, and its
    response carries it in ``X-Request-ID`` (replacing one the application set). Added
    outside ``app.core.errors.ErrorBarrier``, so the generic 500 and its log line have it
    too, and so does uvicorn's access line (logged as the response starts)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        sent = next((v for k, v in headers if k.lower() == REQUEST_ID_HEADER), None)
        identifier = accepted_request_id(sent)
        scope[SCOPE_KEY] = identifier
        token = request_id.set(identifier)
        try:
            await super().__call__(scope, receive, send)
        finally:
            request_id.reset(token)

    def rewrite(self, scope: Scope, headers: Headers) -> Headers:
        kept = [(k, v) for k, v in headers if k.lower() != REQUEST_ID_HEADER]
        return [*kept, (REQUEST_ID_HEADER, str(scope[SCOPE_KEY]).encode("ascii"))]


class LogContext(logging.Filter):
    """Stamps each record with ``request_id``, ``release_id`` and ``stage`` (``None`` when
    unset) from the context it is emitted in. Installed on the handlers (a logger's own
    filters do not see the records its children propagate). A record stamped already
    keeps its stamp: a handler that formats it later, in another thread or context,
    does not erase it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if hasattr(record, "request_id"):
            return True
        record.request_id = request_id.get()
        release = release_stage.get()
        record.release_id, record.stage = release if release is not None else (None, None)
        return True


def _context(record: logging.LogRecord) -> dict[str, str]:
    """The context fields stamped on ``record`` that are set."""
    fields = ("request_id", "release_id", "stage")
    return {name: value for name in fields if (value := getattr(record, name, None)) is not None}


class UTCFormatter(logging.Formatter):
    """Log times in UTC, ISO 8601 with milliseconds and ``Z`` (``2026-11-29T13:14:04.512Z``),
    as the API's timestamps are: they were the host's local time without an offset, which
    matched no API timestamp on a host not set to UTC, nor another host's lines."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"


class TextFormatter(UTCFormatter):
    """``<time> <level> <logger>: <message>``, then `` [<request id>]`` or `` [release <id>
    <stage>]`` when the record has one, at the end of the message's first line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        text = super().formatMessage(record)
        context = _context(record)
        tags = ""
        if "request_id" in context:
            tags += f" [{context['request_id']}]"
        if "release_id" in context:
            tags += f" [release {context['release_id']} {context['stage']}]"
        # at the end of the first line, which a grep for the id shows (the lines of a
        # failure's frames follow)
        first, newline, rest = text.partition("\n")
        return f"{first}{tags}{newline}{rest}"


class JSONFormatter(UTCFormatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, then
    ``request_id``, ``release_id`` and ``stage`` when set and ``exception`` when the
    record has one (a multi-line message stays on its line, its newlines escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # default=str: a context field a caller passed itself (``extra={"release_id":
        # uuid}``, stamped as it is) would have lost the whole line
        return json.dumps(line, default=str)


def log_handler(log_format: LogFormat, stream: Any) -> logging.Handler:
    """A handler writing ``log_format`` lines to ``stream``, its records stamped with their
    context (:class:`LogContext`)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(LogContext())
    return handler
