"""bench.service_latency answers a batch in as few requests as the work bound allows (the
benchmark crashed on the synopsis's 422 once the work bounds came in)."""

import json
from typing import Any

import pytest

from app.demo.runner import DemoError
from bench import service_latency as bench


class _Bounded:
    """A client whose release answers at most ``most`` queries a request."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.sizes: list[int] = []

    def request(self, method: str, path: str, *, raw: bytes, headers: Any) -> Any:
        queries = json.loads(raw)["queries"]
        if len(queries) > self.most:
            raise DemoError(f"{method} {path} -> 422: too much work for one request")
        self.sizes.append(len(queries))
        return {"answers": [{"value": 0.0}] * len(queries)}


def test_a_batch_over_the_work_bound_is_halved_until_it_is_answered() -> None:
    client = _Bounded(most=3)
    row = bench._answer_all(client, "r", [{"q": i} for i in range(10)])  # type: ignore[arg-type]
    assert (row["queries"], row["requests"]) == (10, 4)
    assert client.sizes == [3, 3, 3, 1]


def test_other_refusals_are_not_retried() -> None:
    class Broken(_Bounded):
        def request(self, method: str, path: str, *, raw: bytes, headers: Any) -> Any:
            raise DemoError(f"{method} {path} -> 409: the release is queued")

    with pytest.raises(DemoError, match="409"):
        bench._answer_all(Broken(most=1), "r", [{"q": 0}, {"q": 1}])  # type: ignore[arg-type]
