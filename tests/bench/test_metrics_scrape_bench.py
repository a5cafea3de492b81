"""Smoke test of bench.metrics_scrape on a small history (the real run is not a test): the
history it builds is read back as its docstring says."""

from pathlib import Path

import pytest

from app.config import Settings
from app.core import migrations
from app.core.metrics import read_installation
from app.core.services import Services
from bench import metrics_scrape as bench


def test_bench_builds_the_history_it_describes_and_times_its_read(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/curator.db"
    migrations.upgrade(url)
    services = Services.build(Settings(data_dir=tmp_path / "data", database_url=url))
    try:
        bench._populate(services, 200)
        with services.db.transaction(read_only=True) as session:
            state = read_installation(session)
        timings = bench._measure(services, repeat=2)
    finally:
        services.close()
    by_status: dict[str, int] = {}
    for (_mechanism, status), (count, _stored) in state.releases.items():
        by_status[status] = by_status.get(status, 0) + count
    assert by_status == {
        "succeeded": 160,
        "failed": 20,
        "cancelled": 14,
        "queued": 2,
        "measuring": 2,
        "synthesizing": 2,
    }
    assert {m for m, _ in state.releases} == set(bench.MECHANISMS)
    assert sum(stored for _count, stored in state.releases.values()) == 160 * 4096
    assert state.datasets == 20
    assert sum(state.lease_expired.values()) == 2  # half the running releases' leases
    # 200 releases of epsilon 0.01: 182 measured (succeeded, failed, synthesising), 14
    # refunded (cancelled), 4 still reserved (queued, measuring)
    assert state.epsilon["spent"] == pytest.approx(1.82)
    assert state.epsilon["reserved"] == pytest.approx(0.04)
    assert state.epsilon["total"] == pytest.approx(200.0)
    for part in ("read", "scrape"):
        assert 0 < timings[part]["median_ms"] <= timings[part]["max_ms"]
