import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from scipy import stats

from app.mechanisms import noise, smooth_synthetic
from app.mechanisms.basis import moments
from app.mechanisms.data import ArraySource
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import GaussianMixture, GaussianMixtureBatch
from app.mechanisms.smooth_synthetic import (
    Measurements,
    default_basis_size,
    measure,
    moments_count,
    paper_basis_size,
    synthesis_sizes,
    synthesize,
    synthesize_from,
    theorem_parameters,
)

ALPHA = 1e-6  # false-failure rate of the statistical assertion


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    """A skewed 3-column dataset in [-1, 1]^3."""
    rng = np.random.default_rng(50)
    n = 800
    return np.clip(
        np.column_stack(
            [rng.beta(2, 5, n) * 2 - 1, np.tanh(rng.normal(0.3, 0.5, n)), rng.uniform(-1, 1, n)]
        ),
        -1,
        1,
    )


# --- parameter rules ---------------------------------------------------------------------


def test_theorem_parameters() -> None:
    p = theorem_parameters(n=569, d=30, smoothness=4)
    assert (p.t, p.N) == (2, 2)
    assert p.m == math.ceil(569 ** (1 + 5 / 64))
    rounding_grid = p.L
    assert rounding_grid == math.ceil(569 ** (34 / 64))
    q = theorem_parameters(n=10**6, d=2, smoothness=4, delta=1e-10)
    lg = math.log(1e10)
    assert q.t == math.ceil(10 ** (6 * 2 / 14) * lg ** (-1 / 14))
    resolution = q.N
    assert resolution == math.ceil(10 ** (6 * 8 / 14) * lg ** (-4 / 14))


def test_paper_basis_rule_on_wdbc() -> None:
    """Appendix A.5 with K = sigma^2 on WDBC (n = 569, d = 30): R = 10, 6, 4, 2, 2."""
    assert [paper_basis_size(569, 30, s * s) for s in (2, 4, 6, 8, 10)] == [10, 6, 4, 2, 2]
    assert default_basis_size(569, 30, 4) == 30
    assert default_basis_size(569, 30, 4, rule="paper") == 10
    assert default_basis_size(10**6, 2, 4) == paper_basis_size(10**6, 2, 4) > 2


# --- measurement -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "steps"),
    [
        ({"grid": "hypercube"}, ["moments"]),
        ({"grid": "hypercube", "delta": 1e-9}, ["moments"]),
        ({"grid": "hypercube", "delta": 1e-9, "noise_mechanism": "laplace_approx"}, ["moments"]),
        ({"grid": "pca_ellipsoid"}, ["moments", "pca_subspace"]),
        ({"grid": "pca_ellipsoid", "delta": 1e-9}, ["moments", "pca_subspace"]),
        (
            {"grid": "pca_ellipsoid", "basis_size": 2, "pca_iterations": 3},
            ["moments", "pca_subspace", "pca_centre"],
        ),
        ({"grid": "full", "basis_size": 9}, ["moments"]),
    ],
)
def test_every_data_dependent_step_is_charged_within_budget(
    data: np.ndarray, kwargs: dict[str, object], steps: list[str]
) -> None:
    delta = float(kwargs.pop("delta", 0.0))  # type: ignore[arg-type]
    m = measure(data, 1.0, delta, rng=np.random.default_rng(0), **kwargs)  # type: ignore[arg-type]
    assert [p.step for p in m.privacy_cost.parts] == steps
    assert m.privacy_cost.epsilon <= 1.0  # strictly, not just within a tolerance
    assert m.privacy_cost.delta <= delta
    assert m.privacy_cost.kind == "dp"
    if "pca_subspace" in steps:
        share = m.parameters["budget"]["pca_subspace"][0]
        assert m.privacy_cost.parts[1].epsilon <= share * (1 + 1e-12)


def test_laplace_moments_scale_is_two_r_over_n_epsilon(data: np.ndarray) -> None:
    m = measure(data, 0.5, basis_size=20, rng=np.random.default_rng(0))
    assert m.moment_noise is not None
    declared = noise.moment_sensitivity(len(data), 20)["l1"]  # 2R/n plus the rounding
    assert m.moment_noise.scale == pytest.approx(declared / 0.5, rel=1e-12)
    assert m.moment_noise.sensitivity == declared
    assert declared == pytest.approx(2 * 20 / len(data), rel=1e-10)
    # the ellipsoid grid leaves 80% of epsilon to the moments
    e = measure(data, 0.5, grid="pca_ellipsoid", basis_size=20, rng=np.random.default_rng(0))
    assert e.moment_noise is not None
    assert e.moment_noise.scale == pytest.approx(declared / 0.4, rel=1e-12)


