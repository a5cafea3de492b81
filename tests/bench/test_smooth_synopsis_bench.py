"""Smoke test of ``bench.smooth_synopsis --quick`` (the real run is not a test)."""

import json
import math
from pathlib import Path

import numpy as np

from app.mechanisms.queries import GaussianMixtureBatch
from bench import smooth_synopsis as bench
from bench.smooth_synthetic import DATA_DIR, QUERY_SEED, load_datasets


def test_quick_run_writes_consistent_results(tmp_path: Path) -> None:
    bench.main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "smooth_synopsis_quick.json").read_text())
    text = (tmp_path / "smooth_synopsis_quick.md").read_text()

    assert result["settings"]["queries"] == 1000
    assert result["settings"]["sigmas"] == [4, 10]
    entry = result["datasets"]["WDBC"]
    assert (entry["n"], entry["d"]) == (569, 30)
    labels = [label for label, _, _ in bench.SYNOPSES] + [label for label, _ in bench.SYNTHETICS]
    assert sorted(entry["releases"]) == sorted(labels)

    # the baseline is the uniform expectation of the protocol's queries
    X = load_datasets(["WDBC"], DATA_DIR)["WDBC"]
    batch = GaussianMixtureBatch.random(1000, 10, 30, 4.0, np.random.default_rng(QUERY_SEED))
    truth = batch.answers(X)
    base = np.max(np.abs(batch.uniform_expectations() - truth) / truth)
    assert math.isclose(entry["baseline"]["4"]["rel"], base, rel_tol=1e-12)

    for label, per_sigma in entry["releases"].items():
        for stats in per_sigma.values():
            assert stats["finite"] == 1.0, label
            assert 0 <= stats["rel_mean"] <= stats["rel"] < math.inf, label
            assert math.isfinite(stats["ratio"]), label
            assert stats["ratio"] > 0, label
            assert stats["answer_s"] > 0, label
    for label, _, _ in bench.SYNOPSES:
        for sigma, stats in entry["releases"][label].items():
            assert stats["epsilon"] <= 1.0 + 1e-12
            assert stats["delta"] <= bench.DELTA_GAUSS
            for key in ("coverage", "coverage_noise_only", "coverage_noise_calibration"):
                assert 0.0 <= stats[key] <= 1.0, (label, sigma, key)
            # the full interval contains the noise-only one
            assert stats["coverage"] >= stats["coverage_noise_only"]
            noise_free = entry["noise_free"][label][sigma]
            assert noise_free["R"] == stats["R"]
            # the truncation bound is a bound: never below the actual truncation error
            assert noise_free["bound_holds"] == 1.0
            assert noise_free["bound_over_actual_median"] >= 1.0

    per_query = result["per_query_coverage"]["WDBC"]
    assert per_query["draws"] == 10
    for label, _, _ in bench.SYNOPSES:
        e = per_query[label]
        assert e["draws"] == 10
        assert len(e["coverage"]) == bench.COVERAGE_QUERIES
        assert all(0.0 <= c <= 1.0 for c in e["coverage"] + e["coverage_noise_only"])
        assert all(s > 0 for s in e["stderr"])
        assert all(
            act <= tau
            for act, tau in zip(e["actual_truncation_error"], e["truncation_bound"], strict=True)
        )

    assert "| release | sigma=4 | sigma=10 |" in text
    assert "| 0-DP uniform baseline |" in text
    assert "## WDBC (n = 569, d = 30)" in text
    assert "## Interval coverage" in text
    assert "## Per-query coverage over independent measurements" in text
    assert "Machine: " in text
