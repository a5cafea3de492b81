"""app.core.threads.limit_blas_threads: one BLAS thread per product in the service."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from app.config import Settings
from app.core.threads import limit_blas_threads


@pytest.fixture
def restored_blas() -> Iterator[None]:
    """The process's BLAS limits as they were before the test."""
    controller = ThreadpoolController()
    before = {info["filepath"]: info["num_threads"] for info in controller.info()}
    yield
    for library in ThreadpoolController().lib_controllers:
        if library.filepath in before:
            library.set_num_threads(before[library.filepath])


def _blas_threads() -> list[int]:
    return [int(i["num_threads"]) for i in ThreadpoolController().select(user_api="blas").info()]


@pytest.mark.usefixtures("restored_blas")
def test_limit_reaches_numpy_and_scipy_blas() -> None:
    ThreadpoolController().limit(limits=2, user_api="blas")  # as on a 2-core machine
    counts = limit_blas_threads(1)  # numpy's OpenBLAS and scipy's own, or one shared BLAS
    assert counts
    assert set(counts) == {1}
    assert _blas_threads() == counts
    a = np.arange(64.0).reshape(8, 8)
    assert np.array_equal(a @ a.T, (a @ a.T).T)  # products still run
    assert set(limit_blas_threads(3)) == {3}


@pytest.mark.usefixtures("restored_blas")
def test_zero_leaves_the_libraries_as_they_are() -> None:
    ThreadpoolController().limit(limits=2, user_api="blas")
    counts = limit_blas_threads(0)
    assert counts
    assert set(counts) == {2}
    assert _blas_threads() == counts


def test_the_setting_defaults_to_one_and_admits_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CURATOR_BLAS_THREADS", raising=False)
    assert Settings().blas_threads == 1
    monkeypatch.setenv("CURATOR_BLAS_THREADS", "0")
    assert Settings().blas_threads == 0
    monkeypatch.setenv("CURATOR_BLAS_THREADS", "-1")
    with pytest.raises(ValueError, match="blas_threads"):
        Settings()


def test_usage_counts_calls_running_and_waiting_for_a_slot_or_their_callers() -> None:
    """``ThreadLimit.usage``: calls holding a slot, and those waiting, for a free slot or
    (``per_caller``) for one of their caller's; nothing before the first call."""
    import threading

    import anyio

    from app.core.threads import ThreadLimit

    slots = ThreadLimit("test_usage", 2, per_caller=1)
    release = threading.Event()
    seen: list[tuple[int, int]] = []

    async def main() -> None:
        seen.append(slots.usage())

        async def disconnect_never() -> dict[str, str]:
            await anyio.sleep_forever()
            return {}

        async with anyio.create_task_group() as group:
            # caller a: one runs, one waits for a's turn; b: runs; c: waits for a slot
            for caller in ("a", "a", "b", "c"):
                group.start_soon(slots.run_while_connected, disconnect_never, caller, release.wait)
                await anyio.sleep(0.05)
            for _ in range(100):
                if slots.usage() == (2, 2):
                    break
                await anyio.sleep(0.05)
            seen.append(slots.usage())
            release.set()
        seen.append(slots.usage())

    anyio.run(main)
    assert seen == [(0, 0), (2, 2), (0, 0)]
