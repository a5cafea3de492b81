"""Noisy one-dimensional histograms (app.mechanisms.marginals): sensitivity, noise,
projection, synthesis and accuracy on a known distribution."""

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.optimize import lsq_linear

from app.mechanisms import chebyshev, marginals, noise
from app.mechanisms.data import as_source
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import GaussianMixtureBatch
from tests.mechanisms.conftest import log_calls


@pytest.mark.parametrize("atoms", [False, True])
def test_histogram_sensitivity_bounds_every_neighbour_pair_and_is_attained(atoms: bool) -> None:
    rng = np.random.default_rng(1)
    n, d, B = 40, 5, 7
    X = rng.uniform(-1, 1, size=(n, d))
    X[:3, 0] = -1.0  # mass on the bounds, so the atoms are exercised
    X[3:5, 1] = 1.0
    sens = marginals.histogram_sensitivity(n, d)
    h = marginals.exact_histograms(as_source(X), B, atoms)
    worst_l1 = worst_l2 = 0.0
    for _ in range(300):
        Y = X.copy()
        i = rng.integers(n)
        Y[i] = rng.choice([-1.0, 1.0, rng.uniform(-1, 1)], size=d)
        diff = marginals.exact_histograms(as_source(Y), B, atoms) - h
        worst_l1 = max(worst_l1, np.abs(diff).sum())
        worst_l2 = max(worst_l2, np.sqrt((diff**2).sum()))
    assert worst_l1 <= sens["l1"] + 1e-12
    assert worst_l2 <= sens["l2"] + 1e-12
    # attained: a row moved to another cell in every column
    Y = X.copy()
    Y[10] = np.where(X[10] < 0, 0.99, -0.99)
    diff = marginals.exact_histograms(as_source(Y), B, atoms) - h
    assert np.abs(diff).sum() == pytest.approx(sens["l1"])
    assert np.sqrt((diff**2).sum()) == pytest.approx(sens["l2"])


def test_exact_histograms_count_the_bounds_as_atoms() -> None:
    X = np.array([[-1.0], [-0.99], [0.0], [1.0], [1.0]])
    with_atoms = marginals.exact_histograms(as_source(X), 2, True)
    np.testing.assert_allclose(with_atoms, [[0.2, 0.2, 0.2, 0.4]])
    without = marginals.exact_histograms(as_source(X), 2, False)
    np.testing.assert_allclose(without, [[0.4, 0.6]])


def test_projection_onto_the_simplex_meets_the_kkt_conditions() -> None:
    rng = np.random.default_rng(2)
    for _ in range(200):
        v = rng.normal(0.1, 0.3, size=rng.integers(1, 12))
        p = marginals.project_to_simplex(v)
        assert np.all(p >= 0)
        assert p.sum() == pytest.approx(1.0)
        theta = (v - p)[p > 0]
        assert np.ptp(theta) < 1e-9  # one threshold on the support
        assert np.all(v[p == 0] <= theta[0] + 1e-9)  # and nothing above it left out
    np.testing.assert_allclose(marginals.project_to_simplex([0.2, 0.3, 0.5]), [0.2, 0.3, 0.5])


def _nearest_with_split(v: np.ndarray, k: int) -> float:
    """Brute force: ``min ||v - x||^2`` over ``x`` non-decreasing on ``[:k]`` and
    non-increasing on ``[k:]``, as bounded least squares in the free levels and the
    non-negative steps (scipy's bounded-variable least squares)."""
    L = v.size
    columns, lower = [], []
    for start, stop, sign in ((0, k, 1.0), (k, L, -1.0)):
        if start == stop:
            continue
        level = np.zeros(L)
        level[start:stop] = 1.0
        columns.append(level)
        lower.append(-np.inf)
        for j in range(start + 1, stop):
            step = np.zeros(L)
            step[j:stop] = sign
            columns.append(step)
            lower.append(0.0)
    A = np.column_stack(columns)
    fit = lsq_linear(A, v, bounds=(lower, np.inf), method="bvls", tol=1e-14)
    return float(np.sum((A @ fit.x - v) ** 2))


