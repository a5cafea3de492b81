"""Smoke test of bench.answer_stderr on a tiny dataset (the real run is not a test)."""

import json

import numpy as np

from bench import answer_stderr as bench


def test_bench_runs_and_renders_on_a_tiny_dataset() -> None:
    rng = np.random.default_rng(3)
    z = rng.normal(size=500)
    X = np.clip(np.column_stack([z, z + rng.normal(size=500), rng.normal(size=500)]) / 3, -1, 1)
    methods = bench.run_dataset(X, rounds=3, queries=20)
    assert set(methods) == set(bench.METHODS)
    for row in methods.values():
        assert len(row["families"]) == 7
        for cell in row["families"].values():
            assert cell["se_over_sd"] > 0
            assert 0 <= cell["covers_truth"] <= 1
            assert 0 <= cell["covers_mean"] <= 1
            assert cell["noise_share"] > 0
        assert row["bootstrap_seconds"] >= 0
    result = {
        "settings": {"rounds": 3, "queries": 20, "replicates": 20},
        "datasets": {"TINY": {"n": 500, "d": 3, "methods": methods}},
    }
    json.dumps(result)
    text = bench.render(result)
    assert "## TINY (n = 500, d = 3)" in text
    assert "Ranges over the datasets:" in text
    assert text.count("| tree (eps, delta) |") == 1
    assert text.count("| moments (eps, delta) |") == 1
    assert "* moments (eps, delta): `se / sd`" in text
