"""Smoke test of bench.smooth_marginals on a tiny dataset (the real run is not a test)."""

import json

import numpy as np

from bench import smooth_marginals as bench


def test_bench_runs_and_renders_without_peers() -> None:
    rng = np.random.default_rng(70)
    X = np.clip(rng.normal(0.2, 0.3, size=(400, 3)), -1, 1)
    result = bench.run({"TINY": X}, 1, 1, 1, 30, None, [], log=lambda *args: None)
    result["settings"] = {"queries": 30, "rounds": 1, "lp_rounds": 1, "peer_rounds": 1}
    rows = result["datasets"]["TINY"]["rows"]
    assert set(rows) == {
        "independent columns (not private)",
        "marginals (eps)",
        "marginals (eps, delta)",
        "moment LP (eps)",
        "moment LP (eps, delta)",
    }
    for row in rows.values():
        assert len(row["ratio"]) == len(bench.SIGMAS) + len(bench.JOINT_SIGMAS)
        assert all(np.isfinite(v) and v >= 0 for v in row["ratio"].values())
    json.dumps(result)
    text = bench.render_markdown(result)
    assert "## TINY (n = 400, d = 3)" in text
    assert "| 0-DP baseline (Rel) |" in text


def test_joint_queries_are_centred_near_real_rows() -> None:
    X = np.random.default_rng(71).uniform(-1, 1, size=(50, 4))
    batch = bench.joint_queries(X, 20, 1.0, 5)
    nearest = np.min(np.linalg.norm(batch.centers[:, :, None, :] - X[None, None], axis=-1), axis=-1)
    assert batch.centers.shape == (20, 10, 4)
    assert np.median(nearest) < 0.5  # jitter N(0, 0.1^2) per coordinate