def test_unimodal_projection_is_the_nearest_unimodal_vector_brute_force() -> None:
    rng = np.random.default_rng(5)
    for trial in range(120):
        L = 1 + trial % 8
        v = rng.normal(size=L) + (rng.uniform(size=L) if trial % 2 else 0.0)
        fit, distance = marginals.unimodal_projection(v)
        best = min(_nearest_with_split(v, k) for k in range(L + 1))
        assert distance == pytest.approx(best, abs=1e-9)
        assert distance == pytest.approx(float(np.sum((fit - v) ** 2)), abs=1e-12)
        steps = np.sign(np.diff(fit).round(12))
        assert not np.any(np.diff(steps[steps != 0]) > 0)  # never falls, then rises
        assert fit.sum() == pytest.approx(v.sum(), abs=1e-12)
    law = rng.dirichlet(np.ones(9)) - 0.02
    fit, _ = marginals.unimodal_projection(np.maximum(law, 0.0))
    assert np.all(fit >= 0.0)
    peak = np.array([0.0, 0.1, 0.3, 0.3, 0.2, 0.1, 0.0])  # already unimodal: kept
    fit, distance = marginals.unimodal_projection(peak)
    np.testing.assert_array_equal(fit, peak)
    assert distance == 0.0
    np.testing.assert_allclose(marginals.unimodal_projection([1.0, 0.0, 1.0])[0], [1, 0.5, 0.5])
    with pytest.raises(MechanismError, match="finite"):
        marginals.unimodal_projection([0.1, np.nan])


@pytest.mark.parametrize(("delta", "metric"), [(0.0, "l1"), (1e-9, "l2")])
def test_noise_is_calibrated_to_the_histogram_sensitivity(delta: float, metric: str) -> None:
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, size=(500, 4))
    m = marginals.measure(X, 0.7, delta, bins=6)
    sens = marginals.histogram_sensitivity(500, 4)[metric]
    assert m.calibration.sensitivity == sens
    exact = {"l1": 2 * 4 / 500, "l2": math.sqrt(2 * 4) / 500}[metric]
    assert exact < sens < exact * (1 + 1e-12)  # plus the rounding of counts / n
    if delta == 0.0:
        assert m.calibration.scale == pytest.approx(sens / 0.7, rel=1e-9)
    assert m.privacy_cost.epsilon <= 0.7
    assert m.privacy_cost.delta <= delta
    assert m.frequencies.shape == (4, 6 + 2 * m.atoms)


def test_noise_has_the_calibrated_spread() -> None:
    """Noisy minus exact over 40 x 25 frequencies; false failure well below 1e-6."""
    rng = np.random.default_rng(4)
    X = rng.uniform(-0.9, 0.9, size=(2000, 40))
    m = marginals.measure(X, 1.0, 1e-6, bins=25, bound_atoms=False)
    residual = (m.frequencies - marginals.exact_histograms(as_source(X), 25, False)).ravel()
    sd = m.calibration.stddev
    assert abs(residual.mean()) < 5 * sd / math.sqrt(residual.size)
    assert residual.std() == pytest.approx(sd, rel=0.15)


def test_synthesis_reproduces_the_projected_marginals() -> None:
    rng = np.random.default_rng(5)
    X = np.clip(rng.normal(0.3, 0.2, size=(3000, 3)), -1, 1)
    X[:600, 2] = 1.0
    m = marginals.measure(X, 5.0, 1e-6, bins=8, bound_atoms=True)
    release = marginals.synthesize_from(m, np.random.default_rng(0), grid_size=4000)
    assert release.points.shape == (4000, 3)
    assert np.all(np.abs(release.points) <= 1.0)
    assert release.weights.sum() == pytest.approx(1.0)
    cells = marginals.exact_histograms(as_source(release.points), 8, True)
    np.testing.assert_allclose(cells, m.marginals(), atol=1.0 / 4000 + 1e-12)
    again = marginals.synthesize_from(m, np.random.default_rng(0), grid_size=4000)
    np.testing.assert_array_equal(again.points, release.points)  # post-processing is seeded


def test_systematic_counts_sum_to_C_and_stay_within_one() -> None:
    rng = np.random.default_rng(6)
    for _ in range(100):
        p = rng.dirichlet(np.ones(rng.integers(2, 10)))
        counts = marginals._systematic_counts(p, 997, rng)
        assert counts.sum() == 997
        assert np.all(np.abs(counts - 997 * p) < 1.0)


