"""Smoke test of ``bench.interval_coverage`` (the real run is not a test)."""

import math

import numpy as np
import pytest

from app.mechanisms import randomized_response as rr
from bench import interval_coverage as bench


def test_summary_counts_coverage_and_width_as_stated() -> None:
    """Two queries, four releases: pooled coverage, its standard error from the
    per-release shares, the worst query with its binomial standard error, and the
    median half-width over the 95th percentile of the midpoint's error."""
    truth = np.array([0.0, 1.0])
    ends = np.array(
        [
            [[-1, 1], [-1, 1], [0.5, 2], [-2, -1]],  # covers 2 of 4
            [[0, 2], [0, 2], [0, 2], [0, 2]],  # covers 4 of 4
        ],
        dtype=float,
    )
    cell = bench._interval_summary(ends, truth)
    assert cell["coverage"] == pytest.approx(6 / 8)
    shares = np.array([1.0, 1.0, 0.5, 0.5])
    assert cell["se"] == pytest.approx(shares.std(ddof=1) / 2)
    assert cell["per_query"] == [0.5, 1.0]
    assert cell["min_query_coverage"] == 0.5
    assert cell["min_query_se"] == pytest.approx(math.sqrt(0.25 / 4))
    # query 1: midpoints all at the truth (q95 = 0, left out); query 0: half-widths
    # 1, 1, 0.75, 0.5 (median 0.875), midpoint errors 0, 0, 1.25, 1.5
    q95 = np.quantile([0, 0, 1.25, 1.5], 0.95)
    assert cell["half_over_q95"] == pytest.approx(0.875 / q95)


def test_rr_cell_reads_the_services_intervals() -> None:
    """A few releases of a small domain: coverages in [0, 1], the unclipped half-width
    wider than the range at epsilon 0.1, the clipped intervals' coverage equal to the
    unclipped ones', and the truth on the raw codes."""
    rng = np.random.default_rng(0)
    domain = rr.Domain((2, 4))
    codes = domain.encode(np.column_stack([rng.integers(0, 2, 200), rng.integers(0, 4, 200)]))
    queries = [("first attribute = 1", rr.Conjunction(domain, {0: 1}), True)]
    cell = bench.rr_cell(codes, domain, queries, 0.1, releases=5)
    assert cell["truth"] == [float(np.mean(domain.decode(codes)[:, 0] == 1))]
    for kind in ("unbiased", "proper"):
        assert 0.0 <= cell[kind]["coverage"] <= 1.0
        assert cell[kind]["releases"] == 5
    assert cell["unclipped_half_median"][0] > 1.0  # epsilon 0.1: wider than [0, 1]
    # clipped to [0, 1], which holds the truth: the same coverage as unclipped
    assert cell["unbiased"]["coverage"] == cell["unclipped_coverage"]
