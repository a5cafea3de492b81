"""Release requests' checks and previews run at most ``MAX_CONCURRENT_RELEASE_CHECKS`` at
once per process (``app.releases.service.release_checks``): one at the index-set limit
takes about 240 MB, and the request threadpool's 40 threads let one curator's concurrent
previews take about 10 GB."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.releases import service
from tests.conftest import Caller
from tests.releases.helpers import REQUEST, dataset, request_release, wait_for


def test_previews_and_request_checks_run_a_few_at_a_time(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset_id = dataset(client, curator, epsilon=10.0)
    go_on = threading.Event()
    real_preview, real_validate = service.preview, service.validate_release

    def held(real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            assert go_on.wait(timeout=120)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(service, "preview", held(real_preview))
    monkeypatch.setattr(service, "validate_release", held(real_validate))
    limit = service.MAX_CONCURRENT_RELEASE_CHECKS
    codes: list[int] = []

    def send(index: int) -> None:
        if index % 2:
            response = request_release(client, curator, dataset_id)
        else:
            url = f"/v1/datasets/{dataset_id}/preview"
            response = client.post(url, headers=curator.headers, json=REQUEST)
        codes.append(response.status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2 * limit)]
    for thread in threads:
        thread.start()

    def statistics() -> Any:
        portal = client.portal  # type: ignore[attr-defined]
        return portal.call(lambda: service.release_checks.limiter().statistics())

    try:
        # every request arrived: the limit's worth running, the rest waiting for a slot
        wait_for(
            lambda: (
                (stats := statistics()).borrowed_tokens == limit and stats.tasks_waiting == limit
            ),
            f"{limit} checks running and {limit} waiting",
        )
    finally:
        go_on.set()
        for thread in threads:
            thread.join(timeout=120)
    assert sorted(codes) == [200] * limit + [202] * limit
