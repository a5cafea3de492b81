import json
import math

import numpy as np
import pytest

from app.mechanisms import pca
from app.mechanisms.data import ArraySource
from app.mechanisms.errors import MechanismError


def test_covariance_streams_and_matches_numpy() -> None:
    X = np.random.default_rng(40).uniform(-1, 1, size=(1001, 4))
    A, mu = pca.covariance(ArraySource(X, batch_rows=100))
    np.testing.assert_allclose(A, np.cov(X, rowvar=False, bias=True), atol=1e-14)
    np.testing.assert_allclose(mu, X.mean(axis=0), atol=1e-15)


def test_covariance_difference_identity() -> None:
    """A(D') - A(D) = ((n-1)/n^2) (b b^T - a a^T) with a = z - m, b = z' - m."""
    rng = np.random.default_rng(41)
    n, d = 9, 4
    D = rng.uniform(-1, 1, size=(n, d))
    D2 = D.copy()
    D2[0] = rng.uniform(-1, 1, size=d)
    m = D[1:].mean(axis=0)
    a, b = D[0] - m, D2[0] - m
    expected = (n - 1) / n**2 * (np.outer(b, b) - np.outer(a, a))
    np.testing.assert_allclose(pca.covariance(D2)[0] - pca.covariance(D)[0], expected, atol=1e-14)


@pytest.mark.parametrize(("n", "d", "k"), [(5, 2, 1), (8, 3, 2), (6, 4, 4)])
def test_sensitivity_bounds_hold_on_neighbours(n: int, d: int, k: int) -> None:
    """Brute force over random and corner neighbour pairs and random orthonormal X."""
    rng = np.random.default_rng(42)
    bound = pca.covariance_sensitivity(n, d, k)
    corners = np.array(list(np.ndindex(*(2,) * d)), dtype=float) * 2 - 1
    worst_f = worst_l2 = worst_l1 = 0.0
    for trial in range(600):
        if trial % 3 == 0:
            D = rng.uniform(-1, 1, size=(n, d))
        else:
            D = corners[rng.integers(0, len(corners), size=n)]
        D2 = D.copy()
        D2[rng.integers(n)] = corners[rng.integers(len(corners))]
        delta_A = pca.covariance(D)[0] - pca.covariance(D2)[0]
        X, _ = np.linalg.qr(rng.standard_normal((d, k)))
        worst_f = max(worst_f, float(np.linalg.norm(delta_A)))
        worst_l2 = max(worst_l2, float(np.linalg.norm(delta_A @ X)))
        worst_l1 = max(worst_l1, float(np.abs(delta_A @ X).sum()))
    assert worst_f <= bound["l2"] * (1 + 1e-12)
    assert worst_l2 <= bound["l2"] * (1 + 1e-12)
    assert worst_l1 <= bound["l1"] * (1 + 1e-12)


def test_sensitivity_bound_is_attained() -> None:
    """n - 1 rows at one corner, the last at the opposite corner moves onto them."""
    n, d = 10, 3
    D = -np.ones((n, d))
    D[0] = 1.0
    D2 = -np.ones((n, d))
    delta_A = pca.covariance(D)[0] - pca.covariance(D2)[0]
    bound = pca.covariance_sensitivity(n, d, 1)["l2"]
    assert np.linalg.norm(delta_A) == pytest.approx(bound)
    x = np.ones((d, 1)) / math.sqrt(d)  # the direction of a
    assert np.linalg.norm(delta_A @ x) == pytest.approx(bound)


def clear_axes_data(rng: np.random.Generator, n: int = 4000) -> np.ndarray:
    """Rows with variances 0.2, 0.05, 0.01 along a rotated basis of R^3 (eigengaps 4 and 5)."""
    rotation, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    Z = rng.standard_normal((n, 3)) * np.sqrt([0.2, 0.05, 0.01])
    return np.clip(Z @ rotation.T, -1, 1)


