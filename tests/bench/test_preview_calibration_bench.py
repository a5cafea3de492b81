"""Smoke test of ``bench.preview_calibration`` (the real run is not a test)."""

import numpy as np

from app.mechanisms import smooth_synopsis as sy
from bench import preview_calibration as bench


def test_synopsis_cell_measures_against_the_preview_plan() -> None:
    """On small data: the cell uses the preview's plan (its R), the plain answers' noise
    and the moments' noise are near the predicted ones (ten releases: within 50 %),
    and the shares and ratios are in range."""
    X = np.tanh(np.random.default_rng(0).normal(size=(2000, 3)))
    batch = bench.representative_queries(3, bench.SMOOTHNESS, 60)
    assert np.allclose(batch.weights, 1.0)
    assert batch.sigma == 2.0
    cell = bench.synopsis_cell(X, 1.0, 0.0, 10, batch)
    index_set, choice, _ = sy.plan(2000, 3, epsilon=1.0, smoothness=bench.SMOOTHNESS)
    assert cell["R"] == index_set.size
    assert cell["predicted"]["predicted_stderr"] == choice.chosen.predicted_stderr
    assert 0.5 < cell["moment_noise_sd"] / cell["predicted"]["moment_stddev"] < 1.5
    assert 0.5 < cell["plain_noise_rms"] / cell["predicted"]["predicted_stderr"] < 1.5
    assert 0.0 <= cell["coverage_of_predicted_halfwidth"] <= 1.0
    assert cell["truncation_plain_mean"] < cell["predicted"]["predicted_truncation"]


def test_marginals_noise_is_measured_in_frequency_units() -> None:
    """The realised noise of the frequencies is the preview's ``frequency_stddev`` (100
    releases of at least 4 cells: the ratio's standard error is below 0.06, the tolerance
    0.3), and the projection onto the simplex does not add to it."""
    X = np.tanh(np.random.default_rng(1).normal(size=(3000, 2)))
    out = bench.run_marginals(100, X)
    for cell in out.values():
        assert 0.7 < cell["noise_sd"] / cell["frequency_stddev"] < 1.3
        assert cell["projected_rms"] < cell["noise_sd"] * 1.5
