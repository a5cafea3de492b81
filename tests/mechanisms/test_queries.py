import numpy as np
import pytest
from scipy import integrate

from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import GaussianMixture, GaussianMixtureBatch, Query, answer


def slow_mixture(q: GaussianMixture, X: np.ndarray) -> np.ndarray:
    out = np.zeros(len(X))
    for a, c in zip(q.weights, q.centers, strict=True):
        out += a * np.exp(-np.sum((X - c) ** 2, axis=1) / (2 * q.sigma**2))
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20)


def test_evaluate_matches_the_formula(rng: np.random.Generator) -> None:
    q = GaussianMixture(rng.uniform(-1, 1, (10, 6)), rng.uniform(0, 1, 10), sigma=0.7)
    X = rng.uniform(-1, 1, (1000, 6))
    np.testing.assert_allclose(q.evaluate(X), slow_mixture(q, X), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(
        q.evaluate(X, block_elements=30), slow_mixture(q, X), rtol=1e-12, atol=1e-15
    )
    assert isinstance(q, Query)


def test_weighted_answers(rng: np.random.Generator) -> None:
    q = GaussianMixture(rng.uniform(-1, 1, (3, 2)), rng.uniform(0, 1, 3), sigma=2.0)
    points = rng.uniform(-1, 1, (50, 2))
    weights = rng.dirichlet(np.ones(50))
    weights[:10] = 0.0
    assert q.answer(points, weights) == pytest.approx(float(weights @ slow_mixture(q, points)))
    assert answer(q, points) == pytest.approx(float(slow_mixture(q, points).mean()))


def test_batch_answers_equal_one_query_at_a_time(rng: np.random.Generator) -> None:
    batch = GaussianMixtureBatch.random(200, 10, 5, 4.0, rng)
    points = rng.uniform(-1, 1, (300, 5))
    weights = rng.dirichlet(np.ones(300))
    got = batch.answers(points, weights, block_elements=2_000)
    expected = [batch.query(i).answer(points, weights) for i in range(len(batch))]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(
        batch.answers(points)[:5], [batch.query(i).answer(points) for i in range(5)], rtol=1e-12
    )


def test_uniform_expectation_against_quadrature() -> None:
    q = GaussianMixture(np.array([[0.3, -0.9], [1.7, 0.0]]), np.array([0.4, 0.6]), sigma=0.8)

    def density(y: float, x: float) -> float:
        return float(q.evaluate(np.array([[x, y]]))[0]) / 4.0

    exact, _ = integrate.dblquad(density, -1, 1, -1, 1, epsabs=1e-13, epsrel=1e-13)
    assert q.uniform_expectation() == pytest.approx(exact, rel=1e-10)


def test_uniform_expectations_against_monte_carlo(rng: np.random.Generator) -> None:
    batch = GaussianMixtureBatch.random(20, 10, 30, 2.0, rng)
    U = rng.uniform(-1, 1, (100_000, 30))
    values = np.stack([batch.query(i).evaluate(U) for i in range(20)])
    mc = values.mean(axis=1)
    se = values.std(axis=1) / np.sqrt(U.shape[0])
    assert np.all(np.abs(batch.uniform_expectations() - mc) < 5 * se)


def test_far_centres_do_not_warn() -> None:
    q = GaussianMixture(np.array([[60.0, 0.0]]), np.array([1.0]), sigma=1.0)
    assert q.uniform_expectation() == 0.0
    assert q.evaluate(np.zeros((1, 2)))[0] == 0.0


@pytest.mark.parametrize(
    ("centers", "weights", "sigma", "message"),
    [
        (np.zeros((2, 3)), np.ones(3), 1.0, "weights must have shape"),
        (np.zeros((2, 3)), np.ones(2), 0.0, "sigma"),
        (np.zeros((2, 3)), np.ones(2), float("nan"), "sigma"),
        (np.full((2, 3), np.inf), np.ones(2), 1.0, "finite"),
        (np.zeros(3), np.ones(1), 1.0, r"\(J, d\)"),
    ],
)
def test_bad_queries_are_rejected(
    centers: np.ndarray, weights: np.ndarray, sigma: float, message: str
) -> None:
    with pytest.raises(MechanismError, match=message):
        GaussianMixture(centers, weights, sigma)


def test_bad_points_are_rejected() -> None:
    q = GaussianMixture(np.zeros((1, 2)), np.ones(1), 1.0)
    with pytest.raises(MechanismError, match=r"\(m, 2\)"):
        q.evaluate(np.zeros((3, 4)))
    with pytest.raises(MechanismError, match="non-negative"):
        q.answer(np.zeros((2, 2)), np.array([1.0, -0.5]))
