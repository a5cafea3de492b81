"""Smoke test of bench.synopsis_answer_work on a tiny synopsis (the real run is not a test)."""

import numpy as np

from app.mechanisms import smooth_synopsis as sy
from app.releases.registry import ColumnInfo, DatasetInfo
from bench import synopsis_answer_work as bench


def test_bench_measures_a_shape_on_a_tiny_synopsis() -> None:
    rows = np.random.default_rng(0).uniform(-1, 1, size=(200, 3))
    info = DatasetInfo(200, tuple(ColumnInfo(f"c{j}", "continuous", 0.0, 1.0) for j in range(3)))
    synopsis = sy.measure(rows, 1.0, 1e-6, smoothness=4, co_spread=False)
    row = bench.measure(synopsis, info, 2, 0.1, seconds=0.0)
    assert row["work"] > synopsis.size
    assert 1 <= row["largest_batch"] <= 100_000
    assert row["microseconds_per_query"] > 0
    assert row["before_largest_batch_seconds"] >= row["largest_batch_seconds"]
