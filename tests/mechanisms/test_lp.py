import itertools

import numpy as np
import pytest

from app.mechanisms import lp as lp_module
from app.mechanisms.errors import MechanismError, SolverError
from app.mechanisms.lp import fit_weights, lp_bytes, round_to_grid


def brute_force_minimum(W: np.ndarray, b: np.ndarray, steps: int) -> float:
    """min ||W u - b||_1 over the grid {u = k/steps, sum u = 1} of the 2-simplex."""
    pairs = np.array([(i, j) for i, j in itertools.product(range(steps + 1), repeat=2)])
    pairs = pairs[pairs.sum(axis=1) <= steps]
    U = np.column_stack([pairs, steps - pairs.sum(axis=1)]) / steps
    return float(np.min(np.abs(U @ W.T - b).sum(axis=1)))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("solver", ["simplex", "ipm"])
def test_tiny_instance_matches_brute_force(seed: int, solver: str) -> None:
    rng = np.random.default_rng(seed)
    W = rng.uniform(-1, 1, size=(2, 3))
    b = rng.uniform(-1.5, 1.5, size=2)  # usually outside the hull: positive optimum
    steps = 400
    grid_min = brute_force_minimum(W, b, steps)
    solution = fit_weights(W, b, solver=solver)
    # f is Lipschitz with constant max_k ||W_k||_1 <= R = 2 in the L1 distance of u, and
    # every u is within L1 distance 4/steps of the grid (floor two coordinates, fix the third)
    assert solution.objective <= grid_min + 1e-7
    assert solution.objective >= grid_min - 2 * 4 / steps
    assert solution.weights.sum() == pytest.approx(1.0)
    assert np.all(solution.weights >= 0)
    assert solution.status == "Optimal"


def test_vertex_and_interior_solutions() -> None:
    rng = np.random.default_rng(3)
    R, C = 6, 400
    W = np.cos(rng.uniform(0, 3, size=(R, C)))
    b = W @ rng.dirichlet(np.ones(C))  # inside the hull: optimum 0, a whole face of optima
    vertex = fit_weights(W, b, solver="simplex")
    interior = fit_weights(W, b, solver="ipm")
    assert vertex.objective == pytest.approx(0.0, abs=1e-9)
    assert interior.objective == pytest.approx(0.0, abs=1e-7)
    assert np.count_nonzero(vertex.weights) <= R + 1
    assert np.count_nonzero(interior.weights > 1e-9) > 10 * (R + 1)
    assert vertex.info()["support_size"] <= R + 1
    assert vertex.seconds > 0
    assert vertex.iterations > 0


def test_exact_zeros_in_w_are_handled() -> None:
    W = np.array([[0.0, 1.0, -1.0], [1.0, 0.0, 0.0]])
    solution = fit_weights(W, np.array([0.5, 0.25]))
    np.testing.assert_allclose(W @ solution.weights, [0.5, 0.25], atol=1e-9)


def test_solver_failure_is_a_solver_error() -> None:
    rng = np.random.default_rng(4)
    W = np.cos(rng.uniform(0, 3, size=(200, 10_000)))
    b = rng.normal(0, 0.3, size=200)
    with pytest.raises(SolverError, match="Time limit"):
        fit_weights(W, b, time_limit=0.02)


@pytest.mark.parametrize(
    ("W", "b", "kwargs", "message"),
    [
        (np.zeros((0, 3)), np.zeros(0), {}, "non-empty"),
        (np.zeros((2, 3)), np.zeros(3), {}, r"shape \(2,\)"),
        (np.full((2, 3), np.nan), np.zeros(2), {}, "finite"),
        (np.zeros((2, 3)), np.zeros(2), {"solver": "barrier"}, "solver"),
        (np.zeros((2, 3)), np.zeros(2), {"time_limit": -1.0}, "time_limit"),
    ],
)
def test_bad_arguments(W: np.ndarray, b: np.ndarray, kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(MechanismError, match=message):
        fit_weights(W, b, **kwargs)


def test_round_to_grid() -> None:
    np.testing.assert_array_equal(
        round_to_grid(np.array([0.26, -0.74, 1.7, -3.0]), 4), [0.25, -0.75, 1.0, -1.0]
    )
    with pytest.raises(MechanismError, match="positive integer"):
        round_to_grid(np.zeros(2), 0)


def test_memory_estimate_grows_with_r_times_c() -> None:
    assert lp_bytes(30, 10_000) < 40 * 2**20
    assert lp_bytes(30, 10_000, "ipm") > lp_bytes(30, 10_000)
    assert lp_bytes(10_000, 50_000) > 4 * 2**30


@pytest.mark.parametrize(
    ("failing", "expected"),
    [
        (lambda presolve, crossover: presolve == "off", "presolve"),
        (lambda presolve, crossover: not crossover, "crossover"),
    ],
)
def test_ipm_retries_then_falls_back_to_crossover(
    monkeypatch: pytest.MonkeyPatch,
    failing,
    expected: str,  # type: ignore[no-untyped-def]
) -> None:
    """Attempts that stop early (here forced by a tiny time limit) are retried."""
    real = lp_module._solve

    def flaky(matrix, target, solver, presolve, crossover, time_limit):  # type: ignore[no-untyped-def]
        limit = 1e-9 if failing(presolve, crossover) else time_limit
        return real(matrix, target, solver, presolve, crossover, limit)

    rng = np.random.default_rng(5)
    W = np.cos(rng.uniform(0, 3, size=(8, 300)))
    b = rng.normal(0, 0.5, size=8)
    reference = fit_weights(W, b, solver="simplex")
    monkeypatch.setattr(lp_module, "_solve", flaky)
    solution = fit_weights(W, b, solver="ipm")
    assert solution.fallback == expected
    assert solution.status == "Optimal"
    assert solution.objective == pytest.approx(reference.objective, abs=1e-7)
    if expected == "crossover":
        assert np.count_nonzero(solution.weights) <= 8 + 1
