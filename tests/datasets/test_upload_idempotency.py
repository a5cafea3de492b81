"""POST /v1/datasets with an Idempotency-Key: a retried upload returns its dataset (one
dataset, one budget), the key with another upload is 409, racing copies record one; the
file's fingerprint is keyed; an upload of a file already uploaded is warned about."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.services import Services
from app.datasets import service
from app.datasets.upload import MAX_CONCURRENT_UPLOAD_CHECKS, fingerprint_keys
from app.models import AuditEvent, Dataset
from tests.conftest import Caller, make_user
from tests.datasets.helpers import SCHEMA, csv_bytes, upload

GRAPH: dict[str, Any] = {
    "name": "friends",
    "kind": "graph",
    "vertices": 6,
    "budget": {"epsilon": 2},
}
EDGES = b"0 1\n1 2\n5 4\n"


def _services(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def _datasets(client: TestClient) -> list[Dataset]:
    with _services(client).db.transaction(read_only=True) as session:
        rows = list(session.query(Dataset).order_by(Dataset.created_at))
        session.expunge_all()
    return rows


def _creations(client: TestClient) -> int:
    with _services(client).db.transaction(read_only=True) as session:
        return session.query(AuditEvent).filter(AuditEvent.action == "dataset.create").count()


def _stored_files(client: TestClient) -> tuple[list[str], list[str]]:
    settings = _services(client).settings
    return (
        sorted(p.name for p in settings.datasets_dir.iterdir()),
        sorted(p.name for p in settings.tmp_dir.iterdir()),
    )


def test_a_retried_upload_with_its_key_returns_its_dataset(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = upload(client, curator, csv_bytes(), key="upload-1")
    assert first.status_code == 201, first.text
    files = _stored_files(client)
    stores: list[int] = []
    store = service.store_dataset
    monkeypatch.setattr(service, "store_dataset", lambda *a: stores.append(1) or store(*a))
    again = upload(client, curator, csv_bytes(), key="upload-1")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["budget"] == first.json()["budget"]
    assert stores == []  # a retry is not validated nor stored again
    # nothing stored twice, the retry's spool removed
    assert _stored_files(client) == files
    assert _stored_files(client)[1] == []
    assert _creations(client) == 1
    listed = client.get("/v1/datasets", headers=curator.headers).json()
    assert [d["id"] for d in listed] == [first.json()["id"]]
    budget = client.get(f"/v1/datasets/{first.json()['id']}/budget", headers=curator.headers)
    assert budget.status_code == 200
    assert budget.json()["epsilon_total"] == SCHEMA["budget"]["epsilon"]


def test_a_retried_graph_upload_with_its_key_returns_its_dataset(
    client: TestClient, curator: Caller
) -> None:
    def send() -> Any:
        return client.post(
            "/v1/datasets",
            headers={**curator.headers, "Idempotency-Key": "graph-1"},
            files={"file": ("edges.txt", EDGES, "text/plain")},
            data={"schema": json.dumps(GRAPH)},
        )

    first, again = send(), send()
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json()["id"] == first.json()["id"]
    assert len(_datasets(client)) == 1
    assert _creations(client) == 1


def test_the_key_with_another_upload_is_409(client: TestClient, curator: Caller) -> None:
    first = upload(client, curator, csv_bytes(), key="upload-1")
    assert first.status_code == 201, first.text
    files = _stored_files(client)
    other_rows = csv_bytes(rows=["20,60,AB,true"])
    other_budget = {**SCHEMA, "budget": {"epsilon": 2.0, "delta": 1e-6}}
    for content, schema in ((other_rows, None), (csv_bytes(), other_budget)):
        refused = upload(client, curator, content, schema, key="upload-1")
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "idempotency_key_reused"
    # a file that differs by one byte at its end is another file
    refused = upload(client, curator, csv_bytes() + b"\n", key="upload-1")
    assert refused.status_code == 409, refused.text
    assert _stored_files(client) == files
    assert len(_datasets(client)) == 1
    # another key is another upload
    assert upload(client, curator, other_rows, key="upload-2").status_code == 201


def test_keys_are_the_callers_own(client: TestClient, curator: Caller) -> None:
    other = make_user(client, "curator")
    first = upload(client, curator, csv_bytes(), key="shared")
    theirs = upload(client, other, csv_bytes(), key="shared")
    assert (first.status_code, theirs.status_code) == (201, 201)
    assert theirs.json()["id"] != first.json()["id"]


@pytest.mark.parametrize("key", ["", "k" * 201])
def test_a_key_of_the_wrong_length_is_refused(
    client: TestClient, curator: Caller, key: str
) -> None:
    refused = upload(client, curator, csv_bytes(), key=key)
    assert refused.status_code == 422, refused.text
    assert "Idempotency-Key" in refused.json()["error"]["message"]
    assert _datasets(client) == []
    assert upload(client, curator, csv_bytes(), key="k" * 200).status_code == 201


def test_racing_copies_of_an_upload_record_one_dataset(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies that all pass the check for an earlier dataset before any records one (held
    in the store step until every copy is there) resolve to one dataset: the first to
    record creates it (201), the others return it (200) and leave no file behind."""
    copies = MAX_CONCURRENT_UPLOAD_CHECKS
    barrier = threading.Barrier(copies, timeout=60)
    store = service.store_dataset

    def held(*args: Any) -> service.StoredDataset:
        barrier.wait()
        return store(*args)

    monkeypatch.setattr(service, "store_dataset", held)
    results: list[tuple[int, str]] = []

    def attempt() -> None:
        response = upload(client, curator, csv_bytes(), key="same")
        results.append((response.status_code, response.json().get("id", response.text)))

    threads = [threading.Thread(target=attempt) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(code for code, _ in results) == [200] * (copies - 1) + [201], results
    assert len({dataset_id for _, dataset_id in results}) == 1
    datasets = _datasets(client)
    assert [str(d.id) for d in datasets] == [results[0][1]]
    assert _stored_files(client) == ([datasets[0].storage_name], [])
    assert _creations(client) == 1


def test_the_fingerprint_is_keyed_not_a_plain_hash(client: TestClient, curator: Caller) -> None:
    content = csv_bytes()
    created = upload(client, curator, content)
    assert created.status_code == 201, created.text
    (dataset,) = _datasets(client)
    assert dataset.fingerprint is not None
    assert dataset.fingerprint != hashlib.sha256(content).hexdigest()
    key = fingerprint_keys(_services(client).data_key)[0]
    assert dataset.fingerprint == hmac.new(key, content, hashlib.sha256).hexdigest()
    assert dataset.idempotency_key is None
    assert dataset.request_hash is None


def test_a_retry_after_a_data_key_rotation_still_finds_its_dataset(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fingerprint is checked under every key of the ring: a retry after the data key
    was rotated (the old key kept as a previous one) is still a retry, not a 409."""
    from cryptography.fernet import Fernet

    from app.storage.tables import key_ring

    first = upload(client, curator, csv_bytes(), key="upload-1")
    assert first.status_code == 201, first.text
    services = _services(client)
    monkeypatch.setattr(services, "data_key", key_ring(Fernet.generate_key(), [services.data_key]))
    again = upload(client, curator, csv_bytes(), key="upload-1")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]


def test_an_upload_of_a_file_already_uploaded_is_warned_about(
    client: TestClient, curator: Caller
) -> None:
    """Advice only (not refused): the new dataset's warnings name the curator's earlier
    dataset of the same file, whose budget is separate; not once its data are deleted,
    nor another curator's."""
    first = upload(client, curator, csv_bytes())
    assert first.status_code == 201, first.text
    assert not any("separate budgets" in w for w in first.json()["warnings"])
    second = upload(client, curator, csv_bytes(), {**SCHEMA, "name": "again"})
    assert second.status_code == 201, second.text
    (warning,) = [w for w in second.json()["warnings"] if "separate budgets" in w]
    assert first.json()["id"] in warning
    other = make_user(client, "curator")
    theirs = upload(client, other, csv_bytes())
    assert not any("separate budgets" in w for w in theirs.json()["warnings"])
    for dataset_id in (first.json()["id"], second.json()["id"]):
        deleted = client.delete(f"/v1/datasets/{dataset_id}/data", headers=curator.headers)
        assert deleted.status_code == 200, deleted.text
    third = upload(client, curator, csv_bytes())
    assert not any("separate budgets" in w for w in third.json()["warnings"])
    assert uuid.UUID(third.json()["id"])


def test_a_retry_after_a_field_was_added_to_the_declaration_is_still_a_retry(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The declaration's hash covers the fields the upload set: an upgrade that adds a
    field with a default (here a subclass of the table declaration) leaves a retry of the
    same upload a retry, not a 409; a field the retry sets differently is still a 409."""
    from app.datasets.schemas import DatasetDeclaration

    first = upload(client, curator, csv_bytes(), key="upload-1")
    assert first.status_code == 201, first.text

    class Later(DatasetDeclaration):
        added_since: bool = False

    monkeypatch.setattr(service, "DatasetDeclaration", Later)
    again = upload(client, curator, csv_bytes(), key="upload-1")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    other = upload(
        client, curator, csv_bytes(), {**SCHEMA, "out_of_bounds": "reject"}, key="upload-1"
    )
    assert other.status_code == 409, other.text


def test_deleting_the_data_forgets_the_fingerprint_and_a_retry_still_replays(
    client: TestClient, curator: Caller
) -> None:
    """With the data deleted (crypto-shredding), the file's keyed fingerprint would still
    confirm a guessed file to whoever holds the database and the data key: it is forgotten
    with the file. A retry with the key and the declaration then still finds its dataset."""
    first = upload(client, curator, csv_bytes(), key="upload-1")
    assert first.status_code == 201, first.text
    dataset_id = first.json()["id"]
    deleted = client.delete(f"/v1/datasets/{dataset_id}/data", headers=curator.headers)
    assert deleted.status_code == 200, deleted.text
    (dataset,) = _datasets(client)
    assert dataset.fingerprint is None
    again = upload(client, curator, csv_bytes(), key="upload-1")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == dataset_id
    other = upload(client, curator, csv_bytes(), {**SCHEMA, "name": "other"}, key="upload-1")
    assert other.status_code == 409, other.text


def test_a_retry_whose_key_is_revoked_while_it_streams_gets_no_dataset(
    client: TestClient, curator: Caller
) -> None:
    """The replay checks the API key again, as the recording does: a key revoked while a
    retry's file streamed gets 401, not the dataset (nor its id and parameters)."""
    from tests.datasets.test_upload import revoke_key

    assert upload(client, curator, csv_bytes(), key="upload-1").status_code == 201
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="schema"\r\n\r\n'
        f"{json.dumps(SCHEMA)}\r\n"
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.csv"\r\n\r\n'
    ).encode()

    def chunks() -> Any:
        yield head
        revoke_key(client, curator)
        yield csv_bytes() + f"\r\n--{boundary}--\r\n".encode()

    response = client.post(
        "/v1/datasets",
        headers={
            **curator.headers,
            "Idempotency-Key": "upload-1",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        },
        content=chunks(),
    )
    assert response.status_code == 401, response.text
    assert "patients" not in response.text
    assert len(_datasets(client)) == 1