def test_small_noise_answers_smooth_queries_far_better_than_the_uniform_baseline() -> None:
    rng = np.random.default_rng(7)
    X = 2.0 * rng.beta(2.0, 5.0, size=(20_000, 4)) - 1.0  # independent skewed columns
    queries = GaussianMixtureBatch.random(300, 10, 4, 1.0, np.random.default_rng(8))
    truth = queries.answers(X)
    baseline = np.max(np.abs(queries.uniform_expectations() - truth) / truth)
    release = marginals.synthesize(X, 20.0, 1e-6, rng=np.random.default_rng(9))
    error = np.max(np.abs(queries.answers(release.points, release.weights) - truth) / truth)
    assert error < 0.05 * baseline


def test_default_bins_follow_the_noise_level() -> None:
    small = marginals.default_bins(500, 30, 1.0, 1e-9)
    large = marginals.default_bins(50_000, 30, 1.0, 1e-9)
    assert marginals.MIN_BINS <= small < large <= marginals.MAX_BINS


def test_default_bins_grow_with_the_width_at_equal_noise() -> None:
    """``B ~ d^{1/3} tau^{-2/3}``: ``(n, d)`` and ``(2n, 4d)`` have the same per-frequency
    noise (``tau ~ sqrt(d) / n``), and the wider table gets ``4^{1/3}`` times the bins."""
    tau = marginals.noise_stddev(1000, 10, 1.0, 1e-9)
    assert marginals.noise_stddev(2000, 40, 1.0, 1e-9) == pytest.approx(tau)
    narrow = marginals.default_bins(1000, 10, 1.0, 1e-9)
    wide = marginals.default_bins(2000, 40, 1.0, 1e-9)
    assert wide / narrow == pytest.approx(4 ** (1 / 3), rel=0.1)
    # the benchmark tables (bench/results/smooth_marginals*.md), eps = 1, delta = 1e-9
    sizes = {"WDBC": (569, 30), "CTG": (2126, 21), "PKS": (5875, 21), "CRM": (1994, 100)}
    bins = {k: marginals.default_bins(n, d, 1.0, 1e-9) for k, (n, d) in sizes.items()}
    assert bins == {"WDBC": 6, "CTG": 15, "PKS": 29, "CRM": 14}


def test_json_round_trip_is_exact() -> None:
    X = np.random.default_rng(10).uniform(-1, 1, size=(100, 2))
    m = marginals.measure(X, 1.0, 0.0, bins=3)
    again = marginals.MarginalMeasurements.from_dict(m.to_dict())
    np.testing.assert_array_equal(again.frequencies, m.frequencies)
    assert again.to_dict() == m.to_dict()
    with pytest.raises(MechanismError, match="format"):
        marginals.MarginalMeasurements.from_dict({"format": "other"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"bins": 1}, "bins"),
        ({"bins": 2.5}, "bins"),
        ({"X": np.full((3, 2), 1.5)}, "outside"),
        ({"X": np.empty((0, 2))}, "empty"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, message: str) -> None:
    args = {"X": np.zeros((10, 2)), "epsilon": 1.0, "delta": 0.0, "bins": 4} | kwargs
    with pytest.raises(MechanismError, match=message):
        marginals.measure(**args)


def test_bad_support_size_is_refused() -> None:
    m = marginals.measure(np.zeros((10, 2)), 1.0, 0.0, bins=4)
    with pytest.raises(MechanismError, match="grid_size"):
        marginals.synthesize_from(m, np.random.default_rng(0), grid_size=0)


def _noise_free_measurements(
    frequencies: np.ndarray, atoms: bool
) -> marginals.MarginalMeasurements:
    """Test-only: given cell frequencies (rows summing to 1) with a negligible noise law, so
    ``marginals()`` returns them unchanged."""
    d, cells = frequencies.shape
    calibration = noise.calibrate(
        "gaussian", sensitivity=1e-12, epsilon=1.0, delta=1e-9, dimension=d * cells
    )
    return marginals.MarginalMeasurements(
        n=1000,
        d=d,
        epsilon=1.0,
        delta=1e-9,
        bins=cells - 2 * atoms,
        atoms=atoms,
        frequencies=frequencies,
        calibration=calibration,
    )


