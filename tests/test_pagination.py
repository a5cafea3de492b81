"""Keyset pagination of every list endpoint (``app.core.pagination``).

The world: two curators, five analysts, the first curator's five datasets (the first with
seven releases, two of them run, and five grants; two more granted to one analyst), the
other curator's dataset with one release. Every list is walked page by page through its
``Link: <...>; rel="next"`` header, with a limit that does not divide the list and one
that does: each item comes once, in the list's order, every page but the last is full,
and only the last has no ``Link``. Limits and cursors are validated, and a cursor outside
the caller's own list (unknown, another dataset's, hidden, revoked since) is one and the
same 422.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.core import pagination
from app.core.services import Services
from app.models import Dataset, Grant, Release, User
from tests.conftest import Caller, make_user
from tests.datasets.helpers import SCHEMA, csv_bytes, upload
from tests.releases.helpers import request_release, run_all

MISSING = "00000000-0000-4000-8000-000000000000"
Items = Callable[[Any], list[dict[str, Any]]]


def _whole(body: Any) -> list[dict[str, Any]]:
    return list(body)


def _entries(body: Any) -> list[dict[str, Any]]:
    return list(body["entries"])


@dataclass
class World:
    client: TestClient
    admin: Caller
    owner: Caller
    other: Caller
    analysts: list[Caller]
    datasets: list[str]  # the owner's, in creation order
    foreign: str  # the other curator's
    releases: list[str]  # of datasets[0], in creation order
    foreign_release: str


def _dataset(client: TestClient, curator: Caller, name: str) -> str:
    schema = {**SCHEMA, "name": name, "budget": {"epsilon": 10.0, "delta": 1e-6}}
    response = upload(client, curator, csv_bytes(), schema)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _grant(client: TestClient, curator: Caller, dataset_id: str, analyst: Caller) -> None:
    response = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    assert response.status_code == 201, response.text


def _release(client: TestClient, curator: Caller, dataset_id: str) -> str:
    response = request_release(client, curator, dataset_id)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


@pytest.fixture
def world(client: TestClient) -> World:
    admin, owner, other = (make_user(client, role) for role in ("admin", "curator", "curator"))
    analysts = [make_user(client, "analyst") for _ in range(5)]
    datasets = [_dataset(client, owner, f"paged-{i}") for i in range(5)]
    foreign = _dataset(client, other, "foreign")
    for analyst in analysts:
        _grant(client, owner, datasets[0], analyst)
    for dataset_id in (datasets[1], datasets[3]):
        _grant(client, owner, dataset_id, analysts[0])
    _grant(client, other, foreign, analysts[1])
    releases = [_release(client, owner, datasets[0]) for _ in range(7)]
    for release_id in releases[:2]:
        run_all(client, release_id)  # a commit each: 9 ledger entries
    foreign_release = _release(client, other, foreign)
    return World(
        client, admin, owner, other, analysts, datasets, foreign, releases, foreign_release
    )


def _cursor(link: str) -> dict[str, list[str]]:
    """The query of a ``<url>; rel="next"`` header's URL."""
    assert link.startswith("<"), link
    assert link.endswith('>; rel="next"'), link
    return parse_qs(urlsplit(link[1 : link.index(">")]).query)


def walk(
    client: TestClient, caller: Caller, url: str, limit: int, items: Items = _whole
) -> list[list[dict[str, Any]]]:
    """Every page of ``url`` from the first, following ``Link`` until a page has none."""
    pages: list[list[dict[str, Any]]] = []
    next_url: str | None = f"{url}{'&' if '?' in url else '?'}limit={limit}"
    while next_url is not None:
        assert len(pages) < 50, "the pages do not end"
        response = client.get(next_url, headers=caller.headers)
        assert response.status_code == 200, (next_url, response.text)
        pages.append(items(response.json()))
        link = response.headers.get("link")
        next_url = None
        if link is not None:
            assert _cursor(link)["limit"] == [str(limit)]  # the limit is kept
            next_url = response.links["next"]["url"]
    return pages


