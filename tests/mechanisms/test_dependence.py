"""The co-spread statistic (``app.mechanisms.dependence``) and the synopsis' dependence
correction: brute-force identities, the sensitivity bound, the budget split, the
correction's accuracy on dependent data and the JSON forms."""

import itertools
import json
import math

import numpy as np
import pytest

from app.mechanisms import dependence, noise
from app.mechanisms import smooth_synopsis as ss
from app.mechanisms.basis import axis_total_degree, count_total_degree, total_degree
from app.mechanisms.chebyshev import gaussian_expansion, product_expansions, stack_expansions
from app.mechanisms.data import as_source
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import Gaussian1D, GaussianMixtureBatch, Polynomial, ProductQuery
from tests.mechanisms.conftest import exact_synopsis as shared_exact_synopsis
from tests.mechanisms.conftest import log_calls


def one_factor(n: int, d: int, rng: np.random.Generator, loading: float = 1.0) -> np.ndarray:
    """Columns sharing one Gaussian factor, squashed into [-1, 1]."""
    return np.tanh(0.5 * (loading * rng.normal(size=(n, 1)) + rng.normal(size=(n, d))))


def co_spread_data(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """Columns sharing a random spread: ``tanh(S eps_i)``, ``log S ~ N(0, 0.6^2)``
    (``Cov(x_i, x_j) = 0`` but ``Cov(x_i^2, x_j^2) > 0``)."""
    spread = np.exp(0.6 * rng.normal(size=(n, 1)))
    return np.tanh(spread * rng.normal(size=(n, d)))


def co_spread(X: np.ndarray) -> float:
    """``sum_{i != j} Cov(x_i^2, x_j^2)`` (population covariances), by brute force."""
    C = np.cov(X**2, rowvar=False, bias=True)
    return float(C.sum() - np.trace(C))


def test_row_values_are_the_off_diagonal_sum() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(50, 5))
    m = rng.uniform(0, 1, size=5)
    U = X**2 - m
    brute = [sum(u[i] * u[j] for i, j in itertools.permutations(range(5), 2)) for u in U]
    np.testing.assert_allclose(dependence.row_values(X, m), brute, rtol=1e-12, atol=1e-14)


def test_mean_with_exact_centring_is_the_co_spread() -> None:
    rng = np.random.default_rng(1)
    X = one_factor(3000, 7, rng)
    m = (X**2).mean(axis=0)
    assert dependence.row_values(X, m).mean() == pytest.approx(co_spread(X), rel=1e-10)


def test_row_values_respect_the_clip_bounds_and_the_sensitivity() -> None:
    """``g >= -lower`` for every row (random rows and all corners {-1, 0, 1}^12), rows with
    ``g > upper`` exist (the clip binds), and replacing one row moves the clipped mean by
    at most ``(upper + lower) / n``. The move seen between the extreme rows exceeds
    ``upper / n``: the clipped side of the bound has no slack (``lower`` is a valid but
    loose floor: with ``m_i < 1/2`` the lowest corner is near ``-1``)."""
    rng = np.random.default_rng(2)
    d, n = 12, 40
    m = rng.uniform(0, 0.3, size=d)
    lower, upper = dependence.clip_bounds(m)
    assert upper == dependence.CLIP_PER_COLUMN * d
    assert lower == pytest.approx(np.sum(np.maximum(m, 1 - m) ** 2))
    corners = np.array(list(itertools.product([-1.0, 0.0, 1.0], repeat=d)))
    rows = np.vstack([corners, rng.uniform(-1, 1, size=(20_000, d))])
    g = dependence.row_values(rows, m)
    assert g.min() >= -lower - 1e-12
    clipped = np.minimum(g, upper)
    assert g.max() > upper
    assert clipped.max() == upper
    base = rng.uniform(-1, 1, size=(n, d))
    one, other = base.copy(), base.copy()
    one[0], other[0] = rows[np.argmax(clipped)], rows[np.argmin(clipped)]
    move = abs(
        np.minimum(dependence.row_values(one, m), upper).mean()
        - np.minimum(dependence.row_values(other, m), upper).mean()
    )
    assert upper / n < move <= (upper + lower) / n * (1 + 1e-12)


