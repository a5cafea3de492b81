"""Application-wide behaviour: health, readiness, the error envelope, the body limit."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import numpy as np
import psycopg.errors
import pytest
from fastapi import Response
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.answers.schemas import AnswerRequest
from app.config import Settings
from app.core.services import Services
from app.datasets.schemas import (
    BudgetUpdate,
    DatasetDeclaration,
    DatasetUpdate,
    GrantCreate,
    GraphDeclaration,
)
from app.demo.runner import DATA
from app.main import LARGE_BODY_BYTES, UNAUTHENTICATED_BODY_BYTES, BodyLimit, create_app
from app.releases import adapters, registry
from app.releases.schemas import ReleaseCreate, ResynthesizeRequest
from app.storage.source import EncryptedTableSource
from app.users.schemas import UserCreate
from tests.conftest import Caller
from tests.datasets.helpers import SCHEMA, csv_bytes, upload
from tests.datasets.test_graphs import upload_graph
from tests.releases.helpers import dataset, request_release, run_all


def test_healthz_and_readyz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "database": "ok", "queue": "ok", "storage": "ok"}


def test_the_interactive_api_pages_can_be_turned_off(settings: Settings) -> None:
    """/docs and /redoc load their scripts from a public CDN: CURATOR_API_DOCS=false
    serves neither (404); the schema stays."""
    for enabled in (True, False):
        app = create_app(settings.model_copy(update={"api_docs": enabled}))
        with TestClient(app) as client:
            for path in ("/docs", "/redoc"):
                assert client.get(path).status_code == (200 if enabled else 404), path
            assert client.get("/openapi.json").status_code == 200


def test_readyz_reports_an_unreachable_database(client: TestClient) -> None:
    services: Services = client.app.state.services  # type: ignore[attr-defined]

    def down() -> None:
        raise ConnectionError("db down")

    services.db.ping = down  # type: ignore[method-assign]
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "not ready",
        "database": "unreachable",
        "queue": "ok",
        "storage": "ok",
    }


def test_low_free_space_refuses_uploads_and_releases_before_anything_is_stored_or_reserved(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release measured on a full disk is spent, then fails at synthesis, and its
    curator asks (and pays) again; a full disk took every such request (fault-injection
    audit). Below CURATOR_MIN_FREE_BYTES free, an upload and a new release are 503s with
    nothing stored or reserved, an idempotent replay is still answered, /readyz says
    ``storage: low`` and stays ready, and downloads go on."""
    from app.core import disk

    services: Services = client.app.state.services  # type: ignore[attr-defined]
    dataset_id = dataset(client, curator)
    first = request_release(client, curator, dataset_id, key="first")
    assert first.status_code == 202, first.text
    run_all(client, first.json()["id"])
    before = client.get(f"/v1/datasets/{dataset_id}/budget", headers=curator.headers).json()
    files = sorted(p.name for p in services.settings.datasets_dir.iterdir())

    monkeypatch.setattr(services.settings, "min_free_bytes", Settings().min_free_bytes)
    free = services.settings.min_free_bytes - 1
    monkeypatch.setattr(disk, "free_bytes", lambda settings: free)
    assert client.get("/readyz").json()["storage"] == "low"
    assert client.get("/readyz").status_code == 200
    refused = request_release(client, curator, dataset_id)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "30"
    assert "CURATOR_MIN_FREE_BYTES" in refused.json()["error"]["message"]
    assert refused.json()["error"]["code"] == "service_unavailable"
    upload_refused = upload(client, curator, csv_bytes())
    assert upload_refused.status_code == 503, upload_refused.text
    assert sorted(p.name for p in services.settings.datasets_dir.iterdir()) == files
    assert list(services.settings.tmp_dir.iterdir()) == []
    again = request_release(client, curator, dataset_id, key="first")
    assert again.status_code == 200, again.text  # the replay: the same release
    assert again.json()["id"] == first.json()["id"]
    after = client.get(f"/v1/datasets/{dataset_id}/budget", headers=curator.headers).json()
    assert after == before
    url = f"/v1/releases/{first.json()['id']}/synthetic"
    assert client.get(url, headers=curator.headers).status_code == 200
    # an upload needs room for its spool and stored table beside the threshold: about
    # twice its declared length
    content = csv_bytes()
    free = services.settings.min_free_bytes + 2 * len(content) + 4096
    assert upload(client, curator, content).status_code == 201
    bigger = csv_bytes(rows=["20,60,AB,true"] * 400)
    refused = upload(client, curator, bigger)
    assert refused.status_code == 503, refused.text
    assert "beside the" in refused.json()["error"]["message"]
    monkeypatch.setattr(services.settings, "min_free_bytes", 0)  # 0: not checked
    assert request_release(client, curator, dataset_id).status_code == 202


