"""Answer requests compute at most ``MAX_CONCURRENT_ANSWERS`` at once per process
(``app.answers.service.answer_slots``), on threads of their own: on the request threadpool,
100 at once held its 40 threads and every other request of every user waited behind them
(``GET /v1/releases/{id}`` 26 s at the 95th percentile;
``bench/results/answer_concurrency.md``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.answers import service
from app.core.threads import REQUEST_THREADS
from tests.conftest import Caller
from tests.releases.helpers import REQUEST, dataset, finished_release, wait_for


def test_answers_past_the_threadpool_leave_other_requests_served(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    release_id = finished_release(client, curator, dataset(client, curator), REQUEST)["id"]
    go_on = threading.Event()
    real_answer = service.answer

    def held(*args: Any, **kwargs: Any) -> Any:
        assert go_on.wait(timeout=120)
        return real_answer(*args, **kwargs)

    monkeypatch.setattr(service, "answer", held)
    limit = service.MAX_CONCURRENT_ANSWERS
    asking = REQUEST_THREADS + limit  # more than the request threadpool's threads
    codes: list[int] = []

    def ask() -> None:
        url = f"/v1/releases/{release_id}/answers"
        body = {"queries": [{"type": "pca", "k": 1}]}
        codes.append(client.post(url, headers=curator.headers, json=body).status_code)

    def statistics() -> Any:
        portal = client.portal  # type: ignore[attr-defined]
        return portal.call(lambda: service.answer_slots.limiter().statistics())

    threads = [threading.Thread(target=ask) for _ in range(asking)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: (
                (stats := statistics()).borrowed_tokens == limit
                and stats.tasks_waiting == asking - limit
            ),
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