def test_measure_charges_laplace_at_the_sensitivity() -> None:
    rng = np.random.default_rng(3)
    X = one_factor(2000, 6, rng)
    m = np.clip((X**2).mean(axis=0) + 0.01, 0, 1)
    out = dependence.measure(as_source(X), m, 0.25, centring_variance=1e-4)
    lower, upper = dependence.clip_bounds(m)
    cal = out.measurement.calibration
    assert cal.mechanism == "laplace"
    assert cal.sensitivity == dependence.co_spread_sensitivity(2000, lower, upper)
    exact = (upper + lower) / 2000
    assert exact < cal.sensitivity < exact * (1 + 1e-10)  # plus the rounding of the mean
    assert cal.scale == pytest.approx(cal.sensitivity / 0.25, rel=1e-12)
    assert out.measurement.privacy_cost.epsilon <= 0.25
    assert out.centring_stddev == pytest.approx(1e-4 * math.sqrt(2 * 6 * 5))
    assert out.stddev == pytest.approx(math.hypot(math.sqrt(2) * cal.scale, out.centring_stddev))
    # the released value is the clipped mean plus noise of that scale (20 scales: ~1e-9)
    exact = float(np.minimum(dependence.row_values(X, m), upper).mean())
    assert abs(out.value - exact) <= 20 * cal.scale
    with pytest.raises(MechanismError, match="centring"):
        dependence.measure(as_source(X), m[:3], 0.25, centring_variance=0.0)
    with pytest.raises(MechanismError, match="two columns"):
        dependence.measure(as_source(X[:, :1]), m[:1], 0.25, centring_variance=0.0)


def test_centring_errors_add_no_bias_and_the_stated_spread() -> None:
    """Independent zero-mean centring errors of variance v: the mean of ``g`` over 4000
    draws of them stays within 5 standard errors of ``A``, and its spread matches
    ``v sqrt(2 d (d - 1))`` to 10 % (4000 draws: the sd estimate is within ~3 %)."""
    rng = np.random.default_rng(4)
    d = 8
    X = one_factor(1500, d, rng)
    m = (X**2).mean(axis=0)
    v = 0.002
    draws = np.array(
        [dependence.row_values(X, m + rng.normal(0, math.sqrt(v), d)).mean() for _ in range(4000)]
    )
    A = co_spread(X)
    sd = v * math.sqrt(2 * d * (d - 1))
    assert abs(draws.mean() - A) <= 5 * sd / math.sqrt(draws.size)
    assert draws.std() == pytest.approx(sd, rel=0.1)


def test_pair_weight_reduces_to_one_over_8_s4_for_equal_widths() -> None:
    spread = exact_co_spread(one_factor(500, 4, np.random.default_rng(5)))
    s = 0.7
    kappa = np.full((1, 4), 0.5 / s**2)
    assert spread.pair_weight(kappa)[0] == pytest.approx(1 / (8 * s**4), rel=1e-12)
    # per-column widths: the exchangeable average over ordered pairs
    kappa = np.array([[1.0, 2.0, 0.0, 3.0]])
    pairs = sum(kappa[0, i] * kappa[0, j] for i, j in itertools.permutations(range(4), 2))
    assert spread.pair_weight(kappa)[0] == pytest.approx(pairs / (2 * 4 * 3), rel=1e-12)
    with pytest.raises(MechanismError, match="curvature"):
        spread.pair_weight(np.ones((1, 3)))


def exact_co_spread(X: np.ndarray) -> dependence.CoSpread:
    """Test-only: the exact co-spread, with a negligible (1e-9) Laplace calibration."""
    _n, d = X.shape
    cal = noise.calibrate("laplace", sensitivity=1e-9, epsilon=1.0, dimension=1)
    return dependence.CoSpread(
        measurement=noise.NoisyVector(dependence.STEP, np.array([co_spread(X)]), cal),
        d=d,
        lower=0.0,
        upper=dependence.CLIP_PER_COLUMN * d,
        centring_stddev=0.0,
    )