def test_openapi_declares_the_readiness_body(client: TestClient) -> None:
    """Both answers of /readyz carry the same body; a generated client read neither (the
    200 declared an empty schema, the 503 no body)."""
    spec = client.get("/openapi.json").json()
    responses = spec["paths"]["/readyz"]["get"]["responses"]
    for status in ("200", "503"):
        schema = responses[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/Readiness"}, status
    readiness = spec["components"]["schemas"]["Readiness"]
    assert readiness["required"] == ["status", "database", "queue", "storage"]
    assert readiness["properties"]["status"]["enum"] == ["ready", "not ready"]


def test_error_envelope_for_framework_errors(client: TestClient, curator: Caller) -> None:
    missing = client.get("/v1/nope")
    request_id = missing.headers["x-request-id"]
    assert missing.json() == {
        "error": {"code": "not_found", "message": "Not Found", "request_id": request_id}
    }
    assert client.put("/healthz").json()["error"]["code"] == "method_not_allowed"
    bad_id = client.get("/v1/datasets/not-a-uuid", headers=curator.headers)
    assert bad_id.status_code == 422
    assert bad_id.json()["error"]["code"] == "validation_error"
    assert "dataset_id" in bad_id.json()["error"]["message"]


def test_a_405_allows_every_method_of_its_path(client: TestClient, curator: Caller) -> None:
    """FastAPI makes one route per method and path, and Starlette's 405 named the methods
    of the first route whose path matched: ``Allow: GET`` on a release's path, which also
    takes DELETE, and ``Allow: POST`` on the datasets' list, which also takes GET
    (RFC 9110, 15.5.6: the header lists the target's methods). Every method of every
    route of the path is listed, the body in the error envelope."""
    for method, path, allowed in (
        ("PUT", f"/v1/releases/{uuid.uuid4()}", "GET, DELETE"),
        ("DELETE", f"/v1/datasets/{uuid.uuid4()}", "GET, PATCH"),
        ("PATCH", "/v1/datasets", "GET, POST"),
        ("PUT", "/healthz", "GET"),
    ):
        response = client.request(method, path, headers=curator.headers)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["allow"] == allowed, (method, path)
        assert response.json() == {
            "error": {
                "code": "method_not_allowed",
                "message": "Method Not Allowed",
                "request_id": response.headers["x-request-id"],
            }
        }


def test_validation_errors_do_not_echo_input(client: TestClient, admin: Caller) -> None:
    response = client.post(
        "/v1/users", headers=admin.headers, json={"name": "x", "role": "s3cr3t-value"}
    )
    assert response.status_code == 422
    assert "s3cr3t-value" not in response.text


@pytest.mark.parametrize(
    "content_type", [None, "application/x-www-form-urlencoded", "text/plain; charset=utf-8"]
)
def test_a_json_body_sent_without_its_content_type_says_so(
    client: TestClient, admin: Caller, content_type: str | None
) -> None:
    """``curl -d`` sends application/x-www-form-urlencoded: FastAPI then validates the raw
    bytes and said only "body: Input should be a valid dictionary or object"."""
    body = b'{"name": "x", "role": "analyst"}'
    headers = dict(admin.headers)
    if content_type is not None:
        headers["Content-Type"] = content_type
    response = client.post("/v1/users", headers=headers, content=body)
    assert response.status_code == 422
    message = response.json()["error"]["message"]
    assert message.startswith(
        "the request body must be a JSON object sent with Content-Type: application/json"
    ), message
    as_json = client.post(
        "/v1/users", headers={**admin.headers, "Content-Type": "application/json"}, content=body
    )
    assert as_json.status_code == 201, as_json.text
    suffixed = client.post(  # FastAPI reads a +json media type as JSON too: not the hint
        "/v1/users",
        headers={**admin.headers, "Content-Type": "application/vnd.api+json"},
        content=b"[]",
    )
    assert "valid dictionary" in suffixed.json()["error"]["message"], suffixed.text
    a_field_missing = client.post(  # a JSON body keeps the message about its fields
        "/v1/users", headers={**admin.headers, "Content-Type": "application/json"}, json={}
    )
    assert "name: Field required" in a_field_missing.json()["error"]["message"]
    not_an_object = client.post(  # sent as JSON: the body itself is what is wrong
        "/v1/users", headers={**admin.headers, "Content-Type": "application/json"}, content=b"[]"
    )
    assert not_an_object.status_code == 422
    assert "Content-Type" not in not_an_object.json()["error"]["message"]
    bad_path = client.get("/v1/datasets/not-an-id", headers=admin.headers)  # no body at all
    assert bad_path.status_code == 422
    assert "dataset_id" in bad_path.json()["error"]["message"]


NOT_PARSED = "the request body is not valid JSON: it is not UTF-8 text, or it is nested too deeply"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"name": "x",',
            "the request body is not valid JSON: Expecting property name enclosed in "
            "double quotes (at character 13)",
        ),
        (b"\xff\xfe", "the request body is not valid JSON: Expecting value (at character 0)"),
        # FastAPI answered these with an undocumented 400 "There was an error parsing the body"
        (b'{"name": "\xc3("}', NOT_PARSED),  # not UTF-8
        (b"[" * 100_000 + b"]" * 100_000, NOT_PARSED),  # nested past the parser's depth
    ],
)
def test_a_body_that_is_not_json_is_named_as_such(
    client: TestClient, admin: Caller, body: bytes, message: str
) -> None:
    # FastAPI's own wording is "1: JSON decode error": a location that names no field
    response = client.post(
        "/v1/users", headers={**admin.headers, "Content-Type": "application/json"}, content=body
    )
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "validation_error",
        "message": message,
        "request_id": response.headers["x-request-id"],
    }


def test_multipart_parser_warnings_quote_no_body_bytes(
    client: TestClient, curator: Caller, caplog: pytest.LogCaptureFixture
) -> None:
    """The parser logs the byte it choked on (``Found invalid character 200 in header``)."""
    caplog.set_level(logging.DEBUG)
    body = (
        b'--abc\r\nContent-Disposition: form-data; name="file"\r\nX-\xc8: v\r\n\r\n'
        b"7,8\r\n--abc--\r\n"
    )
    headers = {**curator.headers, "Content-Type": "multipart/form-data; boundary=abc"}
    response = client.post("/v1/datasets", headers=headers, content=body)
    assert response.status_code == 422
    parser = [r for r in caplog.records if r.name.startswith("python_multipart")]
    assert parser, "the parser logged nothing: the test no longer exercises the filter"
    assert {r.getMessage() for r in parser} == {
        "malformed multipart body (the parser's detail is withheld)"
    }


def test_body_limit_by_content_length(client: TestClient, curator: Caller) -> None:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    too_big = services.settings.max_upload_bytes + (9 << 20)
    response = client.post(
        "/v1/datasets",
        headers={
            **curator.headers,
            "Content-Length": str(too_big),
            "Content-Type": "multipart/form-data; boundary=x",
        },
        content=b"",
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


def test_json_routes_have_their_own_limit_also_when_chunked(
    client: TestClient, curator: Caller, admin: Caller
) -> None:
    """Every route but the upload takes at most max_json_bytes, counted on Content-Length
    and on the bytes received (a chunked body declares no length)."""
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    limit = services.settings.max_json_bytes
    assert limit < services.settings.max_upload_bytes
    url = f"/v1/releases/{uuid.uuid4()}/answers"
    body = b'{"queries": [' + b"0," * limit + b"0]}"

    def chunks(data: bytes) -> Iterator[bytes]:
        for start in range(0, len(data), 65536):
            yield data[start : start + 65536]

    headers = {**curator.headers, "Content-Type": "application/json"}
    for content in (body, chunks(body)):
        response = client.post(url, headers=headers, content=content)
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] == "payload_too_large"
        assert "CURATOR_MAX_JSON_BYTES" in response.json()["error"]["message"]
    # a chunked body under the limit reaches its route whole
    small = json.dumps({"name": "chunked", "role": "analyst"}).encode()
    created = client.post(
        "/v1/users",
        headers={**admin.headers, "Content-Type": "application/json"},
        content=chunks(small),
    )
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "chunked"


