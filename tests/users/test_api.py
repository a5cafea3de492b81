"""Users, API keys and roles."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.answers.endpoints import router as answers_router
from app.core import deps
from app.core.deps import ServicesDep
from app.core.security import hash_api_key
from app.core.services import Services
from app.datasets.endpoints import router as datasets_router
from app.models import ApiKey, AuditEvent, User
from app.releases.endpoints import router as releases_router
from app.users import service as users
from app.users.endpoints import router as users_router
from tests.conftest import Caller
from tests.datasets.helpers import csv_bytes, upload


def test_admin_creates_users_and_the_key_works_once_shown(
    client: TestClient, admin: Caller
) -> None:
    response = client.post(
        "/v1/users", headers=admin.headers, json={"name": "carol", "role": "curator"}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["role"] == "curator"
    key = body["api_key"]
    assert key.startswith("cur_")
    assert len(key) >= 4 + 43
    me = client.get("/v1/users/me", headers={"Authorization": f"Bearer {key}"})
    assert me.status_code == 200
    assert me.json()["id"] == body["id"]
    assert me.json()["keys"][0]["prefix"] == key[:12]
    assert "api_key" not in me.json()["keys"][0]


def test_keys_are_stored_only_as_hashes(client: TestClient, admin: Caller) -> None:
    key = client.post(
        "/v1/users", headers=admin.headers, json={"name": "a", "role": "analyst"}
    ).json()["api_key"]
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    with services.db.transaction() as session:
        rows = session.scalars(select(ApiKey)).all()
        assert all(row.key_hash != key and key not in row.key_hash for row in rows)
        assert hash_api_key(key) in {row.key_hash for row in rows}


def test_missing_wrong_and_malformed_keys_are_401(client: TestClient) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer cur_nope"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer "},
    ):
        response = client.get("/v1/users/me", headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["code"] == "unauthorized"
        assert response.headers["www-authenticate"] == "Bearer"


def test_revoked_key_is_401(client: TestClient, admin: Caller, curator: Caller) -> None:
    me = client.get("/v1/users/me", headers=curator.headers).json()
    key_id = me["keys"][0]["id"]
    assert client.delete(f"/v1/keys/{key_id}", headers=curator.headers).status_code == 204
    response = client.get("/v1/users/me", headers=curator.headers)
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "invalid or revoked API key"


def test_admin_rotates_and_revokes_keys(client: TestClient, admin: Caller, analyst: Caller) -> None:
    new = client.post(f"/v1/users/{analyst.id}/keys", headers=admin.headers)
    assert new.status_code == 201
    new_headers = {"Authorization": f"Bearer {new.json()['api_key']}"}
    old_key_id = next(
        k
        for k in client.get("/v1/users/me", headers=new_headers).json()["keys"]
        if k["id"] != new.json()["key_id"]
    )["id"]
    assert client.delete(f"/v1/keys/{old_key_id}", headers=admin.headers).status_code == 204
    assert client.get("/v1/users/me", headers=analyst.headers).status_code == 401
    assert client.get("/v1/users/me", headers=new_headers).status_code == 200


def test_users_cannot_revoke_other_users_keys(
    client: TestClient, curator: Caller, analyst: Caller
) -> None:
    key_id = client.get("/v1/users/me", headers=analyst.headers).json()["keys"][0]["id"]
    assert client.delete(f"/v1/keys/{key_id}", headers=curator.headers).status_code == 404
    assert client.get("/v1/users/me", headers=analyst.headers).status_code == 200


def test_only_admins_manage_users(client: TestClient, curator: Caller, analyst: Caller) -> None:
    for caller in (curator, analyst):
        response = client.post(
            "/v1/users", headers=caller.headers, json={"name": "x", "role": "admin"}
        )
        assert response.status_code == 403
        assert client.get("/v1/users", headers=caller.headers).status_code == 403
        assert client.get("/v1/audit", headers=caller.headers).status_code == 403


def test_bad_user_payloads_are_422(client: TestClient, admin: Caller) -> None:
    for payload in (
        {"name": "x", "role": "root"},
        {"name": "", "role": "admin"},
        {"role": "admin"},
        {"name": "x", "role": "admin", "extra": 1},
    ):
        response = client.post("/v1/users", headers=admin.headers, json=payload)
        assert response.status_code == 422, payload
        assert response.json()["error"]["code"] == "validation_error"


def test_state_changes_are_audited(client: TestClient, admin: Caller) -> None:
    created = client.post(
        "/v1/users", headers=admin.headers, json={"name": "z", "role": "analyst"}
    ).json()
    client.delete(f"/v1/keys/{created['key_id']}", headers=admin.headers)
    events = client.get("/v1/audit", headers=admin.headers).json()
    actions = [(e["action"], e["object_id"]) for e in events]
    assert ("user.create", created["id"]) in actions
    assert ("api_key.revoke", created["key_id"]) in actions
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    with services.db.transaction() as session:
        texts = [str(e.details) for e in session.scalars(select(AuditEvent))]
        assert all(created["api_key"] not in t for t in texts)


def test_a_write_on_a_key_revoked_after_authentication_commits_nothing(
    client: TestClient, admin: Caller, curator: Caller
) -> None:
    """A request is authenticated in a transaction of its own; its write may then wait for
    the database's write lock (up to 30 s on SQLite) while the key is revoked. The write
    transaction checks the key again: a budget PATCH (here revoked in between) is a 401 and
    changes nothing. A curator revoking the very key they use still can."""
    dataset_id = upload(client, curator, csv_bytes()).json()["id"]
    spare = client.post(f"/v1/users/{curator.id}/keys", headers=admin.headers).json()
    spare_headers = {"Authorization": f"Bearer {spare['api_key']}"}
    app: FastAPI = client.app  # type: ignore[assignment]

    def revoked_after_authentication(
        request: Request,
        services: ServicesDep,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(deps._bearer)],
    ) -> User:
        user = deps.current_user(request, services, credentials)
        with services.db.transaction() as session:
            users.revoke_key(session, request.state.api_key_id, user)
        return user

    app.dependency_overrides[deps.current_user] = revoked_after_authentication
    try:
        response = client.patch(
            f"/v1/datasets/{dataset_id}/budget", headers=curator.headers, json={"epsilon": 4}
        )
    finally:
        app.dependency_overrides.clear()
    assert response.status_code == 401, response.text
    budget = client.get(f"/v1/datasets/{dataset_id}/budget", headers=spare_headers).json()
    assert budget["epsilon_total"] == 1.0
    own = client.delete(f"/v1/keys/{spare['key_id']}", headers=spare_headers)
    assert own.status_code == 204


def test_every_route_authenticates_before_it_opens_its_transaction() -> None:
    """FastAPI resolves a route's dependencies in the order of its parameters: the write
    transaction's key check (``get_session``) needs the user resolved before it."""

    def authenticates(dependant: Dependant) -> bool:
        return dependant.call is deps.current_user or any(
            authenticates(sub) for sub in dependant.dependencies
        )

    checked = 0
    routers = (answers_router, datasets_router, releases_router, users_router)
    for route in (route for router in routers for route in router.routes):
        assert isinstance(route, APIRoute)
        calls = route.dependant.dependencies
        sessions = [i for i, d in enumerate(calls) if d.call is deps.get_session]
        users_ = [i for i, d in enumerate(calls) if authenticates(d)]
        if sessions and users_:  # the upload and answers open their own
            assert users_[0] < sessions[0], route.path
            checked += 1
    assert checked >= 15