def exact_synopsis(X: np.ndarray, spread: dependence.CoSpread | None) -> ss.Synopsis:
    """Exact moments of ``axis_total_degree(d, 1, 2)`` with negligible noise (the tests are
    about the truncation error) and the given co-spread."""
    index_set = axis_total_degree(X.shape[1], 1, 2)
    return shared_exact_synopsis(X, index_set, epsilon=1e6, co_spread=spread)


def test_the_correction_cuts_the_dependence_error() -> None:
    """Exact moments of ``axis_total_degree(16, 1, 2)`` on columns that share their spread
    (:func:`co_spread_data`, n = 6000, d = 16), 300 Gaussian mixtures at sigma = 2.
    Measured with seed 6: the median ``|log answer - log truth|`` falls from 0.053
    without the co-spread to 0.012 with it (at sigma = 1.5: 0.14 -> 0.065); band: at
    least 2x. The intervals cover >= 90 % (measured 100 %), the log-factor is reported per
    answer, and queries without Gaussian factors or with narrow ones are left alone (at
    sigma = 1 the second-order term overshoots: measured 0.43 -> 0.61)."""
    rng = np.random.default_rng(6)
    X = co_spread_data(6000, 16, rng)
    batch = GaussianMixtureBatch.random(300, 3, 16, 2.0, rng=rng)
    truth = batch.answers(X)
    spread = exact_co_spread(X)
    with_it = exact_synopsis(X, spread).answer_many(batch)
    without = exact_synopsis(X, None).answer_many(batch)
    err_with = np.median(np.abs(np.log(with_it.values / truth)))
    err_without = np.median(np.abs(np.log(without.values / truth)))
    assert err_with <= err_without / 2
    assert np.mean(np.abs(with_it.values - truth) <= with_it.halfwidth) >= 0.9
    lam = spread.value / (8 * 2.0**4)
    np.testing.assert_allclose(with_it.dependence, lam, rtol=1e-12)
    np.testing.assert_allclose(with_it.values, np.exp(lam) * without.values, rtol=1e-10)
    assert with_it[0].as_dict()["dependence_log_factor"] == pytest.approx(lam)
    # the worst case stays centred on the plain answer
    assert with_it[0].worst_case_interval == pytest.approx(without[0].worst_case_interval)
    # a polynomial has no Gaussian factor: no correction
    square = Polynomial(np.array([[2] + [0] * 15]), np.ones(1))
    assert exact_synopsis(X, spread).evaluate(square).dependence == 0.0
    narrow = GaussianMixtureBatch.random(5, 3, 16, 1.4, rng=rng)
    assert np.all(exact_synopsis(X, spread).answer_many(narrow).dependence == 0.0)


def test_noisy_answers_keep_the_correction_only_where_it_pays() -> None:
    """With a co-spread far noisier than its value the correction is dropped (log-factor
    0) and its estimated bias widens the interval instead (treated as a bias, so by less
    than itself); with an exact one it is kept."""
    rng = np.random.default_rng(7)
    X = co_spread_data(3000, 10, rng)
    batch = GaussianMixtureBatch.random(50, 2, 10, 2.0, rng=rng)
    exact = exact_co_spread(X)
    noisy = dependence.CoSpread(
        measurement=exact.measurement,
        d=10,
        lower=0.0,
        upper=40.0,
        centring_stddev=1e3 * abs(exact.value),
    )
    kept = exact_synopsis(X, exact).answer_many(batch)
    dropped = exact_synopsis(X, noisy).answer_many(batch)
    plain = exact_synopsis(X, None).answer_many(batch)
    assert np.all(kept.dependence > 0)
    assert np.all(dropped.dependence == 0.0)
    np.testing.assert_allclose(dropped.values, plain.values, rtol=1e-12)
    bias = np.expm1(exact.value / (8 * 2.0**4)) * np.abs(plain.values)
    # the bias widens the interval, by at most itself (bias-aware critical value)
    assert np.all(dropped.halfwidth > plain.halfwidth)
    assert np.all(dropped.halfwidth <= plain.halfwidth + bias * (1 + 1e-9))
    assert np.all(dropped.halfwidth >= bias)