@pytest.mark.parametrize("atoms", [True, False])
def test_chebyshev_moments_integrate_the_piecewise_uniform_law(atoms: bool) -> None:
    """E T_k under atoms at the bounds plus a uniform density in each bin, against
    quadrature of T_k over each bin (scipy.integrate.quad), k < 12."""
    rng = np.random.default_rng(4)
    B = 5
    p = rng.dirichlet(np.ones(B + 2 * atoms), size=3)
    meas = _noise_free_measurements(p, atoms)
    np.testing.assert_allclose(meas.marginals(), p, atol=1e-12)
    moments = meas.chebyshev_moments(12)
    edges = np.linspace(-1, 1, B + 1)
    for i in range(3):
        bins = p[i, 1 : B + 1] if atoms else p[i]
        for k in range(12):
            expected = sum(
                bins[b]
                / (edges[b + 1] - edges[b])
                * integrate.quad(lambda x, k=k: math.cos(k * math.acos(x)), edges[b], edges[b + 1])[
                    0
                ]
                for b in range(B)
            )
            if atoms:
                expected += p[i, 0] * (-1) ** k + p[i, -1]
            assert moments[i, k] == pytest.approx(expected, abs=1e-12)


def test_expectations_are_the_product_law_of_the_support() -> None:
    """Exact answers under the product of the estimated marginals agree with the answers
    of a 4 10^5-point support drawn from it (Monte Carlo, measured max gap 3.5e-4 with
    seed 0: band 2e-3) and with a closed form for one Gaussian factor per column
    (erf over each bin), to 1e-12."""
    rng = np.random.default_rng(0)
    X = np.clip(rng.normal(0.2, 0.4, size=(20000, 4)), -1, 1)
    meas = marginals.measure(X, 50.0, 1e-6, bins=12, bound_atoms=True)
    batch = GaussianMixtureBatch.random(50, 3, 4, 0.5, rng)
    expansion = chebyshev.gaussian_expansion(batch.centers, batch.weights, 0.5)
    exact = meas.expectations(expansion)
    support = marginals.synthesize_from(meas, rng, grid_size=400_000)
    assert np.max(np.abs(exact - batch.answers(support.points, support.weights))) < 2e-3
    # one kernel: prod_i [atoms + sum_b p_b mean_{bin b} exp(-(x - c_i)^2 / (2 s^2))]
    c, s = batch.centers[0, 0], 0.5
    probabilities = meas.marginals()
    edges = np.linspace(-1, 1, 13)
    closed = 1.0
    for i in range(4):
        g = lambda x, i=i: math.exp(-((x - c[i]) ** 2) / (2 * s * s))  # noqa: E731
        value = probabilities[i, 0] * g(-1.0) + probabilities[i, -1] * g(1.0)
        for b in range(12):
            lo, hi = (
                (edges[b] - c[i]) / (s * math.sqrt(2)),
                (edges[b + 1] - c[i]) / (s * math.sqrt(2)),
            )
            mean = s * math.sqrt(math.pi / 2) * (math.erf(hi) - math.erf(lo)) / (2 / 12)
            value += probabilities[i, b + 1] * mean
        closed *= value
    one = chebyshev.gaussian_expansion(batch.centers[:1, :1], np.ones((1, 1)), 0.5)
    assert meas.expectations(one)[0] == pytest.approx(closed, rel=1e-12)
    with pytest.raises(MechanismError, match="d = 3 columns"):
        meas.expectations(chebyshev.gaussian_expansion(np.zeros((1, 1, 3)), np.ones((1, 1)), 0.5))