def _large_body_refusal(
    headers: list[tuple[bytes, bytes]], accepts: bool, chunk: int = 65536, chunks: int = 1024
) -> tuple[list[str], list[Any], int]:
    """Run BodyLimit on a JSON route with a body of ``chunks`` chunks (64 MiB by default,
    within its limit): what the route saw, what was sent, and how many bytes were read."""
    seen: list[str] = []
    keys: list[str] = []
    read = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append("app")

    def authenticate(key: str) -> bool:
        keys.append(key)
        return accepts

    limit = BodyLimit(
        app, upload_limit=10, json_limit=chunk * chunks + 1, authenticate=authenticate
    )
    sent: list[Any] = []
    remaining = chunks

    async def receive() -> Any:
        nonlocal read, remaining
        remaining -= 1
        read += chunk
        return {"type": "http.request", "body": b" " * chunk, "more_body": remaining > 0}

    async def send(message: Any) -> None:
        sent.append(message)

    path = f"/v1/releases/{uuid.uuid4()}/answers"
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(limit(scope, receive, send))
    return seen + keys, sent, read


def test_a_large_json_body_is_read_only_from_a_caller_with_an_active_key() -> None:
    """FastAPI parses a JSON body before it checks the caller's key, and the limit is 64
    MiB: unauthenticated, such a body took 2 GB and blocked the event loop for 9 s before
    its 401. Beyond UNAUTHENTICATED_BODY_BYTES the key is checked first: by Content-Length
    before any byte is read, otherwise once that many bytes have arrived."""
    size = 64 * 65536
    declared = [(b"content-length", str(size).encode())]
    bearer = [(b"authorization", b"Bearer cur_secret")]
    for headers, reason in (
        (declared, "missing API key"),
        ([*declared, (b"authorization", b"Basic abc")], "missing API key"),
        ([*declared, *bearer], "invalid or revoked API key"),
        ([], "missing API key"),  # chunked: no Content-Length
        (bearer, "invalid or revoked API key"),
    ):
        seen, sent, read = _large_body_refusal(headers, accepts=False, chunks=64)
        assert "app" not in seen, headers
        assert sent[0]["status"] == 401
        assert (b"www-authenticate", b"Bearer") in sent[0]["headers"]
        body = json.loads(sent[1]["body"])
        assert body["error"]["code"] == "unauthorized"
        assert body["error"]["message"].startswith(reason)
        declared_length = any(name == b"content-length" for name, _ in headers)
        assert read <= (0 if declared_length else UNAUTHENTICATED_BODY_BYTES + 65536)
        assert seen == (
            ["cur_secret"] if (b"authorization", b"Bearer cur_secret") in headers else []
        )
    for headers in ([*declared, *bearer], bearer):
        seen, sent, read = _large_body_refusal(headers, accepts=True, chunks=64)
        assert seen == ["app", "cur_secret"]  # checked once
        assert read == size
        assert not sent
    # a small body is handed on unchecked: the route checks its key
    seen, sent, read = _large_body_refusal([], accepts=False, chunk=1000, chunks=3)
    assert seen == ["app"]
    assert not sent


def test_requests_with_large_bodies_are_handled_one_at_a_time() -> None:
    """Parsing a body of tens of MB takes about 30 times its size in memory: requests
    over LARGE_BODY_BYTES take turns (callers with keys sending many at once cannot
    multiply it); smaller ones run side by side."""

    def overlap(body_bytes: int) -> int:
        running = most = 0

        async def app(scope: Any, receive: Any, send: Any) -> None:
            nonlocal running, most
            while (await receive()).get("more_body"):
                pass
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.05)
            running -= 1

        limit = BodyLimit(app, upload_limit=10, json_limit=64 << 20, authenticate=lambda _key: True)

        async def one() -> None:
            async def receive() -> Any:
                return {"type": "http.request", "body": b" " * body_bytes, "more_body": False}

            async def send(message: Any) -> None:
                return None

            headers = [(b"authorization", b"Bearer k")]
            scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": headers}
            await limit(scope, receive, send)

        async def three() -> None:
            await asyncio.gather(one(), one(), one())

        asyncio.run(three())
        asyncio.run(three())  # another event loop: its own turn
        return most

    assert overlap(LARGE_BODY_BYTES + 1) == 1
    assert overlap(LARGE_BODY_BYTES) == 3


def test_a_large_body_without_an_active_key_is_refused_before_it_is_parsed(
    client: TestClient, curator: Caller
) -> None:
    """Through the app: over UNAUTHENTICATED_BODY_BYTES of invalid JSON is a 401 without
    a key or with a revoked one (the route would have parsed it first: 422), and reaches
    the route with an active key."""
    body = b"{" + b" " * UNAUTHENTICATED_BODY_BYTES
    url = f"/v1/releases/{uuid.uuid4()}/answers"
    json_type = {"Content-Type": "application/json"}
    assert client.post(url, headers=json_type, content=body[:1000]).status_code == 422
    refused = client.post(url, headers=json_type, content=body)
    assert refused.status_code == 401, refused.text
    assert (
        refused.json()["error"]["message"] == "missing API key: send 'Authorization: Bearer <key>'"
    )
    assert refused.headers["www-authenticate"] == "Bearer"
    headers = {**curator.headers, **json_type}
    assert client.post(url, headers=headers, content=body).status_code == 422
    me = client.get("/v1/users/me", headers=curator.headers).json()
    assert (
        client.delete(f"/v1/keys/{me['keys'][0]['id']}", headers=curator.headers).status_code == 204
    )
    revoked = client.post(url, headers=headers, content=body)
    assert revoked.status_code == 401
    assert revoked.json()["error"]["message"] == "invalid or revoked API key"


@pytest.mark.parametrize(
    ("method", "path", "upload"),
    [
        ("POST", "/v1/datasets", True),
        ("POST", "/v1/datasets/", True),
        ("POST", "/curator/v1/datasets", True),  # under a proxy's path prefix
        ("GET", "/v1/datasets", False),
        ("POST", "/v1/datasets/abc/releases", False),
        ("POST", "/v1/releases/abc/answers", False),
    ],
)
def test_body_limit_tells_the_upload_route(method: str, path: str, upload: bool) -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append("app")

    limit = BodyLimit(app, upload_limit=100, json_limit=10, authenticate=lambda _key: True)
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"x" * 50, "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": []}
    asyncio.run(limit(scope, receive, send))
    # 50 bytes: over the JSON limit, under the upload limit
    assert (seen == ["app"]) is upload
    assert (not sent) is upload


