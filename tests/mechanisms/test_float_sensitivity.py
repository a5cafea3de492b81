"""Declared sensitivities against the *computed* (float64) statistics.

Each test replaces one row, computes the statistic exactly as the mechanism does, measures
the change in exact rational arithmetic (``Fraction`` of the computed floats, L2 compared
squared) and checks it against the declared sensitivity. Rows sit where rounding bites:
Chebyshev degrees up to 200 at their extremal points near +-1, histogram counts whose
quotients by ``n`` round, covariance rows at opposite corners, co-spread rows at both clip
bounds. Each test also checks that the computed change *exceeds* the exact-arithmetic
sensitivity somewhere: with the old, exact declarations (no rounding allowance) these
tests fail.
"""

import math
from fractions import Fraction

import numpy as np
import pytest

from app.mechanisms import basis, dependence, marginals, noise, pca
from app.mechanisms import marginal_tree as mt
from app.mechanisms.data import ArraySource, as_source

Exact = Fraction


def fractions(values: np.ndarray) -> list[Fraction]:
    return [Fraction(float(v)) for v in np.ravel(values)]


def change(a: np.ndarray, b: np.ndarray) -> dict[str, Fraction]:
    """Exact L-inf, L1 and squared L2 norms of ``a - b`` (computed floats, exact differences)."""
    diff = [x - y for x, y in zip(fractions(a), fractions(b), strict=True)]
    return {
        "linf": max(abs(v) for v in diff),
        "l1": sum((abs(v) for v in diff), Fraction(0)),
        "l2sq": sum((v * v for v in diff), Fraction(0)),
    }


def within(observed: dict[str, Fraction], declared: dict[str, float]) -> None:
    for key, bound in declared.items():
        if key == "l2":
            assert observed["l2sq"] <= Fraction(bound) ** 2, key
        else:
            assert observed[key] <= Fraction(bound), key


# --- Chebyshev moments ------------------------------------------------------------------


