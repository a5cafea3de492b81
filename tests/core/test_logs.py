"""Request ids and release stages on log lines, and the text and JSON line formats
(:mod:`app.core.logs`)."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

import tests.releases.fake_mechanism  # noqa: F401  (registers test_means)
from app.config import ConfigError, load_settings
from app.core.logs import LogContext, log_handler, release_context, request_id
from app.core.services import Services
from app.core.threads import ThreadLimit
from app.releases import stages
from tests.conftest import Caller
from tests.releases.helpers import dataset, request_release, run_all, services_of

GENERATED = re.compile(r"[0-9a-f]{32}")


class Records(logging.Handler):
    """Keeps the records it handles, stamped with their context as the service's handler
    stamps them (:class:`LogContext` on the handler)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(LogContext())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Iterator[Records]:
    """Every record logged at INFO or above during the test."""
    handler = Records()
    logging.getLogger().addHandler(handler)
    try:
        with caplog.at_level(logging.INFO):
            yield handler
    finally:
        logging.getLogger().removeHandler(handler)


def test_every_response_carries_a_request_id_which_its_error_body_quotes(
    client: TestClient, curator: Caller
) -> None:
    """A generated id per request, or the client's own when it is well-formed; every
    error body (a route's, the framework's 404 and 405, a validation error, the body
    limit's 413, the generic 500) quotes the response's id, as its schema says."""
    first, second = client.get("/healthz"), client.get("/healthz")
    assert GENERATED.fullmatch(first.headers["x-request-id"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    for mine in ("a", "trace-7f:01.2_X", "x" * 64):
        sent = client.get("/healthz", headers={"X-Request-ID": mine})
        assert sent.headers["x-request-id"] == mine

    def boom() -> None:
        raise ValueError("bug")

    client.app.add_api_route("/boom", boom)  # type: ignore[attr-defined]
    errors = [
        client.get(f"/v1/datasets/{uuid.uuid4()}", headers=curator.headers),  # a route's 404
        client.get("/v1/datasets"),  # 401
        client.get("/v1/nope"),
        client.put("/healthz"),
        client.get("/v1/datasets/not-a-uuid", headers=curator.headers),
        client.post("/v1/users", content=b"x" * (2 << 20), headers=curator.headers),
        client.get("/boom"),
    ]
    assert [r.status_code for r in errors] == [404, 401, 404, 405, 422, 413, 500]
    spec = client.get("/openapi.json").json()
    assert "request_id" in spec["components"]["schemas"]["ErrorDetail"]["required"]
    for response in errors:
        assert response.json()["error"]["request_id"] == response.headers["x-request-id"]
    quoted = client.get("/v1/nope", headers={"X-Request-ID": "ticket-42"})
    assert quoted.json()["error"]["request_id"] == "ticket-42"


@pytest.mark.parametrize(
    "sent",
    [
        b"forged\nINFO curator: all good",
        b"\x1b[31mred\x1b[0m",
        b"x" * 10240,
        b"x" * 65,
        "caf\u00e9".encode(),
        b"id with spaces",
        b"",
    ],
)
def test_a_malformed_request_id_is_replaced_never_echoed_nor_logged(
    client: TestClient, records: Records, sent: bytes
) -> None:
    """Newlines (forged log lines), terminal escapes, 10 kB, non-ASCII, spaces: the
    client's value reaches neither the response nor a log line; a generated id does."""

    def boom() -> None:
        raise ValueError("bug")

    client.app.add_api_route("/boom", boom)  # type: ignore[attr-defined]
    response = client.get("/boom", headers={"X-Request-ID": sent})  # type: ignore[dict-item]
    assert response.status_code == 500
    assigned = response.headers["x-request-id"]
    assert GENERATED.fullmatch(assigned)
    assert response.json()["error"]["request_id"] == assigned
    stream = io.StringIO()
    for log_format in ("text", "json"):
        handler = log_handler(log_format, stream)
        for record in records.records:
            handler.handle(record)
    logged = [
        r for r in records.records if r.getMessage().startswith("unhandled ValueError on GET /boom")
    ]
    assert [r.request_id for r in logged] == [assigned]  # type: ignore[attr-defined]
    if sent:
        assert sent.decode("latin-1") not in stream.getvalue()
        assert sent.decode("latin-1") not in response.text
        assert sent not in b"".join(v for _, v in response.headers.raw)
    assert "\x1b" not in stream.getvalue()


def test_lines_of_sync_endpoints_and_thread_limits_carry_the_request_id(
    client: TestClient, records: Records
) -> None:
    """FastAPI runs a sync endpoint in its threadpool and the answers run in a
    :class:`ThreadLimit`'s threads: both see the request's id (anyio copies the context
    into the thread); lines logged outside a request have none."""
    log = logging.getLogger("curator.test")
    limit = ThreadLimit("test_logs", 1)

    def in_threadpool() -> dict[str, str]:
        log.info("sync endpoint")
        return {}

    async def in_thread_limit() -> dict[str, str]:
        await limit.run(log.info, "thread limit")
        return {}

    client.app.add_api_route("/sync", in_threadpool)  # type: ignore[attr-defined]
    client.app.add_api_route("/limited", in_thread_limit)  # type: ignore[attr-defined]
    sync = client.get("/sync", headers={"X-Request-ID": "sync-1"})
    limited = client.get("/limited")
    log.info("outside")
    stamped = {r.getMessage(): r.request_id for r in records.records}  # type: ignore[attr-defined]
    assert stamped["sync endpoint"] == sync.headers["x-request-id"] == "sync-1"
    assert stamped["thread limit"] == limited.headers["x-request-id"]
    assert stamped["outside"] is None


def test_a_release_stage_logs_under_its_release_and_stage(
    client: TestClient,
    curator: Caller,
    records: Records,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every line a stage logs, its heartbeat thread's too, names the release and the
    stage, so that an operator can follow one release across the API and the workers."""
    stage_log = logging.getLogger("curator.releases")
    claim = stages._claim

    def logged_claim(services: Services, release_id: uuid.UUID, stage: str) -> Any:
        stage_log.info("claiming")
        return claim(services, release_id, stage)

    monkeypatch.setattr(stages, "_claim", logged_claim)
    release_id = request_release(client, curator, dataset(client, curator)).json()["id"]
    run_all(client, release_id)
    claimed = [
        (getattr(r, "release_id", None), getattr(r, "stage", None))
        for r in records.records
        if r.getMessage() == "claiming"
    ]
    assert claimed == [(release_id, "measure"), (release_id, "synthesize")]

    beaten = threading.Event()

    def beat(_heartbeat: stages.Heartbeat) -> None:
        stage_log.info("beat")
        beaten.set()

    monkeypatch.setattr(stages.Heartbeat, "beat", beat)
    with release_context(uuid.UUID(release_id), "synthesize"):
        heartbeat = stages.Heartbeat(services_of(client), cast(stages.Claim, None))
    heartbeat.interval = 0.01
    with heartbeat:
        assert beaten.wait(30)
    beat_record = next(r for r in records.records if r.getMessage() == "beat")
    assert beat_record.threadName == "lease-heartbeat"
    assert (beat_record.release_id, beat_record.stage) == (release_id, "synthesize")  # type: ignore[attr-defined]


def test_text_lines_end_with_their_context_and_json_lines_are_objects() -> None:
    log = logging.getLogger("curator.format-test")
    log.propagate = False
    log.setLevel(logging.INFO)
    text, lines = io.StringIO(), io.StringIO()
    log.addHandler(log_handler("text", text))
    log.addHandler(log_handler("json", lines))
    try:
        log.warning("plain")
        token = request_id.set("req-1")
        try:
            log.info("in a request: %d rows", 3)
        finally:
            request_id.reset(token)
        release = uuid.uuid4()
        with release_context(release, "measure"):
            try:
                raise KeyError("x")
            except KeyError:
                log.exception("failed\nsecond line")
    finally:
        log.handlers.clear()
        log.propagate = True
        log.setLevel(logging.NOTSET)
    plain, requested, failed = text.getvalue().split("\n", 2)
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.fullmatch(rf"{stamp} WARNING curator\.format-test: plain", plain)
    assert re.fullmatch(
        rf"{stamp} INFO curator\.format-test: in a request: 3 rows \[req-1\]", requested
    )
    assert re.match(
        rf"{stamp} ERROR curator\.format-test: failed \[release {release} measure\]\nsecond line"
        r"\nTraceback",
        failed,
    )
    objects = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert len(objects) == 3  # the multi-line message and its traceback on one line each
    assert objects[0] == {
        "time": objects[0]["time"],
        "level": "WARNING",
        "logger": "curator.format-test",
        "message": "plain",
    }
    assert re.fullmatch(stamp, objects[0]["time"])
    assert objects[1]["request_id"] == "req-1"
    assert objects[1]["message"] == "in a request: 3 rows"
    assert objects[2]["release_id"] == str(release)
    assert objects[2]["stage"] == "measure"
    assert objects[2]["message"] == "failed\nsecond line"
    assert objects[2]["exception"].startswith("Traceback")
    assert "KeyError" in objects[2]["exception"]
    assert "request_id" not in objects[2]


def test_a_json_line_keeps_a_context_field_passed_as_an_object() -> None:
    """A record stamped by its caller (``extra=``) keeps its stamp (:class:`LogContext`);
    a release id passed as a UUID made ``json.dumps`` raise, and logging dropped the line
    (printing "--- Logging error ---" to standard error instead)."""
    log = logging.getLogger("curator.format-test")
    log.propagate = False
    lines = io.StringIO()
    log.addHandler(log_handler("json", lines))
    release = uuid.uuid4()
    try:
        log.warning("stamped", extra={"request_id": None, "release_id": release})
    finally:
        log.handlers.clear()
        log.propagate = True
    (line,) = lines.getvalue().splitlines()
    assert json.loads(line)["release_id"] == str(release)


def test_the_log_format_is_a_validated_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CURATOR_LOG_FORMAT", raising=False)
    assert load_settings().log_format == "text"
    monkeypatch.setenv("CURATOR_LOG_FORMAT", "JSON")
    assert load_settings().log_format == "json"
    monkeypatch.setenv("CURATOR_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="CURATOR_LOG_FORMAT"):
        load_settings()


def test_configure_logging_writes_json_lines_to_standard_error() -> None:
    """``CURATOR_LOG_FORMAT=json``: every line a process logs is one JSON object, a
    Python warning's too."""
    code = (
        "import logging, warnings; from app.cli import configure_logging; "
        "configure_logging('INFO', 'json'); logging.getLogger('curator').info('hello'); "
        "warnings.warn('careful')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    objects = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(o["logger"], o["level"]) for o in objects] == [
        ("curator", "INFO"),
        ("py.warnings", "WARNING"),
    ]


def test_a_path_cannot_forge_a_line_of_another_request(
    client: TestClient, records: Records
) -> None:
    """The path a line quotes is the client's, percent-decoded: a ``%0A`` in it started a
    new line of the client's choosing, which could end with another request's id and so
    be found by a grep for it. The path is logged percent-encoded, as uvicorn's access
    line quotes it."""

    def boom(name: str) -> None:
        raise ValueError("bug")

    client.app.add_api_route("/boom/{name}", boom)  # type: ignore[attr-defined]
    forged = "2026-11-29T13:14:04.512Z INFO curator.releases: all good [victim-1]"
    response = client.get(f"/boom/x%1B[2J%0A{forged.replace(' ', '%20')}")
    assert response.status_code == 500
    stream = io.StringIO()
    handler = log_handler("text", stream)
    for record in records.records:
        handler.handle(record)
    lines = stream.getvalue().splitlines()
    unhandled = [line for line in lines if "unhandled ValueError on GET /boom/x" in line]
    assert len(unhandled) == 1
    assert unhandled[0].endswith(f"[{response.headers['x-request-id']}]")
    assert not any(line.endswith("[victim-1]") for line in lines)
    assert "\x1b" not in stream.getvalue()
