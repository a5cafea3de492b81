"""The secure samplers: exact thresholds, and statistical checks of the draws.

Statistical tests reject at p < 1e-6 or beyond 5 sigma (false-failure rate about 1e-6 each).
"""

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from app.mechanisms import secure_random as sr


def test_threshold_rounds_in_the_stated_direction() -> None:
    third = Decimal(1) / Decimal(3)
    up = sr.threshold(third, "up")
    down = sr.threshold(third, "down")
    assert up == down + 1
    assert Fraction(up, sr.TWO_64) >= Fraction(third) >= Fraction(down, sr.TWO_64)
    assert sr.threshold(Decimal(0), "up") == 0
    assert sr.threshold(Decimal(1), "down") == sr.TWO_64
    assert sr.threshold(Decimal("0.5"), "up") == 1 << 63
    with pytest.raises(ValueError, match="probability"):
        sr.threshold(Decimal("1.5"), "up")


def test_bernoulli_frequency_matches_threshold() -> None:
    threshold = sr.threshold(Decimal("0.3"), "up")
    draws = sr.bernoulli(1_000_000, threshold)
    p = threshold / sr.TWO_64
    z = (draws.mean() - p) / np.sqrt(p * (1 - p) / draws.size)
    assert abs(z) < 5
    assert sr.bernoulli(1000, 0).sum() == 0
    assert sr.bernoulli(1000, sr.TWO_64).all()


@pytest.mark.parametrize("bound", [1, 7, 16, 1000])
def test_uniform_below_is_uniform(bound: int) -> None:
    draws = sr.uniform_below(200_000, bound)
    assert draws.min() >= 0
    assert draws.max() < bound
    if bound > 1:
        counts = np.bincount(draws, minlength=bound)
        assert stats.chisquare(counts).pvalue > 1e-6


def test_uniform_below_large_bound_covers_the_range() -> None:
    bound = (1 << 62) + 12345  # rejection region is nearly 3/4 of the words
    draws = sr.uniform_below(200_000, bound)
    assert draws.min() >= 0
    assert draws.max() < bound
    quarters = np.bincount((draws // (bound // 4 + 1)).astype(np.int64), minlength=4)
    assert stats.chisquare(quarters).pvalue > 1e-6


def test_standard_normal_passes_ks() -> None:
    draws = sr.standard_normal((400, 250))
    assert draws.shape == (400, 250)
    assert stats.kstest(draws.ravel(), "norm").pvalue > 1e-6
    assert np.all(np.isfinite(draws))


def test_random_bytes_are_fresh() -> None:
    a = sr.random_bytes(64)
    b = sr.random_bytes(64)
    assert a.dtype == np.uint8
    assert a.size == 64
    assert not np.array_equal(a, b)  # equal with probability 2^-512
    bits = np.unpackbits(sr.random_bytes(125_000))
    z = (bits.mean() - 0.5) / np.sqrt(0.25 / bits.size)
    assert abs(z) < 5