def test_gaussian_moments_use_the_l2_sensitivity(data: np.ndarray) -> None:
    m = measure(data, 1.0, 1e-9, basis_size=16, rng=np.random.default_rng(0))
    assert m.moment_noise is not None
    assert m.moment_noise.mechanism == "gaussian"
    declared = noise.moment_sensitivity(len(data), 16)["l2"]  # 2 sqrt(R)/n plus rounding
    assert m.moment_noise.sensitivity == declared
    assert declared == pytest.approx(2 * 4 / len(data), rel=1e-10)
    expected = noise.calibrate(
        "gaussian", sensitivity=declared, epsilon=1.0, delta=1e-9, dimension=16
    )
    assert m.moment_noise.scale == pytest.approx(expected.scale, rel=1e-12)


@pytest.mark.slow
def test_noisy_moments_have_the_calibrated_distribution() -> None:
    """KS test of (b_hat - b) / scale against Laplace(1) over R = 3000 moments."""
    X = np.random.default_rng(51).uniform(-1, 1, size=(400, 12))
    m = measure(X, 200.0, basis_size=3000, rng=np.random.default_rng(0))
    assert m.moment_noise is not None
    standardised = (m.moments - moments(X, m.index_set)) / m.moment_noise.scale
    assert stats.kstest(standardised, stats.laplace.cdf).pvalue > ALPHA
    assert stats.kstest(standardised, stats.laplace(scale=1.5).cdf).pvalue < ALPHA


@pytest.mark.parametrize(
    "kwargs",
    [
        {"grid": "hypercube"},
        {"grid": "pca_ellipsoid", "delta": 1e-9, "pca_iterations": 2, "pca_rank": 2},
        {"grid": "pca_ellipsoid", "basis_size": 2},
        {"grid": "full", "basis_size": 5},
    ],
)
def test_measurements_round_trip_through_json(data: np.ndarray, kwargs: dict[str, object]) -> None:
    delta = float(kwargs.pop("delta", 0.0))  # type: ignore[arg-type]
    m = measure(data, 1.0, delta, rng=np.random.default_rng(1), **kwargs)  # type: ignore[arg-type]
    text = json.dumps(m.to_dict())
    back = Measurements.from_dict(json.loads(text))
    assert back.to_dict() == m.to_dict()
    np.testing.assert_array_equal(back.moments, m.moments)
    if m.pca is not None:
        assert back.pca is not None
        np.testing.assert_array_equal(back.pca.axes, m.pca.axes)
        np.testing.assert_array_equal(back.pca.eigenvalues, m.pca.eigenvalues)
    size = None if m.grid == "full" else 500
    a = synthesize_from(m, np.random.default_rng(7), grid_size=size)
    b = synthesize_from(back, np.random.default_rng(7), grid_size=size)
    np.testing.assert_array_equal(a.points, b.points)
    np.testing.assert_array_equal(a.weights, b.weights)


# --- synthesis ---------------------------------------------------------------------------


@pytest.mark.parametrize("grid", ["hypercube", "pca_ellipsoid"])
@pytest.mark.parametrize("solver", ["simplex", "ipm"])
def test_post_processing_is_reproducible(data: np.ndarray, grid: str, solver: str) -> None:
    m = measure(data, 1.0, 1e-9, grid=grid, rng=np.random.default_rng(2))
    # the noise is OpenDP's (not seeded): about 1 release in 300 has every noisy eigenvalue
    # clipped to 0, an ellipsoid of one point that no rng can move; measure again then
    while m.pca is not None and not np.any(m.pca.eigenvalues > 0):
        m = measure(data, 1.0, 1e-9, grid=grid, rng=np.random.default_rng(2))
    a = synthesize_from(m, np.random.default_rng(3), grid_size=800, solver=solver)
    b = synthesize_from(m, np.random.default_rng(3), grid_size=800, solver=solver)
    c = synthesize_from(m, np.random.default_rng(4), grid_size=800, solver=solver)
    np.testing.assert_array_equal(a.points, b.points)
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.rows, b.rows)
    assert not np.array_equal(a.points, c.points)
    assert a.privacy_cost == m.privacy_cost