def assert_paged(
    world: World,
    caller: Caller,
    url: str,
    expected: list[str],
    limit: int,
    key: str = "id",
    items: Items = _whole,
) -> None:
    """Walking ``url`` by ``limit`` gives ``expected`` once each, in order, in full pages
    but the last, which is the only one without a ``Link``; and one call with no
    parameters still gives the whole (small) list."""
    pages = walk(world.client, caller, url, limit, items)
    assert [item[key] for page in pages for item in page] == expected, url
    assert [len(page) for page in pages[:-1]] == [limit] * (len(pages) - 1), url
    assert 1 <= len(pages[-1]) <= limit, url
    assert len(pages) == max(1, -(-len(expected) // limit)), url
    whole = world.client.get(url, headers=caller.headers)
    assert [item[key] for item in items(whole.json())] == expected
    assert "link" not in whole.headers


def test_every_list_pages_each_item_once_in_order(world: World) -> None:
    owner, d0 = world.owner, world.datasets[0]
    users = [
        world.admin.id,
        owner.id,
        world.other.id,
        *(a.id for a in world.analysts),
    ]
    for limit in (3, 4, 8):  # 8 users: limits that divide the list and one that does not
        assert_paged(world, world.admin, "/v1/users", [str(u) for u in users], limit)
    for limit in (1, 2, 5):
        assert_paged(world, owner, "/v1/datasets", world.datasets, limit)
        assert_paged(world, owner, f"/v1/datasets/{d0}/releases", world.releases, limit)
        grantees = [str(a.id) for a in world.analysts]
        assert_paged(world, owner, f"/v1/datasets/{d0}/grants", grantees, limit, key="user_id")
    assert_paged(world, owner, f"/v1/datasets/{d0}/releases", world.releases, 7)

    # the ledger in the order it was written: every page's totals cover every entry
    full = world.client.get(f"/v1/datasets/{d0}/budget?limit=1000", headers=owner.headers)
    entries = full.json()["entries"]
    assert [e["kind"] for e in entries] == ["reserve"] * 7 + ["commit"] * 2
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids)
    totals = {k: v for k, v in full.json().items() if k != "entries"}
    assert totals["epsilon_spent"] == pytest.approx(0.4)
    assert totals["epsilon_reserved"] == pytest.approx(1.0)
    for limit in (2, 3, 9):
        url = f"/v1/datasets/{d0}/budget"
        assert_paged(world, owner, url, ids, limit, items=_entries)
        response = world.client.get(f"{url}?limit={limit}", headers=owner.headers)
        while True:  # the totals are the same on every page
            assert {k: v for k, v in response.json().items() if k != "entries"} == totals
            if "next" not in response.links:
                break
            response = world.client.get(response.links["next"]["url"], headers=owner.headers)

    # the audit log, newest first
    events = world.client.get("/v1/audit?limit=1000", headers=world.admin.headers).json()
    event_ids = [e["id"] for e in events]
    assert event_ids == sorted(event_ids, reverse=True)
    assert len(event_ids) > 10
    for limit in (3, len(event_ids)):
        pages = walk(world.client, world.admin, "/v1/audit", limit)
        assert [e["id"] for page in pages for e in page] == event_ids
        assert all(len(page) == limit for page in pages[:-1])
        assert len(pages) == -(-len(event_ids) // limit)


def test_links_name_the_last_item_and_keep_other_parameters(world: World) -> None:
    client, owner = world.client, world.owner
    response = client.get("/v1/datasets?limit=2", headers=owner.headers)
    assert _cursor(response.headers["link"]) == {
        "limit": ["2"],
        "after_id": [world.datasets[1]],
    }
    assert response.links["next"]["url"].startswith("http://testserver/v1/datasets?")
    page = client.get(f"/v1/datasets?limit=2&after_id={world.datasets[1]}", headers=owner.headers)
    assert [d["id"] for d in page.json()] == world.datasets[2:4]
    audit = client.get("/v1/audit?limit=2", headers=world.admin.headers)
    last = audit.json()[-1]["id"]
    assert _cursor(audit.headers["link"]) == {"limit": ["2"], "before_id": [str(last)]}
    # no Link once the page holds the rest, also when it is exactly full
    for limit in (5, 6, 100):
        assert (
            "link" not in client.get(f"/v1/datasets?limit={limit}", headers=owner.headers).headers
        )
    d0 = world.datasets[0]
    last_page = client.get(
        f"/v1/datasets/{d0}/releases?after_id={world.releases[-1]}", headers=owner.headers
    )
    assert (last_page.status_code, last_page.json()) == (200, [])
    assert "link" not in last_page.headers


def _lists(world: World) -> list[tuple[Caller, str]]:
    d0 = world.datasets[0]
    return [
        (world.admin, "/v1/users"),
        (world.owner, "/v1/datasets"),
        (world.owner, f"/v1/datasets/{d0}/releases"),
        (world.owner, f"/v1/datasets/{d0}/grants"),
        (world.owner, f"/v1/datasets/{d0}/budget"),
        (world.admin, "/v1/audit"),
    ]


def test_limits_and_cursors_are_validated(world: World) -> None:
    client = world.client
    for caller, url in _lists(world):
        for limit in ("0", "-1", "1001", "2.5", "ten", ""):
            response = client.get(f"{url}?limit={limit}", headers=caller.headers)
            assert response.status_code == 422, (url, limit, response.text)
            error = response.json()["error"]
            assert error["code"] == "validation_error", error
            assert "limit" in error["message"], error
        for limit in ("1", "1000"):
            response = client.get(f"{url}?limit={limit}", headers=caller.headers)
            assert response.status_code == 200, (url, limit, response.text)
        cursor = "before_id" if url == "/v1/audit" else "after_id"
        integral = url.endswith(("/budget", "/audit"))
        malformed = ["x", "1.5", "-1", "0", "9223372036854775808"] if integral else ["x", "12"]
        for value in malformed:
            response = client.get(f"{url}?{cursor}={value}", headers=caller.headers)
            assert response.status_code == 422, (url, value, response.text)
            error = response.json()["error"]
            assert error["code"] == "validation_error", error
            assert cursor in error["message"], error
        if not integral:  # an id that is not in the list: one clear 422
            response = client.get(f"{url}?after_id={MISSING}", headers=caller.headers)
            assert response.status_code == 422, (url, response.text)
            assert response.json()["error"] == {
                "request_id": response.headers["x-request-id"],
                "code": "invalid_request",
                "message": f"after_id {MISSING} is not an item of this list (an id from an "
                "earlier page of this very list, whose item is still in it); list again "
                "from the start",
            }


def _refusal(world: World, caller: Caller, url: str, after_id: str) -> tuple[int, Any]:
    """The response to ``after_id``, its id replaced by the unknown one's, to compare it
    with the response for an id that does not exist (under the same X-Request-ID, which
    the error body quotes)."""
    headers = {**caller.headers, "X-Request-ID": "refusal"}
    response = world.client.get(f"{url}?limit=1&after_id={after_id}", headers=headers)
    return response.status_code, response.text.replace(after_id, MISSING)


def test_pages_show_only_what_the_caller_may_see(world: World) -> None:
    client, owner, other = world.client, world.owner, world.other
    d0, d1, d2, d3, d4 = world.datasets
    reader = world.analysts[0]  # granted d0, d1, d3
    for limit in (1, 2):
        assert_paged(world, reader, "/v1/datasets", [d0, d1, d3], limit)
        assert_paged(world, reader, f"/v1/datasets/{d0}/releases", world.releases, limit)
    assert_paged(world, world.analysts[1], "/v1/datasets", [d0, world.foreign], 1)
    assert_paged(world, other, "/v1/datasets", [world.foreign], 1)
    admin_datasets = client.get("/v1/datasets?limit=1", headers=world.admin.headers)
    assert (admin_datasets.json(), "link" in admin_datasets.headers) == ([], False)

    # a cursor outside the caller's list is the answer for an id that does not exist
    unknown = _refusal(world, reader, "/v1/datasets", MISSING)
    assert unknown[0] == 422
    for hidden in (d2, d4, world.foreign):  # the owner's ungranted ones, another's
        assert _refusal(world, reader, "/v1/datasets", hidden) == unknown
    assert _refusal(world, other, "/v1/datasets", d0) == unknown
    assert _refusal(world, owner, "/v1/datasets", world.foreign) == unknown
    releases = f"/v1/datasets/{d0}/releases"
    for caller in (owner, reader):
        assert _refusal(world, caller, releases, world.foreign_release) == unknown
        assert _refusal(world, caller, releases, d0) == unknown  # a dataset id is no release
    grants = f"/v1/datasets/{d0}/grants"
    assert _refusal(world, owner, grants, str(world.analysts[0].id)) != unknown  # in the list
    assert _refusal(world, owner, grants, str(owner.id)) == unknown
    assert _refusal(world, owner, f"/v1/datasets/{d1}/grants", str(world.analysts[1].id)) == (
        unknown
    )
    users = "/v1/users"
    assert _refusal(world, world.admin, users, d0) == unknown

    # pages of a list the caller may not read are refused as the list itself is
    not_granted = world.analysts[2]
    hidden_releases = f"/v1/datasets/{d1}/releases"
    # (under one X-Request-ID, which the error bodies quote)
    not_granted_headers = {**not_granted.headers, "X-Request-ID": "hidden"}
    missing = client.get(f"/v1/datasets/{MISSING}/releases", headers=not_granted_headers)
    assert missing.status_code == 404
    for query in ("", f"?limit=1&after_id={world.releases[0]}", "?limit=1"):
        response = client.get(hidden_releases + query, headers=not_granted_headers)
        assert (response.status_code, response.json()) == (404, missing.json())
        response = client.get(f"/v1/datasets/{d0}/grants{query}", headers=reader.headers)
        assert response.status_code == 403
        response = client.get(f"/v1/datasets/{d0}/grants{query}", headers=other.headers)
        assert response.status_code == 404
        budget = query.replace(world.releases[0], "1")  # its cursor is an entry's id
        response = client.get(f"/v1/datasets/{d2}/budget{budget}", headers=reader.headers)
        assert response.status_code == 404
        for caller in (owner, reader):
            response = client.get(f"/v1/users{query}", headers=caller.headers)
            assert response.status_code == 403
            response = client.get(f"/v1/audit{query}", headers=caller.headers)
            assert response.status_code == 403

    # a grant revoked mid-walk: its dataset is no cursor of the analyst's list any more
    first = client.get("/v1/datasets?limit=1", headers=reader.headers)
    assert [d["id"] for d in first.json()] == [d0]
    revoked = client.delete(f"/v1/datasets/{d0}/grants/{reader.id}", headers=owner.headers)
    assert revoked.status_code == 204
    after = client.get(first.links["next"]["url"], headers=reader.headers)
    assert (after.status_code, after.json()["error"]["code"]) == (422, "invalid_request")
    assert_paged(world, reader, "/v1/datasets", [d1, d3], 1)
    # and a revoked grant is no cursor of the curator's grant list
    page = client.get(f"/v1/datasets/{d0}/grants?limit=1", headers=owner.headers)
    assert [g["user_id"] for g in page.json()] == [str(world.analysts[1].id)]
    gone = client.get(f"{grants}?after_id={reader.id}", headers=owner.headers)
    assert (gone.status_code, gone.json()["error"]["code"]) == (422, "invalid_request")


def test_items_created_at_the_same_instant_are_paged_by_id(world: World) -> None:
    """Ties on ``created_at`` are broken by the id, in the order and in the cursor: every
    user, dataset, release and grant of the world is given one and the same
    ``created_at``, and each list still pages every item once, in id order, whatever the
    limit (a cursor on ``created_at`` alone would skip the rest of a tie; an order on it
    alone would leave the tie's order to the database)."""
    services: Services = world.client.app.state.services  # type: ignore[attr-defined]
    with services.db.transaction() as session:
        instant = session.scalars(select(User.created_at).limit(1)).one()
        for model in (User, Dataset, Release, Grant):
            session.execute(update(model).values(created_at=instant))
    owner, reader, d0 = world.owner, world.analysts[0], world.datasets[0]
    users = [world.admin.id, owner.id, world.other.id, *(a.id for a in world.analysts)]

    def by_id(ids: list[Any]) -> list[str]:
        return [str(i) for i in sorted(uuid.UUID(str(i)) for i in ids)]

    for limit in (1, 2, 3):
        assert_paged(world, world.admin, "/v1/users", by_id(users), limit)
        assert_paged(world, owner, "/v1/datasets", by_id(world.datasets), limit)
        granted = [d0, world.datasets[1], world.datasets[3]]
        assert_paged(world, reader, "/v1/datasets", by_id(granted), limit)
        url = f"/v1/datasets/{d0}/releases"
        assert_paged(world, owner, url, by_id(world.releases), limit)
        grantees = by_id([a.id for a in world.analysts])
        assert_paged(world, owner, f"/v1/datasets/{d0}/grants", grantees, limit, key="user_id")


def test_lists_of_declared_json_end_a_page_at_its_weight(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Datasets and releases carry declared JSON (columns, parameters) of up to about a
    MiB each: their pages also end once the items weigh ``MAX_PAGE_BYTES`` (at least one
    item a page), and a walk by ``Link`` still gives every item once, in order. Without
    it a page of 1000 datasets declared with 1 MiB each took about 10 GB of the API."""
    owner, d0 = world.owner, world.datasets[0]
    # every item weighs more than this: one item a page, whatever the limit
    monkeypatch.setattr(pagination, "MAX_PAGE_BYTES", 1)
    for url, expected in (
        ("/v1/datasets", world.datasets),
        (f"/v1/datasets/{d0}/releases", world.releases),
    ):
        pages = walk(world.client, owner, url, 1000)
        assert [item["id"] for page in pages for item in page] == expected, url
        assert [len(page) for page in pages] == [1] * len(expected), url
    # three datasets' weight: a page ends with the item that reaches it
    with world.client.app.state.services.db.transaction() as session:  # type: ignore[attr-defined]
        first = session.get(Dataset, uuid.UUID(world.datasets[0]))
        assert first is not None
        weight = pagination.json_size(first.columns)
    monkeypatch.setattr(pagination, "MAX_PAGE_BYTES", 3 * weight)
    pages = walk(world.client, owner, "/v1/datasets", 1000)
    assert [len(page) for page in pages] == [3, 2]
    # lists of small items are not weighed: users, grants
    grants = walk(world.client, owner, f"/v1/datasets/{d0}/grants", 1000)
    assert [len(page) for page in grants] == [len(world.analysts)]
