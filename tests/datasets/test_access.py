"""Who sees which dataset: curators their own, analysts what they are granted, nobody else."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy import select

from app.models import AuditEvent
from tests.conftest import Caller, make_user
from tests.datasets.helpers import csv_bytes, upload


def _dataset(client: TestClient, curator: Caller) -> str:
    response = upload(client, curator, csv_bytes())
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_analyst_without_grant_gets_404_everywhere(
    client: TestClient, curator: Caller, analyst: Caller
) -> None:
    dataset_id = _dataset(client, curator)
    for path in (f"/v1/datasets/{dataset_id}", f"/v1/datasets/{dataset_id}/budget"):
        response = client.get(path, headers=analyst.headers)
        assert response.status_code == 404, path
        assert response.json() == {
            "error": {
                "code": "not_found",
                "message": "dataset not found",
                "request_id": response.headers["x-request-id"],
            }
        }
    # indistinguishable from a dataset that does not exist (under one X-Request-ID)
    headers = {**analyst.headers, "X-Request-ID": "access"}
    missing = client.get(f"/v1/datasets/{uuid.uuid4()}", headers=headers)
    assert missing.json() == client.get(f"/v1/datasets/{dataset_id}", headers=headers).json()
    assert client.get("/v1/datasets", headers=analyst.headers).json() == []
    assert (
        client.post(
            f"/v1/datasets/{dataset_id}/grants",
            headers=analyst.headers,
            json={"user_id": str(analyst.id)},
        ).status_code
        == 404
    )


def test_other_curators_and_admins_see_nothing(
    client: TestClient, curator: Caller, admin: Caller
) -> None:
    dataset_id = _dataset(client, curator)
    other = make_user(client, "curator")
    for caller in (other, admin):
        assert client.get(f"/v1/datasets/{dataset_id}", headers=caller.headers).status_code == 404
        assert (
            client.get(f"/v1/datasets/{dataset_id}/budget", headers=caller.headers).status_code
            == 404
        )
        assert (
            client.patch(
                f"/v1/datasets/{dataset_id}/budget", headers=caller.headers, json={"epsilon": 9}
            ).status_code
            == 404
        )
        assert client.get("/v1/datasets", headers=caller.headers).json() == []


def test_grant_gives_read_access_and_revoke_takes_it_back(
    client: TestClient, curator: Caller, analyst: Caller
) -> None:
    dataset_id = _dataset(client, curator)
    granted = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    assert granted.status_code == 201
    again = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    assert again.status_code == 200
    seen = client.get(f"/v1/datasets/{dataset_id}", headers=analyst.headers)
    assert seen.status_code == 200
    assert seen.json()["validation"] is None  # clip counts are the curator's only
    later = client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json()
    assert later["validation"]["format"] == "csv"
    assert later["validation"]["clipped"] is None  # exact counts: in the upload response only
    assert (
        client.get(f"/v1/datasets/{dataset_id}/budget", headers=analyst.headers).status_code == 200
    )
    assert [d["id"] for d in client.get("/v1/datasets", headers=analyst.headers).json()] == [
        dataset_id
    ]
    listed = client.get(f"/v1/datasets/{dataset_id}/grants", headers=curator.headers).json()
    assert [g["user_id"] for g in listed] == [str(analyst.id)]
    # a granted analyst may look, not act
    assert (
        client.post(
            f"/v1/datasets/{dataset_id}/grants",
            headers=analyst.headers,
            json={"user_id": str(analyst.id)},
        ).status_code
        == 403
    )
    assert (
        client.patch(
            f"/v1/datasets/{dataset_id}/budget", headers=analyst.headers, json={"epsilon": 9}
        ).status_code
        == 403
    )
    assert (
        client.delete(
            f"/v1/datasets/{dataset_id}/grants/{analyst.id}", headers=curator.headers
        ).status_code
        == 204
    )
    assert client.get(f"/v1/datasets/{dataset_id}", headers=analyst.headers).status_code == 404
    assert (
        client.delete(
            f"/v1/datasets/{dataset_id}/grants/{analyst.id}", headers=curator.headers
        ).status_code
        == 404
    )


def test_grants_go_to_existing_analysts_only(
    client: TestClient, curator: Caller, admin: Caller
) -> None:
    """A curator learns nothing of other users from a refused grant: an id that is nobody's,
    another curator's and an admin's get the same answer (the message named the role)."""
    dataset_id = _dataset(client, curator)
    other_curator = make_user(client, "curator")
    messages = set()
    for user_id in (uuid.uuid4(), other_curator.id, admin.id):
        response = client.post(
            f"/v1/datasets/{dataset_id}/grants",
            headers=curator.headers,
            json={"user_id": str(user_id)},
        )
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "invalid_request"
        messages.add(response.json()["error"]["message"].replace(str(user_id), "ID"))
    assert messages == {"no analyst has the id ID; grants go to analysts only"}


def test_curator_lists_own_datasets(client: TestClient, curator: Caller) -> None:
    first, second = _dataset(client, curator), _dataset(client, curator)
    make_user(client, "curator")
    listed = client.get("/v1/datasets", headers=curator.headers).json()
    assert [d["id"] for d in listed] == [first, second]
    assert all(d["n_rows"] == 4 for d in listed)


def test_the_dataset_list_reads_the_ledger_once_a_page(client: TestClient, curator: Caller) -> None:
    """Each dataset's budget on a list page comes from one grouped query (the scale audit:
    one query per dataset, 1.1 s for a page of 1000), with the sums a single read gives."""
    from sqlalchemy import event

    from app.ledger import service as ledger
    from app.ledger.units import delta_units, epsilon_units
    from app.models import Release
    from tests.releases.helpers import services_of

    ids = [_dataset(client, curator) for _ in range(3)]
    services = services_of(client)
    with services.db.transaction() as session:  # spend on the second, hold on the third
        releases = [
            Release(
                dataset_id=uuid.UUID(i),
                mechanism="test",
                epsilon=0,
                delta=0,
                params={},
                created_by=curator.id,
            )
            for i in ids[1:]
        ]
        session.add_all(releases)
        session.flush()
        spent, held = releases
        worker = ledger.Actor.worker()
        eps, dlt = epsilon_units(0.25, charge=True), delta_units(1e-7, charge=True)
        ledger.reserve(session, spent.dataset_id, spent.id, eps, dlt, worker)
        ledger.commit(session, spent.id, worker)
        ledger.reserve(session, held.dataset_id, held.id, eps, 0, worker)
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(services.db.engine, "before_cursor_execute", count)
    try:
        listed = client.get("/v1/datasets", headers=curator.headers).json()
    finally:
        event.remove(services.db.engine, "before_cursor_execute", count)
    assert sum("ledger_entries" in statement for statement in statements) == 1, statements
    budgets = [d["budget"] for d in listed]
    assert budgets == [
        client.get(f"/v1/datasets/{i}", headers=curator.headers).json()["budget"] for i in ids
    ]
    assert [(b["epsilon_spent"], b["delta_spent"]) for b in budgets] == [
        (0.0, 0.0),
        (0.25, 1e-7),
        (0.0, 0.0),
    ]
    assert [b["epsilon_reserved"] for b in budgets] == [0.0, 0.0, 0.25]


def _race(attempts: int, request: Callable[[], int]) -> list[int]:
    barrier = threading.Barrier(attempts)
    codes: list[int] = []
    lock = threading.Lock()

    def attempt() -> None:
        barrier.wait()
        code = request()
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=attempt) for _ in range(attempts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return sorted(codes)


def test_concurrent_grant_changes_are_serialised(
    client: TestClient, curator: Caller, analyst: Caller
) -> None:
    """Eight identical grants at once: one creates (201), the rest find it (200), none is a
    500 from the primary key; eight revokes at once: one removes it (204), the rest 404, and
    the audit trail records one of each change."""
    dataset_id = _dataset(client, curator)
    grants = f"/v1/datasets/{dataset_id}/grants"
    for _ in range(3):
        created = _race(
            8,
            lambda: (
                client.post(
                    grants, headers=curator.headers, json={"user_id": str(analyst.id)}
                ).status_code
            ),
        )
        assert created == [200] * 7 + [201], created
        revoked = _race(
            8,
            lambda: client.delete(f"{grants}/{analyst.id}", headers=curator.headers).status_code,
        )
        assert revoked == [204] + [404] * 7, revoked
    services = client.app.state.services  # type: ignore[attr-defined]
    with services.db.transaction(read_only=True) as session:
        actions = session.scalars(
            select(AuditEvent.action).where(AuditEvent.action.startswith("grant."))
        ).all()
    assert sorted(actions) == ["grant.create"] * 3 + ["grant.delete"] * 3