def test_release_contents(data: np.ndarray) -> None:
    rel = synthesize(
        data,
        epsilon=1.0,
        delta=0.0,
        smoothness=4,
        grid="hypercube",
        grid_size=2000,
        basis_size=None,
        rng=np.random.default_rng(5),
        sample_size=300,
    )
    assert rel.weights.sum() == pytest.approx(1.0)
    assert np.all(rel.weights > 0)
    assert rel.points.shape[0] <= rel.parameters["R"] + 1  # a vertex of the LP
    assert rel.rows.shape == (300, 3)
    assert np.all(np.abs(rel.points) <= 1)
    for key in ("t", "N", "m", "L", "R", "C", "noise", "solver", "budget"):
        assert key in rel.parameters
    assert rel.parameters["C"] == 2000
    assert rel.solver["status"] == "Optimal"
    assert rel.solver["seconds"] > 0
    assert rel.seconds["total"] >= rel.seconds["lp"]
    rows = rel.sample(50, np.random.default_rng(0))
    assert {tuple(r) for r in rows} <= {tuple(p) for p in rel.points}
    q = GaussianMixture(np.zeros((1, 3)), np.ones(1), sigma=2.0)
    assert rel.answer(q) == pytest.approx(float(rel.weights @ q.evaluate(rel.points)))
    assert 0 < rel.answer_rows(q) <= 1
    json.dumps(rel.parameters)
    json.dumps(rel.solver)


def test_full_grid_follows_theorem_3_1() -> None:
    X = np.random.default_rng(52).uniform(-1, 1, size=(2000, 2))
    rel = synthesize(X, epsilon=1.0, grid="full", rng=np.random.default_rng(0))
    p = theorem_parameters(2000, 2, 4)
    assert rel.parameters["C"] == p.N**2
    assert rel.measurements.index_set.kind == "full_tensor"
    assert rel.measurements.index_set.size == p.t**2 - 1
    assert rel.parameters["snapped_to_grid"] is True
    rounded = synthesize_from(rel.measurements, np.random.default_rng(0), rounding=p.L)
    assert rounded.parameters["rounding"] == p.L


def test_error_falls_as_r_and_c_grow_without_noise() -> None:
    """Noise off (test-only path): worst error over 300 smooth queries, known distribution."""
    rng = np.random.default_rng(53)
    n = 20_000
    X = np.clip(
        np.column_stack([rng.beta(2, 5, n) * 2 - 1, np.tanh(rng.normal(0.3, 0.5, n))]), -1, 1
    )
    queries = GaussianMixtureBatch.random(300, 3, 2, 0.5, np.random.default_rng(1))
    truth = queries.answers(X)

    def error(R: int, C: int) -> float:
        """Mean over three candidate draws of the worst-case error."""
        m = smooth_synthetic._measure_without_noise(X, basis_size=R)
        assert m.privacy_cost.kind == "non_private"
        worst = []
        for seed in range(3):
            rel = synthesize_from(m, np.random.default_rng(seed), grid_size=C, sample_size=1)
            worst.append(np.max(np.abs(queries.answers(rel.points, rel.weights) - truth)))
        return float(np.mean(worst))

    by_R = [error(R, 5000) for R in (2, 5, 20, 44)]  # total degree <= 1, 2, 5, 8
    assert by_R[0] > by_R[1] > by_R[2] > by_R[3]
    assert by_R[3] < by_R[0] / 100
    by_C = [error(44, C) for C in (10, 100, 1000)]
    assert by_C[0] > 5 * by_C[1]
    assert by_C[1] > 5 * by_C[2]


def test_non_private_measurements_cannot_be_stored(data: np.ndarray) -> None:
    m = smooth_synthetic._measure_without_noise(data, grid="pca_ellipsoid")
    with pytest.raises(MechanismError, match="only differentially private"):
        m.to_dict()


