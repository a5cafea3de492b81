"""Smoke test of ``bench.synopsis_coverage`` (the real run is not a test)."""

import math

import numpy as np

from bench import synopsis_coverage as bench


def test_coverage_cell_counts_what_the_intervals_hold() -> None:
    """On small independent data: per-release shares in [0, 1], their mean and standard
    error as stated, and a rendered table with the pooled cell."""
    rng = np.random.default_rng(0)
    X = np.tanh(rng.normal(size=(3000, 3)))
    cell = bench.coverage(X, 4, releases=4, n_queries=100, delta=0.0)
    shares = np.array(cell["per_release"])
    assert shares.shape == (4,)
    assert np.all((shares >= 0) & (shares <= 1))
    assert cell["mean"] == float(shares.mean())
    assert math.isclose(cell["se"], float(shares.std(ddof=1) / 2.0))
    assert cell["co_spread"] is True
    assert cell["noise_only"] <= cell["mean"] + 1e-12  # the full interval is never narrower
    result = {
        "settings": {
            "sigmas": [4],
            "releases": 4,
            "queries": 100,
            "epsilon": 1.0,
            "delta": 0.0,
            "level": 0.95,
        },
        "datasets": {
            "toy": {
                "n": 3000,
                "d": 3,
                "sigmas": {"4": cell},
                "pooled": cell["mean"],
                "pooled_se": cell["se"],
            }
        },
    }
    text = bench.render_markdown(result)
    assert f"**{cell['mean']:.3f} +- {cell['se']:.3f}**" in text
    assert "toy (3000 x 3)" in text


def test_before_answers_the_same_releases_without_the_new_allowances() -> None:
    """``before=True`` answers the same releases as the code before c118fd3 / 8dee82a
    (no second-order variance, ``CO_SPREAD_MODEL_ERROR = 0``): its intervals are never
    wider (the synopsis here releases pair moments, so the values are the same and only the
    correction's allowance differs), the constant is restored afterwards, and the table
    shows both."""
    rng = np.random.default_rng(1)
    z = rng.normal(size=(3000, 1))
    X = np.tanh(0.8 * z + 0.3 * rng.normal(size=(3000, 8)))  # correlated, co-spread on
    cell = bench.coverage(X, 2, releases=2, n_queries=40, delta=0.0, epsilon=10.0, before=True)
    was = cell["before"]
    assert bench.smooth_synopsis.CO_SPREAD_MODEL_ERROR == 4.0
    assert cell["applied"] > 0
    assert was["mean"] <= cell["mean"] + 1e-12
    assert was["half_over_q95"] < cell["half_over_q95"]
    result = {
        "settings": {"sigmas": [2], "releases": 2, "queries": 40, "epsilon": 10.0},
        "datasets": {
            "toy": {"n": 3000, "d": 8, "sigmas": {"2": cell}, "pooled": 0, "pooled_se": 0}
        },
    }
    result["settings"] |= {"delta": 0.0, "level": 0.95}
    text = bench.render_markdown(result)
    assert f"| toy | 2 | {cell['R']} | {cell['mean']:.3f}" in text
    assert f"{was['half_over_q95']:.2f} |" in text