def test_curvature_of_the_expansions() -> None:
    centres = np.zeros((2, 3, 4))
    g = gaussian_expansion(centres, np.ones((2, 3)), np.array([0.5, 1.0, 2.0, 4.0]))
    np.testing.assert_allclose(g.curvature, np.tile(0.5 / np.array([0.25, 1.0, 4.0, 16.0]), (2, 1)))
    queries = [
        ProductQuery([Gaussian1D(0.1, 0.5), None, np.array([1.0, 0.5]), Gaussian1D(0.0, 2.0)]),
        ProductQuery([None, None, np.array([1.0]), None]),
    ]
    p = product_expansions(queries)
    assert p.curvature is not None
    np.testing.assert_allclose(p.curvature, [[2.0, 0.0, 0.0, 0.125], [0.0, 0.0, 0.0, 0.0]])
    assert product_expansions(queries[1:]).curvature is None
    both = stack_expansions([g, product_expansions(queries[1:])])
    assert both.curvature is not None
    np.testing.assert_allclose(both.curvature[:2], g.curvature)
    assert np.all(both.curvature[2:] == 0.0)


def test_co_spread_applies_only_where_it_adds_information() -> None:
    assert ss.co_spread_applies(axis_total_degree(5, 1, 2))
    # every index of total degree <= 3: pairs (2, 1) but no (2, 2)
    assert ss.co_spread_applies(total_degree(5, count_total_degree(5, 3)))
    # degree 4 holds T_2(x_i) T_2(x_j)
    assert not ss.co_spread_applies(total_degree(5, count_total_degree(5, 4)))
    assert not ss.co_spread_applies(total_degree(5, 5))  # no T_2: no centring
    assert not ss.co_spread_applies(axis_total_degree(1, 1, 4))  # one column


def test_measure_splits_the_budget_or_spends_it_all_on_the_moments() -> None:
    rng = np.random.default_rng(8)
    X = one_factor(800, 4, rng)
    on = ss.measure(X, 1.0, smoothness=4)
    assert on.co_spread is not None
    assert ss.co_spread_applies(on.index_set)
    parts = {p.step: p.epsilon for p in on.privacy_cost.parts}
    assert parts["moments"] == pytest.approx(1.0 - ss.CO_SPREAD_SHARE, rel=1e-9)
    assert parts["co_spread"] == pytest.approx(ss.CO_SPREAD_SHARE, rel=1e-6)
    assert on.privacy_cost.within(1.0, 0.0)
    off = ss.measure(X, 1.0, smoothness=4, co_spread=False)
    assert off.co_spread is None
    assert off.calibration.target_epsilon == 1.0
    assert [p.step for p in off.privacy_cost.parts] == ["moments"]
    # a basis holding the (2, 2) pairs: nothing to add, the whole budget buys moments
    full = ss.measure(X, 1.0, basis=total_degree(4, count_total_degree(4, 4)))
    assert full.co_spread is None
    assert full.calibration.target_epsilon == 1.0
    gauss = ss.measure(X, 1.0, 1e-6, smoothness=4)
    assert gauss.co_spread is not None
    assert gauss.privacy_cost.within(1.0, 1e-6)