def test_gaussian_product_queries_are_the_exact_integral_under_the_marginal_law() -> None:
    """Batched Gaussian1D product queries (separable_blocks) against the closed form under
    each column's law (atoms at the bounds, uniform in each bin):
    ``(1/(b-a)) int_a^b exp(-(x-c)^2/(2s^2)) dx = s sqrt(pi/2) [erf((b-c)/(s sqrt 2)) -
    erf((a-c)/(s sqrt 2))] / (b-a)``, and against the former closure path (callables)."""
    from scipy.special import erf

    from app.mechanisms.queries import Gaussian1D, ProductQuery

    rng = np.random.default_rng(51)
    X = np.clip(rng.normal([0.3, -0.6, 0.0], [0.2, 0.3, 0.5], size=(400, 3)), -1, 1)
    measured = marginals.measure(X, 2.0, bins=16, bound_atoms=True)
    probabilities = measured.marginals()
    edges = np.linspace(-1.0, 1.0, measured.bins + 1)
    queries, closures, exact = [], [], []
    for q in range(60):
        i = q % 3
        c, s = float(rng.uniform(-1.2, 1.2)), float(rng.choice([0.02, 0.1, 0.45, 2.0]))
        factors: list[object] = [None, None, None]
        factors[i] = Gaussian1D(c, s)
        queries.append(ProductQuery(tuple(factors), weight=1.5))  # type: ignore[arg-type]
        factors[i] = lambda x, c=c, s=s: np.exp(-((x - c) ** 2) / (2 * s * s))
        closures.append(ProductQuery(tuple(factors), weight=1.5))  # type: ignore[arg-type]
        g = lambda x, c=c, s=s: np.exp(-((x - c) ** 2) / (2 * s * s))  # noqa: E731
        a, b = edges[:-1], edges[1:]
        scale = s * math.sqrt(2.0)
        bins = s * math.sqrt(math.pi / 2) * (erf((b - c) / scale) - erf((a - c) / scale)) / (b - a)
        p = probabilities[i]
        exact.append(1.5 * (p[0] * g(-1.0) + p[1:-1] @ bins + p[-1] * g(1.0)))
    values = np.full(len(queries), np.nan)
    for positions, expansion in chebyshev.separable_blocks(queries, 3, block=25):
        values[positions] = measured.expectations(expansion)
    np.testing.assert_allclose(values, exact, rtol=0, atol=1e-12)
    former = np.full(len(queries), np.nan)
    for positions, expansion in chebyshev.separable_blocks(closures, 3):
        former[positions] = measured.expectations(expansion)
    np.testing.assert_allclose(values, former, rtol=0, atol=1e-12)


def test_resolve_calibrates_once_per_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """``resolve`` reads the per-frequency noise for the bins and for the atoms; OpenDP's
    calibration behind it (about a second at large delta) runs once per ``(n, d, epsilon,
    delta)``, and a bad budget is refused every time, not cached."""
    calls: list[tuple[float, float]] = []
    calibrate = noise.calibrate

    def counted(*args: object, **kwargs: object) -> noise.NoiseCalibration:
        calls.append((kwargs["epsilon"], kwargs["delta"]))  # type: ignore[arg-type]
        return calibrate(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(noise, "calibrate", counted)
    marginals.noise_stddev.cache_clear()
    first = marginals.resolve(777, 7, 0.7, 1e-7)
    assert calls == [(0.7, 1e-7)]
    assert marginals.resolve(777, 7, 0.7, 1e-7) == first
    assert calls == [(0.7, 1e-7)]
    marginals.noise_stddev.cache_clear()
    assert (
        marginals.noise_stddev(777, 7, 0.7, 1e-7)
        == calibrate(
            "gaussian",
            sensitivity=marginals.histogram_sensitivity(777, 7)["l2"],
            epsilon=0.7,
            delta=1e-7,
            dimension=7,
        ).stddev
    )
    for _ in range(2):
        with pytest.raises(MechanismError):
            marginals.noise_stddev(777, 7, -1.0, 1e-7)


@pytest.mark.parametrize("delta", [0.0, 1e-9])
def test_measure_calibrates_once_before_the_rows_are_read(
    monkeypatch: pytest.MonkeyPatch, delta: float
) -> None:
    """The histograms' noise is calibrated from public values before the rows are read,
    and the draw uses that calibration (no second calibration after the read)."""
    events: list[object] = []
    log_calls(monkeypatch, noise, "calibrate", events, lambda *a, **k: k["dimension"])
    log_calls(monkeypatch, marginals, "exact_histograms", events, lambda *a, **k: "read")
    X = np.random.default_rng(6).uniform(-1, 1, size=(300, 3))
    m = marginals.measure(X, 0.9, delta, bins=5, bound_atoms=False)
    assert events[-2:] == [3 * 5, "read"], events
    assert events.count(3 * 5) == 1
    assert m.calibration == marginals.noise_calibration(300, 3, 0.9, delta, 5)