@pytest.mark.parametrize(("mechanism", "iterations"), [("gaussian", 1), ("laplace", 4)])
def test_low_noise_recovers_the_principal_axes(mechanism: str, iterations: int) -> None:
    rng = np.random.default_rng(43)
    # n = 16000: at n = 4000 the Gaussian case's smallest eigenvalue (0.01) missed rtol 0.05
    # in ~1 of 10 runs (OpenDP noise is not seeded); the noise scales like 1/n
    X = clear_axes_data(rng, n=16_000)
    values, vectors = np.linalg.eigh(pca.covariance(X)[0])
    result = pca.private_subspace_iteration(
        X,
        rank=3 if mechanism == "gaussian" else 2,
        iterations=iterations,
        epsilon=100.0,
        delta=1e-6,
        mechanism=mechanism,
        rng=rng,
    )
    k = result.rank
    np.testing.assert_allclose(result.eigenvalues, values[::-1][:k], rtol=0.05)
    cosines = np.abs(np.sum(result.axes * vectors[:, ::-1][:, :k], axis=0))
    assert np.all(cosines > 0.99)
    assert [p.step for p in result.privacy_cost.parts] == ["pca_subspace"]
    assert result.privacy_cost.epsilon <= 100.0


def test_calibration_composes_over_iterations() -> None:
    X = np.random.default_rng(44).uniform(-1, 1, size=(500, 6))
    sens = pca.covariance_sensitivity(500, 6, 2)
    common = {"rank": 2, "epsilon": 0.5, "rng": np.random.default_rng(0)}
    lap = pca.private_subspace_iteration(X, iterations=5, delta=0.0, mechanism="laplace", **common)
    assert lap.calibration is not None
    assert lap.calibration.scale == pytest.approx(5 * sens["l1"] / 0.5, rel=1e-12)
    g1 = pca.private_subspace_iteration(X, iterations=1, delta=1e-8, mechanism="gaussian", **common)
    g4 = pca.private_subspace_iteration(X, iterations=4, delta=1e-8, mechanism="gaussian", **common)
    assert g1.calibration is not None
    assert g4.calibration is not None
    assert g4.calibration.scale == pytest.approx(2 * g1.calibration.scale, rel=1e-9)
    assert g4.iterates.shape == (4, 6, 2)


def test_eigenpairs_are_post_processing_of_the_iterates() -> None:
    X = np.random.default_rng(45).uniform(-1, 1, size=(300, 5))
    result = pca.private_subspace_iteration(
        X,
        rank=3,
        iterations=3,
        epsilon=1.0,
        delta=1e-8,
        mechanism="gaussian",
        rng=np.random.default_rng(1),
    )
    back = pca.PrivatePCA.from_dict(json.loads(json.dumps(result.to_dict())))
    np.testing.assert_array_equal(back.axes, result.axes)
    np.testing.assert_array_equal(back.eigenvalues, result.eigenvalues)
    assert back.calibration == result.calibration
    np.testing.assert_allclose(back.axes.T @ back.axes, np.eye(3), atol=1e-12)
    assert np.all(back.eigenvalues >= 0)
    assert np.all(back.eigenvalues <= 5)


def test_exact_reference_is_not_serialisable() -> None:
    record, mu = pca.exact_pca(np.random.default_rng(46).uniform(-1, 1, (50, 3)), 2)
    assert record.privacy_cost.kind == "non_private"
    assert mu.shape == (3,)
    with pytest.raises(MechanismError, match="non-private"):
        record.to_dict()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 0}, "pca_rank"),
        ({"rank": 4}, "pca_rank"),
        ({"iterations": 0}, "pca_iterations"),
        ({"mechanism": "exponential"}, "pca_noise"),
    ],
)
def test_bad_pca_arguments(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "rank": 2,
        "iterations": 1,
        "epsilon": 1.0,
        "delta": 1e-8,
        "mechanism": "gaussian",
        "rng": np.random.default_rng(0),
    }
    args.update(kwargs)
    with pytest.raises(MechanismError, match=message):
        pca.private_subspace_iteration(np.zeros((10, 3)), **args)  # type: ignore[arg-type]