def extremal_points(degree: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Points near +-1 where the *computed* recurrence for ``T_degree`` overshoots +1 and -1
    the most (a fine grid of ``cos(pi j / N)``, the extrema of ``T_degree`` among them)."""
    grid = np.cos(np.pi * np.arange(0, 2 * 10**5 + 1) / (2 * 10**5))
    values = basis.chebyshev_table(grid, degree)[degree]
    return grid[np.argsort(-values)[:count]], grid[np.argsort(values)[:count]]


def test_the_recurrence_overshoots_and_the_evaluation_clips() -> None:
    """The raw recurrence leaves [-1, 1] at high degree (the premise |T_r| <= 1 fails in
    float); the basis evaluation used by the moments stays inside it, products included."""
    high, low = extremal_points(200, 20)
    raw = basis.chebyshev_table(np.concatenate([high, low]), 200)
    assert np.abs(raw).max() > 1.0
    one_column = basis.IndexSet.from_terms(1, [[[0, k]] for k in range(1, 301)])
    pairs = basis.IndexSet.from_terms(2, [[[0, k], [1, 200]] for k in range(150, 201)])
    points = np.concatenate([high, low])
    assert np.abs(one_column.evaluate(points[:, None])).max() <= 1.0
    assert np.abs(pairs.evaluate(np.stack([points, points[::-1]], axis=1))).max() <= 1.0


@pytest.mark.parametrize("n", [3, 7, 569])
def test_moments_move_within_the_declared_sensitivity_at_high_degree(n: int) -> None:
    rng = np.random.default_rng(n)
    R = 200
    index_set = basis.IndexSet.from_terms(1, [[[0, k]] for k in range(1, R + 1)])
    high, low = extremal_points(R, 40)
    declared = noise.moment_sensitivity(n, R)
    exact_linf = Fraction(2, n)
    worst_linf = Fraction(0)
    for trial in range(60 if n < 100 else 12):
        rest = rng.choice(np.concatenate([high, low, rng.uniform(-1, 1, 40)]), size=(n - 1, 1))
        z, z2 = rng.choice(high), rng.choice(low)
        if trial % 2:
            z, z2 = z2, z
        a = basis.moments(np.vstack([[[z]], rest]), index_set)
        b = basis.moments(np.vstack([[[z2]], rest]), index_set)
        observed = change(a, b)
        within(observed, declared)
        worst_linf = max(worst_linf, observed["linf"])
    assert worst_linf > exact_linf  # the exact 2/n alone is exceeded by the computed moments


@pytest.mark.parametrize("n", [3, 569])
def test_trigonometric_moments_stay_within_the_declared_sensitivity(n: int) -> None:
    """One column, R = 5000: the table is built as cos(j arccos x) (``basis.IndexSet.
    table_form``); rows at +-1, within 2^-52 and 1e-6 of +-1 and random, the moved row
    from both ends."""
    rng = np.random.default_rng(30 + n)
    R = 5000
    index_set = basis.total_degree(1, R)
    assert index_set.table_form == "trigonometric"
    ends = np.array([1.0, 1 - 2**-52, *(1 - rng.uniform(0, 1e-6, 6))])
    pool = np.concatenate([ends, -ends, rng.uniform(-1, 1, 16)])
    declared = noise.moment_sensitivity(n, R)
    for trial in range(6):
        rest = rng.choice(pool, size=(n - 1, 1))
        z, z2 = rng.choice(ends), -rng.choice(ends)
        if trial % 2:
            z, z2 = z2, z
        a = basis.moments(np.vstack([[[z]], rest]), index_set)
        b = basis.moments(np.vstack([[[z2]], rest]), index_set)
        within(change(a, b), declared)


def test_tensor_moments_stay_within_the_declared_sensitivity() -> None:
    """Products of high degrees in d = 2, streamed in batches of a few rows (many blocks)."""
    rng = np.random.default_rng(11)
    n = 13
    terms = [[[0, k], [1, j]] for k in (1, 50, 120, 200) for j in (1, 99, 200)]
    index_set = basis.IndexSet.from_terms(2, terms)
    high, low = extremal_points(200, 20)
    pool = np.concatenate([high, low])
    declared = noise.moment_sensitivity(n, index_set.size)
    for _ in range(40):
        D = rng.choice(pool, size=(n, 2))
        D2 = D.copy()
        D2[0] = rng.choice(pool, size=2)
        a = basis.moments(ArraySource(D, batch_rows=3), index_set, block_elements=24)
        b = basis.moments(ArraySource(D2, batch_rows=5), index_set, block_elements=36)
        within(change(a, b), declared)


# --- histograms and pair tables ---------------------------------------------------------


@pytest.mark.parametrize("n", [7, 10, 569])
def test_histograms_move_within_the_declared_sensitivity(n: int) -> None:
    rng = np.random.default_rng(20 + n)
    d, B = 3, 4
    declared = marginals.histogram_sensitivity(n, d)
    worst = {"l1": Fraction(0), "l2sq": Fraction(0)}
    for _ in range(150):
        X = rng.uniform(-1, 1, size=(n, d))
        X[rng.random((n, d)) < 0.2] = 1.0
        Y = X.copy()
        Y[rng.integers(n)] = -np.sign(X[0]) * rng.uniform(0.5, 1.0, size=d)
        observed = change(
            marginals.exact_histograms(as_source(X), B, True),
            marginals.exact_histograms(as_source(Y), B, True),
        )
        within(observed, declared)
        worst = {k: max(v, observed[k]) for k, v in worst.items()}
    assert worst["l1"] > Fraction(2 * d, n)  # exact 2d/n exceeded
    assert worst["l2sq"] > Fraction(2 * d, n * n)  # exact sqrt(2d)/n exceeded


def test_pair_tables_move_within_the_declared_sensitivity() -> None:
    rng = np.random.default_rng(30)
    n, d, bins, b = 569, 4, 6, 3
    edges = [(0, 1), (1, 2), (1, 3)]
    declared = mt.pair_table_sensitivity(n, d - 1)
    worst = Fraction(0)
    for trial in range(60):
        group = mt.column_groups(
            rng.dirichlet(np.ones(bins), size=(d,)), b, mt.GROUPINGS[trial % 3]
        )
        X = rng.uniform(-1, 1, size=(n, d))
        Y = X.copy()
        Y[rng.integers(n)] = rng.choice([-0.99, 0.99], size=d)
        cx = mt.coarse_codes(as_source(X), bins, False, group)
        cy = mt.coarse_codes(as_source(Y), bins, False, group)
        observed = change(
            np.stack([mt.pair_table(cx, i, j, b) for i, j in edges]),
            np.stack([mt.pair_table(cy, i, j, b) for i, j in edges]),
        )
        assert observed["l2sq"] <= Fraction(declared) ** 2
        worst = max(worst, observed["l2sq"])
    assert worst > Fraction(2 * (d - 1), n * n)  # exact sqrt(2 (d - 1)) / n exceeded


# --- PCA -------------------------------------------------------------------------------


def test_within_unit_norm_is_provably_in_the_unit_ball() -> None:
    """Exact rational Gram matrix of the returned X: its largest absolute row sum (an upper
    bound of ||X||_2^2) is at most 1."""
    rng = np.random.default_rng(40)
    for d, k in [(2, 1), (3, 3), (5, 2), (8, 8)]:
        for _ in range(10):
            X = pca.within_unit_norm(pca.gram_schmidt(rng.standard_normal((d, k))))
            cols = [fractions(X[:, j]) for j in range(k)]
            gram = [[sum(a * b for a, b in zip(ci, cj, strict=True)) for cj in cols] for ci in cols]
            assert max(sum(abs(v) for v in row) for row in gram) <= 1


@pytest.mark.parametrize(("n", "d"), [(5, 2), (50, 3), (569, 5)])
def test_pca_release_moves_within_the_declared_sensitivity(n: int, d: int) -> None:
    """Rows at one corner, the replaced row from the opposite corner onto them (the pair
    that attains 4d(n-1)/n^2), X with a column along that corner."""
    rng = np.random.default_rng(50 + n)
    exact = Fraction(4 * d * (n - 1), n * n)
    worst_a = Fraction(0)
    for _ in range(40):
        c = rng.choice([-1.0, 1.0], size=d)
        rest = np.tile(c, (n - 1, 1))
        k = int(rng.integers(1, d + 1))
        M = rng.standard_normal((d, k))
        M[:, 0] = c * (1 + 1e-3 * rng.standard_normal(d))
        X = pca.within_unit_norm(pca.gram_schmidt(M))
        declared = pca.covariance_sensitivity(n, d, k)
        A1 = pca.covariance(np.vstack([-c, rest]))[0]
        A2 = pca.covariance(np.vstack([c * (1 - rng.uniform(0, 1e-12, d)), rest]))[0]
        within(change(A1 @ X, A2 @ X), declared)
        # the covariance itself: beyond the exact bound, within its rounding allowance
        moved = change(A1, A2)["l2sq"]
        eps = noise.gamma(3 * pca.sum_depth(n) + 6)
        assert moved <= (exact + 2 * d * Fraction(eps)) ** 2
        worst_a = max(worst_a, moved)
    assert worst_a > exact**2  # computed ||A(D) - A(D')||_F exceeds 4d(n-1)/n^2


def test_pca_mean_moves_within_the_declared_sensitivity() -> None:
    rng = np.random.default_rng(60)
    n, d = 569, 4
    declared = pca.mean_sensitivity(n, d)
    worst = Fraction(0)
    for _ in range(100):
        X = rng.uniform(-1, 1, size=(n, d))
        X[0] = 1.0
        Y = X.copy()
        Y[0] = -1.0
        observed = change(pca.covariance(X)[1], pca.covariance(Y)[1])
        within(observed, declared)
        worst = max(worst, observed["l1"])
    assert worst > Fraction(2 * d, n)  # exact 2d/n exceeded


# --- co-spread -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 40, 569])
def test_co_spread_moves_within_the_declared_sensitivity(n: int) -> None:
    """d = 18 and centring ~1/2: the all-ones row is clipped at ``upper`` and a half-zero
    row sits at (or, computed, just below) ``-lower``, so the pair attains ``(upper +
    lower) / n``."""
    rng = np.random.default_rng(70 + n)
    d = 18
    hi = np.ones(d)
    worst = Fraction(0)
    for trial in range(60):
        m = 0.5 + (rng.uniform(-1e-9, 1e-9, size=d) if trial % 2 else np.zeros(d))
        lower, upper = dependence.clip_bounds(m)
        lo = np.where(m >= 0.5, 0.0, 1.0) if trial % 4 == 1 else (np.arange(d) % 2).astype(float)
        base = rng.uniform(-1, 1, size=(n, d))
        one, other = base.copy(), base.copy()
        one[0], other[0] = hi, lo
        moved = abs(
            Fraction(dependence.clipped_mean(as_source(one), m))
            - Fraction(dependence.clipped_mean(as_source(other), m))
        )
        assert moved <= Fraction(dependence.co_spread_sensitivity(n, lower, upper))
        worst = max(worst, moved / (Fraction(upper) + Fraction(lower)) * n)
    assert worst > 1  # exact (upper + lower) / n exceeded


def test_computed_co_spread_rows_can_undercut_minus_lower() -> None:
    """``g >= -lower`` holds in exact arithmetic only: rows at the floor, with centrings a
    hair off 1/2, compute below it (71 of these 2000), and the clip puts them back."""
    rng = np.random.default_rng(91)
    d, below = 18, 0
    for _ in range(2000):
        m = 0.5 + rng.uniform(-1e-9, 1e-9, size=d)
        lower, _ = dependence.clip_bounds(m)
        row = np.where(m >= 0.5, 0.0, 1.0)[None]  # every |u_i| at its largest
        below += int(dependence.row_values(row, m)[0] < -lower)
        assert dependence.clipped_mean(as_source(row), m) >= -lower
    assert below > 0


# --- the charge and old records --------------------------------------------------------


@pytest.mark.parametrize(
    ("mechanism", "metric", "delta"),
    [("laplace", "l1", 0.0), ("gaussian", "l2", 1e-9), ("laplace_approx", "linf", 1e-9)],
)
def test_the_allowance_raises_the_scale_a_hair_and_the_charge_stays_within(
    mechanism: str, metric: str, delta: float
) -> None:
    n, R = 569, 30
    declared = noise.moment_sensitivity(n, R)[metric]
    exact = {"l1": 2 * R / n, "l2": 2 * math.sqrt(R) / n, "linf": 2 / n}[metric]
    new = noise.calibrate(mechanism, sensitivity=declared, epsilon=1.0, delta=delta, dimension=R)
    old = noise.calibrate(mechanism, sensitivity=exact, epsilon=1.0, delta=delta, dimension=R)
    assert new.epsilon <= 1.0
    assert new.delta <= delta
    assert old.scale < new.scale <= old.scale * (1 + 1e-10)


def test_records_with_the_exact_sensitivity_load_and_answer_as_before() -> None:
    """A release stored before the allowance carries the exact sensitivity; loading keeps
    it (and the scale), so its answers do not move."""
    rng = np.random.default_rng(80)
    n, d, B = 500, 3, 6
    old_law = noise.calibrate(
        "gaussian", sensitivity=math.sqrt(2 * d) / n, epsilon=1.0, delta=1e-9, dimension=d * B
    )
    record = marginals.MarginalMeasurements(
        n=n,
        d=d,
        epsilon=1.0,
        delta=1e-9,
        bins=B,
        atoms=False,
        frequencies=rng.dirichlet(np.ones(B), size=d),
        calibration=old_law,
    )
    loaded = marginals.MarginalMeasurements.from_dict(record.to_dict())
    assert loaded.calibration == old_law
    assert loaded.calibration.sensitivity == math.sqrt(2 * d) / n
    np.testing.assert_array_equal(loaded.marginals(), record.marginals())
    assert marginals.histogram_sensitivity(n, d)["l2"] > old_law.sensitivity


def test_every_declared_sensitivity_is_the_exact_one_plus_a_tiny_allowance() -> None:
    """Relative allowances at n = 569, 10^4, 10^6 (d = 30, R = 30, k = 30): positive and
    below the sizes the docstrings state."""
    d = R = k = 30
    for n, cap in [(569, 5e-11), (10**4, 1e-9), (10**6, 1e-7)]:
        ratios = [
            noise.moment_sensitivity(n, R)["l2"] / (2 * math.sqrt(R) / n),
            marginals.histogram_sensitivity(n, d)["l2"] / (math.sqrt(2 * d) / n),
            mt.pair_table_sensitivity(n, d - 1) / (math.sqrt(2 * (d - 1)) / n),
            pca.covariance_sensitivity(n, d, k)["l2"] / (4 * d * (n - 1) / n**2),
            pca.mean_sensitivity(n, d)["l1"] / (2 * d / n),
            dependence.co_spread_sensitivity(n, d / 4, 4.0 * d) / ((4.0 * d + d / 4) / n),
        ]
        assert all(1.0 < r < 1.0 + cap for r in ratios), (n, ratios)
