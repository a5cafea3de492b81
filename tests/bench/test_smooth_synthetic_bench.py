"""Smoke test of the benchmark's code path on a tiny dataset (the real run is not a test)."""

import json
from pathlib import Path

import numpy as np

from bench import smooth_synthetic as bench


def test_bench_runs_and_renders(tmp_path: Path) -> None:
    rng = np.random.default_rng(60)
    X = np.clip(rng.normal(0.2, 0.3, size=(300, 3)), -1, 1)
    result = bench.run(
        datasets=[],
        rounds=1,
        rounds_large=1,
        rounds_ipm=1,
        n_queries=20,
        data_dir=tmp_path,
        sizes=(200,),
        ipm=["TINY"],
        log=lambda *args: None,
        data={"TINY": X},
    )
    entry = result["datasets"]["TINY"]
    assert len(entry["configs"]) == 8 + 4
    for per_sigma in entry["configs"].values():
        for stats in per_sigma.values():
            assert stats["rel"] >= 0
            assert stats["epsilon"] <= 1.0
            assert stats["delta"] <= 1e-10
    json.dumps(result)
    text = bench.render_markdown(result)
    assert "0-DP uniform baseline" in text
    assert "## TINY (n = 300, d = 3)" in text


def test_normalise_maps_columns_to_the_cube() -> None:
    raw = np.array([[1.0, 5.0, 2.0], [3.0, 5.0, 4.0], [2.0, 5.0, 8.0]])
    out = bench.normalise(raw)
    np.testing.assert_allclose(out[:, 0], [-1.0, 1.0, 0.0])
    np.testing.assert_allclose(out[:, 1], [0.0, 0.0, 0.0])
    assert out.min() >= -1
    assert out.max() <= 1