def test_openapi_documents_the_upload(client: TestClient, curator: Caller) -> None:
    """The ``schema`` part is JSON (encoding application/json) of a table's or a graph's
    declaration, published as their schemas: it was a plain string, so a generated client
    could neither build nor check one. The server reads the part as before, also when it
    comes with the content type the schema names (as a generated client sends it)."""
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/datasets"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert body["schema"]["required"] == ["file", "schema"]
    assert body["encoding"] == {"schema": {"contentType": "application/json"}}
    part = body["schema"]["properties"]["schema"]
    models = (DatasetDeclaration, GraphDeclaration)
    assert part["oneOf"] == [{"$ref": f"#/components/schemas/{m.__name__}"} for m in models]
    for model in models:
        published = spec["components"]["schemas"][model.__name__]
        assert set(published["properties"]) == set(model.model_fields), model
        for field in model.model_fields:
            assert field in part["description"], field
    table = json.loads((DATA / "wdbc.schema.json").read_text())
    graph = {"name": "g", "kind": "graph", "vertices": 4, "budget": {"epsilon": 1.0}}
    for declaration in (table, {**table, "kind": "table"}, graph):
        assert _schema_problems(declaration, part, spec) == [], declaration
    for wrong in ({**table, "vertices": 4}, {**graph, "kind": "table"}, {"name": "x"}):
        assert _schema_problems(wrong, part, spec), wrong

    files = {
        "file": ("data.csv", csv_bytes(), "application/octet-stream"),
        "schema": (None, json.dumps(SCHEMA).encode(), "application/json"),
    }
    sent = client.post("/v1/datasets", headers=curator.headers, files=files)
    assert sent.status_code == 201, sent.text


def test_openapi_shows_every_release_types_params(client: TestClient, curator: Caller) -> None:
    """``params`` of a release request and of a re-synthesis is published as every release
    type's own model (it was a bare object, so a generated client could neither build nor
    check one): the README's examples conform and a misspelled or ill-typed parameter
    does not; the server still validates it by the mechanism named, as before."""
    spec = client.get("/openapi.json").json()
    models = [registry.REGISTRY[name].Params for name in adapters.__all__]
    assert len({m.__name__ for m in models}) == len(models) == 5
    for body in (ReleaseCreate, ResynthesizeRequest):
        part = spec["components"]["schemas"][body.__name__]["properties"]["params"]
        assert part["anyOf"] == [{"$ref": f"#/components/schemas/{m.__name__}"} for m in models]
        for params in (
            {},
            {"method": "marginals"},
            {"smoothness": 16},
            {"delta_max": 0.5},
            {"grid_size": 2000},
        ):
            assert _schema_problems(params, part, spec) == [], params
        for wrong in ({"methd": "marginals"}, {"smoothness": "16"}, {"delta_max": [0.5]}):
            assert _schema_problems(wrong, part, spec), wrong
    for model in models:
        published = spec["components"]["schemas"][model.__name__]
        assert set(published["properties"]) == set(model.model_fields), model

    dataset = upload(client, curator, csv_bytes()).json()
    sent = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        headers=curator.headers,
        json={"mechanism": "smooth_synthetic", "epsilon": 1.0, "params": {"delta_max": 0.5}},
    )
    assert sent.status_code == 422, sent.text
    error = sent.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith("invalid parameters for smooth_synthetic")
    assert "delta_max" in error["message"]


