"""Answer requests compute at most ``MAX_CONCURRENT_ANSWERS`` at once per process
(``app.answers.service.answer_slots``), on threads of their own: on the request threadpool,
100 at once held its 40 threads and every other request of every user waited behind them
(``GET /v1/releases/{id}`` 26 s at the 95th percentile;
``bench/results/answer_concurrency.md``)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.answers import service
from app.core.threads import REQUEST_THREADS
from tests.conftest import Caller, make_user
from tests.releases.helpers import REQUEST, dataset, finished_release, hold_answers, wait_for


def test_answers_past_the_threadpool_leave_other_requests_served(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    release_id = finished_release(client, curator, dataset(client, curator), REQUEST)["id"]
    go_on = hold_answers(monkeypatch)
    # one user asks them all: they compute as many at once as one user's may
    limit = service.MAX_ANSWERS_PER_USER
    asking = REQUEST_THREADS + limit  # more than the request threadpool's threads
    codes: list[int] = []

    def ask() -> None:
        url = f"/v1/releases/{release_id}/answers"
        body = {"queries": [{"type": "pca", "k": 1}]}
        codes.append(client.post(url, headers=curator.headers, json=body).status_code)

    def statistics() -> Any:
        return client.portal.call(service.answer_slots.usage)  # type: ignore[attr-defined]

    threads = [threading.Thread(target=ask) for _ in range(asking)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: statistics() == (limit, asking - limit),
            f"{limit} answers computing and {asking - limit} waiting",
        )
        # the rest of the API is served meanwhile (it waited for a thread before)
        started = time.monotonic()
        shown = client.get(f"/v1/releases/{release_id}", headers=curator.headers)
        assert shown.status_code == 200
        assert time.monotonic() - started < 30
    finally:
        go_on.set()
        for thread in threads:
            thread.join(timeout=120)
    # test_means answers no pca query: each request got the mechanism's own answer
    assert codes == [422] * asking


def test_a_client_that_leaves_while_waiting_for_a_slot_is_not_computed_for(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that waits for a slot and whose client disconnects meanwhile never runs
    the answer: it ran once a slot was free, holding it for nobody while others waited
    (a client that gives up and retries asked for the same work twice)."""
    release_id = finished_release(client, curator, dataset(client, curator), REQUEST)["id"]
    # one slot, so that one held request makes the next wait (the limiter is made on
    # first use, after this)
    monkeypatch.setattr(service.answer_slots, "total", 1)
    go_on = threading.Event()
    computed: list[int] = []
    real_answer = service.answer

    def held(*args: Any, **kwargs: Any) -> Any:
        computed.append(1)
        assert go_on.wait(timeout=120)
        return real_answer(*args, **kwargs)

    monkeypatch.setattr(service, "answer", held)
    url = f"/v1/releases/{release_id}/answers"
    body = json.dumps({"queries": [{"type": "pca", "k": 1}]}).encode()
    portal = client.portal  # type: ignore[attr-defined]
    codes: list[int] = []
    first = threading.Thread(
        target=lambda: codes.append(
            client.post(url, headers=curator.headers, json=json.loads(body)).status_code
        )
    )
    first.start()
    wait_for(lambda: len(computed) == 1, "the first request computing")

    left = portal.call(anyio.Event)
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(k.lower().encode(), v.encode()) for k, v in curator.headers.items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": url,
        "raw_path": url.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [*headers, (b"content-type", b"application/json")],
        "client": ("testclient", 50000),
        "server": ("testserver", 80),
    }
    second = portal.start_task_soon(client.app, scope, receive, send)
    try:
        wait_for(
            lambda: (
                portal.call(lambda: service.answer_slots.limiter().statistics()).tasks_waiting == 1
            ),
            "the second request waiting for the slot",
        )
        portal.call(left.set)
    finally:
        go_on.set()
        first.join(timeout=120)
        second.result(timeout=120)
    assert codes == [422]  # test_means answers no pca query
    assert computed == [1]  # the second request's client left before a slot was free
    assert not [m for m in sent if m["type"] == "http.response.start"]


def test_one_users_answers_leave_slots_to_other_users(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One user's requests hold at most ``MAX_ANSWERS_PER_USER`` of the slots: with all of
    them, one user's requests at the work bound (12 s each) kept every other user's
    requests waiting for the whole of theirs."""
    other = make_user(client, "curator", "other")
    mine = finished_release(client, curator, dataset(client, curator), REQUEST)["id"]
    theirs = finished_release(client, other, dataset(client, other), REQUEST)["id"]
    go_on = threading.Event()
    computing: list[uuid.UUID] = []
    real_answer = service.answer

    def held(services: Any, user: Any, *args: Any) -> Any:
        computing.append(user.id)
        assert go_on.wait(timeout=120)
        return real_answer(services, user, *args)

    monkeypatch.setattr(service, "answer", held)
    codes: list[int] = []

    def ask(caller: Caller, release_id: str) -> None:
        url = f"/v1/releases/{release_id}/answers"
        body = {"queries": [{"type": "pca", "k": 1}]}
        codes.append(client.post(url, headers=caller.headers, json=body).status_code)

    threads = [
        threading.Thread(target=ask, args=(curator, mine))
        for _ in range(service.MAX_CONCURRENT_ANSWERS)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: len(computing) == service.MAX_ANSWERS_PER_USER,
            "the first user's answers computing",
        )
        threads.append(threading.Thread(target=ask, args=(other, theirs)))
        threads[-1].start()
        wait_for(lambda: len(computing) > service.MAX_ANSWERS_PER_USER, "another answer computing")
        # the other user's, not a third of the first user's
        assert len(set(computing)) == 2
        assert len(computing) == service.MAX_ANSWERS_PER_USER + 1
    finally:
        go_on.set()
        for thread in threads:
            thread.join(timeout=120)
    assert codes == [422] * (service.MAX_CONCURRENT_ANSWERS + 1)
    assert len(computing) == service.MAX_CONCURRENT_ANSWERS + 1
    # no caller's limiter is kept once its requests are answered
    assert client.portal.call(service.answer_slots._callers.get) == {}  # type: ignore[attr-defined]