# --- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0.0,), {}, "epsilon"),
        ((-1.0,), {}, "epsilon"),
        ((1.0, 1.0), {}, "delta"),
        ((1.0, -0.1), {}, "delta"),
        ((1.0,), {"grid": "sphere"}, "grid"),
        ((1.0,), {"smoothness": 0}, "smoothness"),
        ((1.0,), {"basis_size": 0}, "basis_size"),
        ((1.0,), {"basis_size": 10**6}, "basis_size R"),
        ((1.0,), {"noise_mechanism": "gaussian"}, "needs delta > 0"),
        ((1.0,), {"noise_mechanism": "staircase"}, "noise_mechanism"),
        ((1.0,), {"grid": "pca_ellipsoid", "pca_share": 1.5}, "share"),
        ((1.0,), {"grid": "pca_ellipsoid", "pca_rank": 9}, "pca_rank"),
        ((1.0,), {"grid": "pca_ellipsoid", "pca_noise": "gaussian"}, "needs delta > 0"),
        ((1.0,), {"basis_rule": "largest"}, "basis_rule"),
    ],
)
def test_bad_measure_arguments(
    data: np.ndarray, args: tuple[float, ...], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(MechanismError, match=message):
        measure(data, *args, **kwargs)  # type: ignore[arg-type]


class _LoggedSource:
    """The rows of ``X``; every read of them is logged in ``events``."""

    def __init__(self, X: np.ndarray, events: list[str]) -> None:
        self.X, self.events = X, events
        self.n_rows, self.n_cols = X.shape

    def batches(self) -> Iterator[np.ndarray]:
        self.events.append("read")
        yield from ArraySource(self.X).batches()


@pytest.mark.parametrize(
    ("kwargs", "calibrations"),
    [
        ({"noise_mechanism": "laplace_approx"}, 1),
        ({"noise_mechanism": "gaussian"}, 1),
        # PCA and a measured centre (R = 2 < d = 3 lacks a first-degree moment)
        ({"grid": "pca_ellipsoid", "basis_size": 2, "pca_noise": "gaussian"}, 3),
    ],
)
def test_every_noise_calibration_is_fixed_before_a_row_is_read(
    data: np.ndarray,
    monkeypatch: pytest.MonkeyPatch,
    kwargs: dict[str, Any],
    calibrations: int,
) -> None:
    """measure calibrates every step's noise from public values first, as
    marginal_tree.plan does: a calibration that fails does so before the data are read
    (an audit saw the moments read, then their laplace_approx calibration fail)."""
    events: list[str] = []
    calibrate = noise.calibrate

    def logged(*args: Any, **kw: Any) -> noise.NoiseCalibration:
        events.append("calibrate")
        return calibrate(*args, **kw)

    monkeypatch.setattr(noise, "calibrate", logged)
    measurements = measure(
        _LoggedSource(data, events), 1.0, 1e-6, rng=np.random.default_rng(3), **kwargs
    )
    first_read = events.index("read")
    assert events[:first_read] == ["calibrate"] * calibrations
    assert "calibrate" not in events[first_read:]
    assert (
        measurements.moment_noise
        == smooth_synthetic.noise_plan(data.shape[0], data.shape[1], 1.0, 1e-6, **kwargs).moments
    )


def test_a_budget_no_noise_scale_fits_fails_before_a_row_is_read(
    data: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A calibration that cannot be made fails before the data are read, with a message
    that says which noise and which budget (and no data value)."""
    events: list[str] = []

    def overspends(mechanism: str, scale: float, *args: object) -> tuple[float, float]:
        return math.inf, 1e-6

    monkeypatch.setattr(noise, "cost_of_scale", overspends)
    with pytest.raises(MechanismError) as refused:
        measure(
            _LoggedSource(data, events),
            1.0,
            1e-6,
            basis_size=3,
            noise_mechanism="laplace_approx",
        )
    assert events == []
    assert str(refused.value).startswith(
        "the noise of the R = 3 moments (noise_mechanism 'laplace_approx') cannot be "
        "calibrated: no noise scale fits the budget: epsilon = 1 at delta = 1e-06 for 3 "
        "value(s) of sensitivity 0.0025 (laplace_approx noise)"
    )


def test_noise_plan_is_the_plan_of_measure() -> None:
    """The public plan knows without building the index set whether the ellipsoid's centre
    is measured (R < d) and how many moments are released."""
    for d, R, centre in ((3, 2, True), (3, 3, False), (5, 40, False)):
        X = np.zeros((50, d))
        plan = smooth_synthetic.noise_plan(
            50, d, 1.0, 1e-6, grid="pca_ellipsoid", basis_size=R, pca_noise="gaussian"
        )
        assert plan.R == R
        assert (plan.pca_centre is not None) == centre
        measured = measure(X, 1.0, 1e-6, grid="pca_ellipsoid", basis_size=R, pca_noise="gaussian")
        assert measured.moment_noise == plan.moments
        assert measured.pca is not None
        assert measured.pca.calibration == plan.pca_subspace
        assert measured.centre_noise == plan.pca_centre


def test_bad_data_is_rejected_without_leaking_values() -> None:
    with pytest.raises(MechanismError, match="empty"):
        measure(np.zeros((0, 3)), 1.0)
    bad = np.full((10, 2), 0.5)
    bad[3, 1] = 1.2345678
    with pytest.raises(MechanismError, match="outside") as info:
        measure(bad, 1.0)
    assert "1.23" not in str(info.value)
    with pytest.raises(MechanismError, match="non-finite"):
        measure(np.full((4, 2), np.nan), 1.0)


def test_oversized_synthesis_is_refused(data: np.ndarray) -> None:
    big = measure(data, 1.0, basis_size=2000, rng=np.random.default_rng(0))
    with pytest.raises(MechanismError, match=r"R = 2000 moments and C = 100000 .* GiB"):
        synthesize_from(big, np.random.default_rng(0), grid_size=100_000)
    m = measure(data, 1.0, rng=np.random.default_rng(0))
    with pytest.raises(MechanismError, match=r"C = 100 candidates .* more than 9\.8 KiB"):
        synthesize_from(m, np.random.default_rng(0), grid_size=100, max_bytes=10_000)
    with pytest.raises(MechanismError, match="sample_size"):
        synthesize_from(m, np.random.default_rng(0), grid_size=100, sample_size=10**9)
    with pytest.raises(MechanismError, match="grid_size"):
        synthesize_from(m, np.random.default_rng(0), grid_size=0)
    with pytest.raises(MechanismError, match="solver"):
        synthesize_from(m, np.random.default_rng(0), solver="cplex")
    full = measure(data, 1.0, grid="full", basis_size=4, rng=np.random.default_rng(0))
    with pytest.raises(MechanismError, match="grid 'full' uses its N\\^d grid points"):
        synthesize_from(full, np.random.default_rng(0), grid_size=100)


@pytest.mark.parametrize(
    ("grid", "basis_size"), [("hypercube", None), ("hypercube", 17), ("full", None), ("full", 5)]
)
def test_moments_count_is_the_number_measure_releases(
    data: np.ndarray, grid: str, basis_size: int | None
) -> None:
    """The size checks run before any data is read: ``moments_count`` must be the ``R``
    that ``measure`` then releases, and ``synthesis_sizes`` the sizes the synthesis uses."""
    n, d = data.shape
    released = measure(data, 1.0, grid=grid, basis_size=basis_size, rng=np.random.default_rng(3))
    R = moments_count(n, d, 4, 0.0, grid, basis_size)
    assert released.index_set.size == R
    theorem = theorem_parameters(n, d, 4)
    C, N, m = synthesis_sizes(d, R, grid, theorem, sample_size=50)
    synthetic = synthesize_from(released, np.random.default_rng(3), sample_size=50)
    assert (C, N or None, m) == (
        synthetic.parameters["C"],
        synthetic.parameters["grid_resolution"],
        synthetic.rows.shape[0],
    )


def test_moments_past_the_entries_limit_are_refused_or_lowered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R x d of the moments' index set is held to MAX_INDEX_SET_ENTRIES from public values
    (an audit: basis_size 10^5 on 2000 columns built a 1.6 GB array in the worker): a
    basis_size past it is refused naming the largest for this d, a default lowered."""
    from app.mechanisms import basis

    assert moments_count(10**6, 30, 4, 0.0, "hypercube") > 20
    monkeypatch.setattr(basis, "MAX_INDEX_SET_ENTRIES", 30 * 20)
    assert moments_count(10**6, 30, 4, 0.0, "hypercube") == 20
    assert moments_count(10**6, 30, 4, 0.0, "hypercube", 20) == 20
    with pytest.raises(MechanismError, match="at most basis_size = 20 for 30 columns"):
        moments_count(569, 30, 4, 0.0, "hypercube", 21)
    monkeypatch.setattr(basis, "MAX_INDEX_SET_ENTRIES", 2 * 7)
    with pytest.raises(
        MechanismError, match=r"basis size 8 over 2 columns .* at most basis_size = 7 for 2 columns"
    ):
        moments_count(569, 2, 4, 0.0, "full")  # t = 3: 3^2 - 1


def test_sizes_that_cannot_fit_are_refused_before_measuring() -> None:
    """A full tensor basis or full grid on many columns is refused from public values."""
    with pytest.raises(MechanismError, match=r"t\^d - 1 = 2\^30 - 1 moments"):
        moments_count(569, 30, 4, 0.0, "full")
    theorem = theorem_parameters(569, 30, 4)
    with pytest.raises(MechanismError, match=r"N\^d = \d+\^30 candidate points"):
        synthesis_sizes(30, 30, "full", theorem)
    with pytest.raises(MechanismError, match="basis_size R"):
        moments_count(569, 30, 4, 0.0, "hypercube", 10**6)
    assert synthesis_sizes(30, 30, "hypercube", theorem) == (10_000, 0, theorem.m)