def test_unhandled_errors_are_answered_and_logged_without_their_message(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Starlette re-raises an exception after its 500 handler, and the server would log it
    with its message; the error barrier answers and logs by type and frames only, and
    nothing escapes (TestClient re-raises anything that does)."""
    secret = "alice,52,s3cr3t-diagnosis"

    def boom() -> None:
        raise ValueError(f"could not parse {secret}") from KeyError(secret)

    client.app.add_api_route("/boom", boom)  # type: ignore[attr-defined]
    with caplog.at_level(logging.DEBUG):
        response = client.get("/boom")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert secret not in response.text
    assert "unhandled ValueError on GET /boom" in caplog.text
    assert secret not in caplog.text


def _sqlite_error(sql: str) -> sqlite3.Error:
    """The error SQLite raises for ``sql`` (run outside any transaction, in memory)."""
    connection = sqlite3.connect(":memory:")
    try:
        connection.execute(sql)
    except sqlite3.Error as exc:
        return exc
    finally:
        connection.close()
    raise AssertionError(f"{sql!r} ran")


def _sqlite_locked() -> sqlite3.Error:
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = 5  # type: ignore[attr-defined] # SQLITE_BUSY, as SQLite sets
    return locked


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (OperationalError("SELECT 1", {}, Exception("connection refused")), 503),
        (OperationalError("BEGIN IMMEDIATE", {}, _sqlite_locked()), 503),
        (
            OperationalError("SELECT 1", {}, psycopg.errors.AdminShutdown("terminating")),
            503,
        ),
        # the statement's errors, which sqlite3 and psycopg raise as OperationalError too:
        # bugs, never "try again later" without a traceback
        (OperationalError("SELECT nope", {}, _sqlite_error("SELECT nope")), 500),
        (OperationalError("COMMIT", {}, _sqlite_error("COMMIT")), 500),
        (
            OperationalError("SELECT", {}, psycopg.errors.ProgramLimitExceeded("too many")),
            500,
        ),
        (OSError(errno.ENOSPC, "No space left on device"), 503),
        (OSError(errno.EROFS, "Read-only file system"), 503),
        (OSError(errno.ENOENT, "No such file or directory"), 500),
    ],
)
def test_an_unreachable_database_or_a_full_disk_is_a_503(
    error: Exception, status: int, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A database that cannot be reached (restarted, failed over, a SQLite lock held past
    its busy timeout) or a data directory that is full or read-only was a 500 "internal
    error; this is a bug" with a traceback in the log: it is a 503 with Retry-After, and
    one warning line for the operator. Any other error is still a bug."""

    def fails() -> None:
        raise error

    client.app.add_api_route("/fails", fails)  # type: ignore[attr-defined]
    with caplog.at_level(logging.DEBUG):
        response = client.get("/fails")
    assert response.status_code == status
    if status == 503:
        assert response.json()["error"]["code"] == "service_unavailable"
        assert response.headers["retry-after"] == "30"
        assert "answered 503" in caplog.text
        assert "Traceback" not in caplog.text
    else:
        assert response.json()["error"]["code"] == "internal_error"


def test_responses_carry_nosniff_and_api_responses_no_store(
    client: TestClient, admin: Caller
) -> None:
    """Every response says nosniff; the API's (``/v1``, also under a proxy's prefix, its
    errors and the generic 500 included) say no-store, as a new key is in one; a response
    that sets its own Cache-Control keeps it (security audit)."""

    def boom() -> None:
        raise ValueError("x")

    def cached() -> Response:
        return Response("x", headers={"Cache-Control": "max-age=60"})

    client.app.add_api_route("/v1/boom", boom)  # type: ignore[attr-defined]
    client.app.add_api_route("/v1/cached", cached)  # type: ignore[attr-defined]
    created = client.post("/v1/users", headers=admin.headers, json={"name": "n", "role": "analyst"})
    assert created.status_code == 201
    assert "api_key" in created.json()
    responses = {
        "created": created,
        "me": client.get("/v1/users/me", headers=admin.headers),
        "401": client.get("/v1/users/me"),
        "404 under a prefix": client.get("/curator/v1/users/me"),
        "500": client.get("/v1/boom"),
    }
    for name, response in responses.items():
        assert response.headers["x-content-type-options"] == "nosniff", name
        assert response.headers["cache-control"] == "no-store", name
    for path in ("/healthz", "/docs", "/openapi.json", "/v1x"):
        response = client.get(path)
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert "no-store" not in response.headers.get("cache-control", ""), path
    own = client.get("/v1/cached")
    assert own.headers["cache-control"] == "max-age=60"
    assert own.headers["x-content-type-options"] == "nosniff"


def test_keys_and_sql_parameters_stay_out_of_messages(client: TestClient) -> None:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    assert services.data_key not in repr(services).encode()
    assert services.db.engine.hide_parameters
    source = EncryptedTableSource(Path("x.parquet"), services.data_key, ["a"], 1)
    assert services.data_key not in repr(source).encode()


def test_openapi_documents_the_error_bodies_sent(client: TestClient) -> None:
    """Every error is ``{"error": {"code", "message"}}``: FastAPI's own 422 body
    (``{"detail": [...]}``) is never sent, so the schema must not promise it."""
    spec = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in json.dumps(spec)
    envelope = spec["components"]["schemas"]["ErrorOut"]
    assert envelope["required"] == ["error"]
    paths = spec["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                # a download's 416 has no body (RFC 9110: Content-Range names the size)
                if status.startswith(("4", "5")) and path != "/readyz" and status != "416":
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (method, path)
    # a bad path parameter is a validation_error, an upload that does not match an
    # invalid_upload, and every body can be too large
    assert paths["/v1/datasets/{dataset_id}"]["get"]["responses"]["422"]["description"] == (
        "validation_error"
    )
    upload = paths["/v1/datasets"]["post"]["responses"]
    # (its Idempotency-Key header is a parameter, as every parameter may be a validation_error)
    assert upload["422"]["description"] == "invalid_request or invalid_upload or validation_error"
    assert upload["409"]["description"] == "idempotency_key_reused"
    release = paths["/v1/datasets/{dataset_id}/releases"]["post"]["responses"]
    assert release["422"]["description"] == (
        "invalid_request or storage_quota_exceeded or validation_error"
    )
    assert release["413"]["description"] == "payload_too_large"
    # a non-DP release without the opt-in, a second compressed one, a reused key: 409s
    assert release["409"]["description"] == (
        "budget_exhausted or conflict or idempotency_key_reused"
    )
    preview = paths["/v1/datasets/{dataset_id}/preview"]["post"]["responses"]
    assert preview["409"]["description"] == "conflict"


def test_openapi_declares_the_body_of_a_repeated_request(client: TestClient) -> None:
    """A grant that already existed and a release request or an upload replayed with its
    Idempotency-Key answer 200 with the same body as their 201 / 202: a client generated
    from the schema read a body-less 200 as no result (openapi-python-client: None)."""
    paths = client.get("/openapi.json").json()["paths"]
    for path, model, first in (
        ("/v1/datasets/{dataset_id}/grants", "GrantOut", "201"),
        ("/v1/datasets/{dataset_id}/releases", "ReleaseOut", "202"),
        ("/v1/datasets", "DatasetOut", "201"),
    ):
        responses = paths[path]["post"]["responses"]
        for status in (first, "200"):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": f"#/components/schemas/{model}"}, (path, status)


def test_openapi_declares_the_body_of_every_success_response(client: TestClient) -> None:
    """Every 2xx but a 204 declares what its body is. The downloads declared none (a
    FileResponse has no media type of its own): a generated client returned None instead
    of the file."""
    paths = client.get("/openapi.json").json()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith("2") and status != "204":
                    content = response.get("content")
                    assert content, (method, path, status)
                    assert all(media["schema"] for media in content.values()), (method, path)
    releases = "/v1/releases/{release_id}"
    served = {
        f"{releases}/synthetic": {"text/csv", "application/vnd.apache.parquet"},
        f"{releases}/synopsis": {"application/json"},
        f"{releases}/artifacts/{{name}}": {
            "text/csv",
            "application/vnd.apache.parquet",
            "application/json",
            "application/octet-stream",
        },
    }
    for path, media_types in served.items():
        assert set(paths[path]["get"]["responses"]["200"]["content"]) == media_types, path


def test_openapi_operation_ids_are_unique_function_names(client: TestClient) -> None:
    """Generated clients name their methods after the operationId: FastAPI's default made
    them ``create_release_v1_datasets__dataset_id__releases_post``."""
    paths = client.get("/openapi.json").json()["paths"]
    ids = [op["operationId"] for operations in paths.values() for op in operations.values()]
    assert len(ids) == len(set(ids)), sorted(ids)
    for operation_id in ids:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", operation_id), operation_id
        assert "_v1_" not in operation_id, operation_id
        assert not operation_id.endswith(("_get", "_post")), operation_id
    assert paths["/v1/datasets/{dataset_id}/releases"]["post"]["operationId"] == "create_release"
    assert paths["/v1/releases/{release_id}/answers"]["post"]["operationId"] == "answers"


def test_openapi_request_bodies_are_described_with_valid_examples(client: TestClient) -> None:
    """Each JSON body says what it is and shows examples (a generated client's docs and
    /docs' "Try it out" start from them); none had examples and four had no description.
    Every example is a valid body (each was also sent to a server by the API-consumer
    audit: the release examples preview and release, the answer examples answer 200)."""
    spec = client.get("/openapi.json").json()
    models = {
        model.__name__: model
        for model in (
            AnswerRequest,
            BudgetUpdate,
            DatasetUpdate,
            GrantCreate,
            ReleaseCreate,
            ResynthesizeRequest,
            UserCreate,
        )
    }
    bodies = set()
    for operations in spec["paths"].values():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                bodies.add(content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1])
    assert bodies == set(models)
    for name, model in models.items():
        schema = spec["components"]["schemas"][name]
        assert schema.get("description"), name
        assert schema.get("examples"), name
        for example in schema["examples"]:
            model.model_validate(example)
    mechanisms = {
        e["mechanism"] for e in spec["components"]["schemas"]["ReleaseCreate"]["examples"]
    }
    assert mechanisms == set(adapters.__all__)


def test_openapi_marks_every_field_a_response_sends_as_required(client: TestClient) -> None:
    """Responses send every field of their model, also those with a default (a dataset's
    warnings and validation, a preview's warnings, the report's clipped): a schema that
    made them optional had generated clients type them as possibly unset."""
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    pending = [
        response["content"]["application/json"]["schema"]
        for operations in spec["paths"].values()
        for operation in operations.values()
        for status, response in operation["responses"].items()
        if status.startswith("2") and "application/json" in response.get("content", {})
    ]
    seen: set[str] = set()
    while pending:
        text = json.dumps(pending.pop())
        for name in re.findall(r'"#/components/schemas/([^"]+)"', text):
            if name not in seen:
                seen.add(name)
                pending.append(schemas[name])
    assert {"DatasetOut", "PreviewOut", "ValidationReport", "ReleaseOut"} <= seen
    for name in seen:
        properties = set(schemas[name].get("properties", {}))
        assert properties <= set(schemas[name].get("required", [])), name


def test_openapi_names_every_mechanism_and_its_query_forms(client: TestClient) -> None:
    """The mechanisms are an enum a generated client can offer (a bare string before),
    and described; so are the query forms of each."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    mechanism = schemas["ReleaseCreate"]["properties"]["mechanism"]
    assert sorted(mechanism["enum"]) == sorted(adapters.__all__)
    mechanisms = mechanism["description"]
    forms = schemas["AnswerRequest"]["properties"]["queries"]["description"]
    for name in adapters.__all__:  # the service's release types (tests register others)
        assert name in mechanisms, name
        assert f"{name}:" in forms or f"{name} and" in forms, name


def _without_request_id(response: Any) -> dict[str, Any]:
    """The error of ``response`` but its ``request_id``, which must be the response's
    ``X-Request-ID``."""
    error: dict[str, Any] = response.json()["error"]
    assert error.pop("request_id") == response.headers["x-request-id"]
    return error


def _schema_problems(value: Any, schema: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """Where ``value`` breaks the JSON schema ``schema`` of ``spec`` (the keywords the
    service's schemas use: $ref, type, const, enum, properties, required,
    additionalProperties, items, min/maxItems, minProperties, minimum, exclusiveMinimum,
    maximum, anyOf, oneOf with a discriminator); [] if it conforms. Unknown keywords are
    ignored, as validators do."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        return _schema_problems(value, spec["components"]["schemas"][name], spec)
    if "oneOf" in schema:
        mapping = schema.get("discriminator", {}).get("mapping")
        if mapping is not None:
            tag = value.get(schema["discriminator"]["propertyName"])
            if tag not in mapping:
                return [f"{tag!r} is not in the discriminator's mapping"]
            return _schema_problems(value, {"$ref": mapping[tag]}, spec)
        fits = [s for s in schema["oneOf"] if not _schema_problems(value, s, spec)]
        return [] if len(fits) == 1 else [f"{len(fits)} of oneOf match"]
    if "anyOf" in schema:
        fits = any(not _schema_problems(value, s, spec) for s in schema["anyOf"])
        return [] if fits else ["no anyOf matches"]
    kinds = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "null": type(None),
    }
    kind = schema.get("type")
    if kind is not None and (
        not isinstance(value, kinds[kind]) or (isinstance(value, bool) and kind != "boolean")
    ):
        return [f"{value!r} is not of type {kind}"]
    if "const" in schema and value != schema["const"]:
        return [f"{value!r} is not {schema['const']!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{value!r} is not one of {schema['enum']}"]
    bounds = (
        ("minimum", lambda v, b: v >= b),
        ("exclusiveMinimum", lambda v, b: v > b),
        ("maximum", lambda v, b: v <= b),
        ("minItems", lambda v, b: len(v) >= b),
        ("maxItems", lambda v, b: len(v) <= b),
        ("minProperties", lambda v, b: len(v) >= b),
    )
    problems = [
        f"{value!r} breaks {key}"
        for key, holds in bounds
        if key in schema and not holds(value, schema[key])
    ]
    if isinstance(value, list):
        for item in value:
            problems += _schema_problems(item, schema.get("items", {}), spec)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        problems += [f"{key} is missing" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            extra = schema.get("additionalProperties", True)
            if key in properties:
                problems += _schema_problems(item, properties[key], spec)
            elif extra is False:
                problems.append(f"{key} is not a property")
            elif isinstance(extra, dict):
                problems += _schema_problems(item, extra, spec)
    return problems


def _query_forms() -> dict[str, list[str]]:
    """Each query form of the service's release types (by model name) and the release
    types that accept it, from the registry."""
    accepted: dict[str, list[str]] = {}
    for name in adapters.__all__:
        for form in registry.REGISTRY[name].query_forms:
            accepted.setdefault(form.__name__, []).append(name)
    return accepted


def test_two_release_types_cannot_publish_different_forms_under_one_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client tells the query forms apart by ``type`` alone: a release type whose form
    reuses another's name with another shape fails when the union is built (import)."""
    from typing import Literal

    from pydantic import BaseModel

    from app.answers import schemas as answer_schemas
    from app.releases import registry

    class OtherPCA(BaseModel):
        type: Literal["pca"]
        components: int

    monkeypatch.setattr(registry.REGISTRY["graph_cuts"], "query_forms", (OtherPCA,))
    with pytest.raises(TypeError, match="two query forms are named 'pca'"):
        answer_schemas._published_forms()


def test_openapi_publishes_every_query_form(client: TestClient) -> None:
    """The answers body's queries are a oneOf of every release type's query forms with a
    ``type`` discriminator (they were untyped objects: a generated client could not build
    one); each form says which release types accept it, and shows examples that conform
    to the published schema."""
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    items = schemas["AnswerRequest"]["properties"]["queries"]["items"]
    mapping = items["discriminator"]["mapping"]
    assert items["discriminator"]["propertyName"] == "type"
    assert sorted(item["$ref"] for item in items["oneOf"]) == sorted(mapping.values())
    accepted = _query_forms()
    assert sorted(ref.rsplit("/", 1)[1] for ref in mapping.values()) == sorted(accepted)
    assert all(registry.REGISTRY[name].query_forms for name in adapters.__all__)
    for tag, ref in mapping.items():
        name = ref.removeprefix("#/components/schemas/")
        form = schemas[name]
        assert form["properties"]["type"]["const"] == tag, name
        assert "type" in form["required"], name
        described = form["description"].replace("\n", " ")
        says = re.search(r"Accepted by (.*?) releases", described)
        assert says is not None, name
        assert sorted(re.findall(r"``(\w+)``", says.group(1))) == sorted(accepted[name]), name
        assert form["examples"], name
        for example in form["examples"]:
            assert example["type"] == tag, name
            assert _schema_problems(example, items, spec) == [], (name, example)
            assert _schema_problems({**example, "other": 1}, items, spec), name
            assert _schema_problems({**example, "type": "nope"}, items, spec), name
    for example in schemas["AnswerRequest"]["examples"]:
        assert _schema_problems(example, {"$ref": "#/components/schemas/AnswerRequest"}, spec) == []


def test_openapi_types_each_answer(client: TestClient) -> None:
    """An answer is an ``Answer`` (it was an untyped object): the four fields every
    release type sends are typed and required (value a number or, for compressed's pca,
    an object), and the release type's own fields are kept as additional properties."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    items = schemas["AnswersOut"]["properties"]["answers"]["items"]
    assert items == {"$ref": "#/components/schemas/Answer"}
    answer = schemas["Answer"]
    assert answer["required"] == ["value", "stderr", "interval", "note"]
    assert answer["additionalProperties"] is True
    value = {kind["type"] for kind in answer["properties"]["value"]["anyOf"]}
    assert value == {"number", "object"}
    for name in ("error_bound", "guarantee", "estimator", "worst_case_interval"):
        assert name in answer["description"], name


def test_openapi_bounds_are_json_schema_keywords(client: TestClient) -> None:
    """A bounded integer's bounds are ``minimum`` and ``maximum``: pydantic wrote those of
    ``Annotated[Integer, Field(ge=..., le=...)]`` as ``ge`` and ``le``, which JSON Schema
    readers ignore (a query term's powers, a graph's vertex count)."""
    spec = client.get("/openapi.json").json()
    pending: list[Any] = [spec["components"]]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if "type" in node:
                assert not {"ge", "le", "gt", "lt"} & set(node), node
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    schemas = spec["components"]["schemas"]
    powers = schemas["Term"]["properties"]["powers"]["additionalProperties"]
    assert (powers["minimum"], powers["maximum"]) == (0, 30)
    vertices = schemas["GraphDeclaration"]["properties"]["vertices"]
    assert (vertices["minimum"], vertices["maximum"]) == (2, 20_000)


@pytest.mark.parametrize(
    ("vertices", "power", "taken"),
    [
        ("4", "4", 4),
        ("4.0", "4.0", 4),
        ("4.5", "4.5", None),
        ('"4"', '"4"', None),
        ("true", "true", None),
        ("1.0", "31.0", None),  # out of bounds
    ],
)
def test_bounded_integers_take_integral_json_floats_and_nothing_else(
    vertices: str, power: str, taken: int | None
) -> None:
    """The bounds moved into ``Field(ge, le)`` with ``integral_number`` as a validator of
    its own: a graph's vertex count and a term's power still take ``4.0`` as 4 (JSON
    does not tell them apart) and refuse ``4.5``, text, booleans and values out of bounds,
    in JSON mode."""
    from pydantic import ValidationError

    from app.datasets.schemas import GraphDeclaration
    from app.releases.adapters.smooth_queries import Term

    graph = f'{{"name": "g", "kind": "graph", "vertices": {vertices}, "budget": {{"epsilon": 1}}}}'
    term = f'{{"coefficient": 1, "powers": {{"x": {power}}}}}'
    for parse in (
        lambda: GraphDeclaration.model_validate_json(graph).vertices,
        lambda: Term.model_validate_json(term).powers["x"],
    ):
        if taken is None:
            with pytest.raises(ValidationError):
                parse()
        else:
            assert parse() == taken


def _release_of_every_type(client: TestClient, curator: Caller) -> dict[str, str]:
    """A finished release of each of the service's release types, on data the published
    query examples are written for (the demo's ``mean_radius``, ``mean_texture`` and
    ``diagnosis``, a public ``clinic``; a graph of 6 vertices): release type -> id."""
    rng = np.random.default_rng(3)
    rows = [
        f"{rng.uniform(5, 25):.2f},{rng.uniform(10, 35):.2f},{rng.choice(['B', 'M'])},"
        f"{rng.choice(['north', 'south'])}"
        for _ in range(600)
    ]
    schema = {
        "name": "wdbc-like",
        "columns": [
            {"name": "mean_radius", "kind": "continuous", "lower": 0, "upper": 30},
            {"name": "mean_texture", "kind": "continuous", "lower": 0, "upper": 40},
            {"name": "diagnosis", "kind": "categorical", "categories": ["B", "M"]},
            {"name": "clinic", "kind": "public"},
        ],
        "budget": {"epsilon": 10, "delta": 1e-6},
        "allow_non_dp_releases": True,
    }
    content = "\n".join(["mean_radius,mean_texture,diagnosis,clinic", *rows]) + "\n"
    table = upload(client, curator, content.encode(), schema)
    assert table.status_code == 201, table.text
    graph = upload_graph(
        client,
        curator,
        b"0 1\n1 2\n2 3\n3 0\n",
        {"name": "g", "kind": "graph", "vertices": 6, "budget": {"epsilon": 5}},
    )
    assert graph.status_code == 201, graph.text
    two = ["mean_radius", "mean_texture"]
    requests = {
        "smooth_synthetic": {"epsilon": 1.0, "columns": two, "params": {"method": "marginals"}},
        "smooth_synopsis": {"epsilon": 1.0, "columns": two},
        "randomized_response": {"epsilon": 1.0, "columns": ["diagnosis", "clinic"]},
        "compressed": {"columns": two, "params": {"delta_max": 0.5}},
        "graph_cuts": {"epsilon": 1.0},
    }
    assert sorted(requests) == sorted(adapters.__all__)  # a new release type: add it here
    releases = {}
    for mechanism, body in requests.items():
        dataset_id = (graph if mechanism == "graph_cuts" else table).json()["id"]
        created = request_release(client, curator, dataset_id, {"mechanism": mechanism, **body})
        assert created.status_code == 202, created.text
        releases[mechanism] = created.json()["id"]
        run_all(client, releases[mechanism])
    return releases


def test_every_published_query_example_is_answered_where_accepted(
    client: TestClient, curator: Caller
) -> None:
    """Each query form's published examples are answered (200) by a release of every type
    that accepts the form, and refused by the others as before the forms were published:
    the body is still validated per release type (a 422 invalid_request naming the
    release type's own forms), also for an unknown type or a query that is no object.
    Every answer conforms to the published ``Answer``."""
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    releases = _release_of_every_type(client, curator)
    accepted = _query_forms()
    tags = {  # each release type's forms, in the order its refusal lists them
        name: [
            get_args(f.model_fields["type"].annotation)[0]
            for f in registry.REGISTRY[name].query_forms
        ]
        for name in releases
    }

    def answers(release: str, queries: list[Any]) -> Any:
        url = f"/v1/releases/{releases[release]}/answers"
        return client.post(url, headers=curator.headers, json={"queries": queries})

    def refusal(release: str, tag: str) -> str:
        expected = ", ".join(f"'{t}'" for t in tags[release])
        return (
            f"invalid queries: queries.0: Input tag '{tag}' found using 'type' does not match "
            f"any of the expected tags: {expected}"
        )

    answers_out = {"$ref": "#/components/schemas/AnswersOut"}
    mapping = schemas["AnswerRequest"]["properties"]["queries"]["items"]["discriminator"]
    for tag, ref in mapping["mapping"].items():
        name = ref.rsplit("/", 1)[1]
        for example in schemas[name]["examples"]:
            for release in releases:
                response = answers(release, [example])
                if release in accepted[name]:
                    assert response.status_code == 200, (release, example, response.text)
                    body = response.json()
                    assert _schema_problems(body, answers_out, spec) == [], (release, body)
                else:
                    assert response.status_code == 422, (release, example)
                    error = response.json()["error"]
                    assert error.pop("request_id") == response.headers["x-request-id"]
                    assert error == {"code": "invalid_request", "message": refusal(release, tag)}
    for release in releases:
        assert answers(release, [{"type": "nope"}]).json()["error"]["message"] == refusal(
            release, "nope"
        )
        assert _without_request_id(answers(release, [{}])) == {
            "code": "invalid_request",
            "message": "invalid queries: queries.0: Unable to extract tag using discriminator "
            "'type'",
        }
        assert _without_request_id(answers(release, [3])) == {
            "code": "validation_error",
            "message": "queries.0: Input should be a valid dictionary",
        }


def test_large_responses_are_gzipped_for_clients_that_accept_it(
    client: TestClient, curator: Caller
) -> None:
    """Answers repeat their mechanism's note (~900 bytes each): 10^4 of them were 9 MB on
    the wire. Compressed for a client that accepts gzip; never a small response (an API
    key), an already compressed artifact (Parquet, .npz) or a partial (206) download."""
    from tests.releases.helpers import dataset
    from tests.releases.test_hostile_inputs import _smooth_release

    release_id = _smooth_release(client, curator, dataset(client, curator, epsilon=5.0))
    query = {"type": "gaussian_mixture", "centers": [[30, 60]], "weights": [1], "sigma": 5}
    url = f"/v1/releases/{release_id}"
    sent = {}
    for encoding in ("gzip", "identity"):
        response = client.post(
            f"{url}/answers",
            headers={**curator.headers, "Accept-Encoding": encoding},
            json={"queries": [query] * 1000},
        )
        assert response.status_code == 200, response.text
        assert len(response.json()["answers"]) == 1000
        sent[encoding] = response.num_bytes_downloaded
        assert response.headers.get("content-encoding") == ("gzip" if encoding == "gzip" else None)
    assert sent["gzip"] * 50 < sent["identity"], sent
    gzip = {**curator.headers, "Accept-Encoding": "gzip"}
    for name, compressed in (("support.csv", True), ("support.parquet", False)):
        download = client.get(f"{url}/artifacts/{name}", headers=gzip)
        assert download.status_code == 200
        assert (download.headers.get("content-encoding") == "gzip") is compressed, name
    part = client.get(f"{url}/artifacts/support.csv", headers={**gzip, "Range": "bytes=0-99"})
    assert (part.status_code, len(part.content)) == (206, 100)
    assert "content-encoding" not in part.headers
    me = client.get("/v1/users/me", headers=gzip)
    assert me.status_code == 200
    assert "content-encoding" not in me.headers


def test_binary_artifacts_are_never_gzipped(client: TestClient) -> None:
    """Parquet and ``.npz`` artifacts are already compressed: served as stored at any size
    (the test release's ``.npz`` is under the 4 KB threshold, so this uses routes of its
    own, with a text response of the same size as the control that is compressed)."""
    from fastapi import Response

    body = bytes(range(256)) * 64  # 16 KB, above GZIP_MINIMUM_BYTES
    for media_type in ("application/octet-stream", "application/vnd.apache.parquet", "text/csv"):
        client.app.add_api_route(  # type: ignore[attr-defined]
            f"/gzip-probe/{media_type}",
            lambda media_type=media_type: Response(body, media_type=media_type),
        )
    for media_type, compressed in (
        ("application/octet-stream", False),
        ("application/vnd.apache.parquet", False),
        ("text/csv", True),
    ):
        response = client.get(f"/gzip-probe/{media_type}", headers={"Accept-Encoding": "gzip"})
        assert response.status_code == 200, media_type
        assert response.content == body
        assert (response.headers.get("content-encoding") == "gzip") is compressed, media_type
