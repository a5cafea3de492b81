"""The separable query families appended to queries.py (used by smooth_synopsis)."""

import numpy as np
import pytest
from scipy import integrate

from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import (
    AnisotropicGaussianMixture,
    GaussianMixture,
    Polynomial,
    ProductQuery,
    Query,
)


def test_anisotropic_mixture_matches_the_formula_and_the_isotropic_case() -> None:
    rng = np.random.default_rng(30)
    centers, weights = rng.uniform(-1, 1, (4, 3)), rng.uniform(-1, 1, 4)
    sigma = np.array([0.4, 1.0, 2.5])
    q = AnisotropicGaussianMixture(centers, weights, sigma)
    X = rng.uniform(-1, 1, (500, 3))
    slow = sum(
        a * np.exp(-np.sum((X - c) ** 2 / (2 * sigma**2), axis=1))
        for a, c in zip(weights, centers, strict=True)
    )
    np.testing.assert_allclose(q.evaluate(X), slow, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(q.evaluate(X, block_elements=7), slow, rtol=1e-12, atol=1e-15)
    iso = AnisotropicGaussianMixture(centers, weights, 0.8)
    ref = GaussianMixture(centers, weights, 0.8)
    np.testing.assert_allclose(iso.evaluate(X), ref.evaluate(X), rtol=1e-12, atol=1e-15)
    assert iso.uniform_expectation() == pytest.approx(ref.uniform_expectation(), rel=1e-13)
    assert isinstance(q, Query)


def test_anisotropic_uniform_expectation_against_quadrature() -> None:
    q = AnisotropicGaussianMixture(
        np.array([[0.3, -0.9], [1.7, 0.0]]), np.array([0.4, 0.6]), np.array([0.5, 1.3])
    )

    def density(y: float, x: float) -> float:
        return float(q.evaluate(np.array([[x, y]]))[0]) / 4.0

    exact, _ = integrate.dblquad(density, -1, 1, -1, 1, epsabs=1e-13, epsrel=1e-13)
    assert q.uniform_expectation() == pytest.approx(exact, rel=1e-10)


def test_product_query_with_callables_coefficients_and_none() -> None:
    q = ProductQuery((np.exp, None, np.array([0.5, 0.0, 2.0])), weight=-1.5)
    X = np.random.default_rng(31).uniform(-1, 1, (200, 3))
    expected = -1.5 * np.exp(X[:, 0]) * (0.5 + 2.0 * (2 * X[:, 2] ** 2 - 1))
    np.testing.assert_allclose(q.evaluate(X), expected, rtol=1e-13)
    assert q.dim == 3
    with pytest.raises(MechanismError, match="one value per point"):
        ProductQuery((lambda x: 1.0,)).evaluate(X[:, :1])
    with pytest.raises(MechanismError, match="factor 0"):
        ProductQuery((np.zeros((2, 2)),))
    with pytest.raises(MechanismError, match="weight"):
        ProductQuery((None,), weight=float("nan"))
    with pytest.raises(MechanismError, match="one factor per column"):
        ProductQuery(())


def test_polynomial_evaluates_its_monomials() -> None:
    q = Polynomial(np.array([[2, 0, 1], [0, 0, 0], [1, 3, 0]]), np.array([1.0, 0.5, -2.0]))
    X = np.random.default_rng(32).uniform(-1, 1, (100, 3))
    expected = X[:, 0] ** 2 * X[:, 2] + 0.5 - 2.0 * X[:, 0] * X[:, 1] ** 3
    np.testing.assert_allclose(q.evaluate(X), expected, rtol=1e-13, atol=1e-15)
    with pytest.raises(MechanismError, match="coefficients must have shape"):
        Polynomial(np.array([[1, 0]]), np.array([1.0, 2.0]))
    with pytest.raises(MechanismError, match="finite"):
        Polynomial(np.array([[1, 0]]), np.array([np.nan]))
    with pytest.raises(MechanismError, match="non-empty"):
        Polynomial(np.zeros((0, 2), dtype=int), np.zeros(0))


def test_original_units_query_is_an_anisotropic_mixture_on_normalised_data() -> None:
    """The conversion in smooth_synopsis' service notes: same values on the same rows."""
    rng = np.random.default_rng(33)
    lo, hi = np.array([10.0, -3.0, 0.0]), np.array([50.0, 5.0, 0.01])
    raw = rng.uniform(lo, hi, size=(300, 3))
    centers, s = rng.uniform(lo, hi, size=(2, 3)), np.array([8.0, 1.5, 0.004])
    weights = np.array([0.3, 0.9])
    original = sum(
        a * np.exp(-np.sum((raw - c) ** 2 / (2 * s**2), axis=1))
        for a, c in zip(weights, centers, strict=True)
    )
    normalised = 2 * (raw - lo) / (hi - lo) - 1
    q = AnisotropicGaussianMixture(2 * (centers - lo) / (hi - lo) - 1, weights, 2 * s / (hi - lo))
    np.testing.assert_allclose(q.evaluate(normalised), original, rtol=1e-10, atol=1e-14)