def test_json_round_trip_with_and_without_the_co_spread() -> None:
    rng = np.random.default_rng(9)
    X = one_factor(700, 3, rng)
    syn = ss.measure(X, 1.0, smoothness=4)
    doc = json.loads(json.dumps(syn.to_dict()))
    back = ss.Synopsis.from_dict(doc)
    assert back.to_dict() == syn.to_dict()
    assert back.co_spread is not None
    assert syn.co_spread is not None
    assert back.co_spread.to_dict() == syn.co_spread.to_dict()
    # a version-1 document (before the co-spread) still loads, and answers without it
    old = json.loads(json.dumps(ss.measure(X, 1.0, smoothness=4, co_spread=False).to_dict()))
    old["format_version"] = 1
    del old["co_spread"]
    legacy = ss.Synopsis.from_dict(old)
    assert legacy.co_spread is None
    q = GaussianMixtureBatch.random(3, 2, 3, 1.0, rng=rng)
    assert np.all(legacy.answer_many(q).dependence == 0.0)
    # a tampered co-spread cost no longer matches the recorded privacy cost. 0.04 is within
    # the co-spread's own target (0.05), so the calibration loads and only the comparison
    # with the recorded cost can refuse it; 0.5 exceeds that target and the calibration
    # itself refuses it first
    bad = json.loads(json.dumps(doc))
    bad["co_spread"]["measurement"]["calibration"]["epsilon"] = 0.04
    with pytest.raises(MechanismError, match="recorded privacy cost does not match"):
        ss.Synopsis.from_dict(bad)
    bad["co_spread"]["measurement"]["calibration"]["epsilon"] = 0.5
    with pytest.raises(MechanismError, match="exceeds the requested budget"):
        ss.Synopsis.from_dict(bad)


def test_the_co_spread_noise_is_calibrated_before_its_rows_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The co-spread's noise is calibrated from public values (``n`` and the released
    centring) before its clipped mean reads a row, and drawn at that calibration."""
    events: list[object] = []
    log_calls(monkeypatch, noise, "calibrate", events, lambda *a, **k: "calibrate")
    log_calls(monkeypatch, dependence, "clipped_mean", events, lambda *a, **k: "read")
    X = np.random.default_rng(4).uniform(-1, 1, size=(300, 3))
    spread = dependence.measure(as_source(X), np.full(3, 0.3), 0.5, centring_variance=1e-4)
    assert events == ["calibrate", "read"]
    lower, upper = dependence.clip_bounds(np.full(3, 0.3))
    assert spread.measurement.calibration.sensitivity == dependence.co_spread_sensitivity(
        300, lower, upper
    )
    assert spread.measurement.calibration.epsilon == 0.5


def test_an_applied_correction_keeps_an_allowance_for_its_own_error() -> None:
    """Strongly one-factor columns (``tanh(-0.3 + 0.4 sign(z)|z|^1.5 + 0.05 e_i)``,
    n = 3000, d = 20, seed 3), exact moments and co-spread, 200 mixtures of 10 kernels at
    sigma = 2: the second-order correction (lambda ~0.14) overshoots, the answers lie
    above the truth in 99 % of queries. Without an allowance for the correction's own
    error the intervals covered 20.5 %; with ``min(1, 4 k) |e^lambda - 1| |answer|``
    (half the correction here) they cover 100 %, at ~2.1 times the error. Band: >= 90 %."""
    rng = np.random.default_rng(3)
    n, d = 3000, 20
    z = rng.normal(size=(n, 1))
    X = np.tanh(-0.3 + 0.4 * np.abs(z) ** 1.5 * np.sign(z) + 0.05 * rng.normal(size=(n, d)))
    batch = GaussianMixtureBatch.random(200, 10, d, 2.0, rng=rng)
    truth = batch.answers(X)
    spread = exact_co_spread(X)
    got = exact_synopsis(X, spread).answer_many(batch)
    assert np.all(got.dependence > 0)
    assert np.mean(np.abs(got.values - truth) <= got.halfwidth) >= 0.9
    step = np.abs(got.values - got.values / np.exp(got.dependence))
    k = 1.0 / (2 * 2.0**2)
    assert np.all(got.halfwidth >= min(1.0, ss.CO_SPREAD_MODEL_ERROR * k) * step * (1 - 1e-9))
