"""Chebyshev coefficients of queries: against brute-force projections, bounds, errors.

Brute force: the Chebyshev coefficient of ``T_k`` is the projection in the Chebyshev
measure, ``a_k = (2 - [k = 0]) / pi * int_0^pi g(cos t) cos(k t) dt`` (``scipy.integrate``
in 1-D and 2-D), or a direct product over all ``d`` columns for the tensor coefficients.
"""

import itertools
import math

import numpy as np
import pytest
from numpy.polynomial import chebyshev as npcheb
from scipy import integrate

from app.mechanisms import chebyshev as ch
from app.mechanisms.basis import (
    IndexSet,
    axis_total_degree,
    count_total_degree,
    full_tensor,
    moments,
    total_degree,
)
from app.mechanisms.chebyshev import TensorExpansion, independence_extrapolation
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import (
    AnisotropicGaussianMixture,
    Gaussian1D,
    GaussianMixture,
    GaussianMixtureBatch,
    Polynomial,
    ProductQuery,
)


def projection_1d(g, k: int) -> float:  # type: ignore[no-untyped-def]
    value, _ = integrate.quad(
        lambda t: g(math.cos(t)) * math.cos(k * t), 0, math.pi, epsabs=1e-13, epsrel=0, limit=200
    )
    return value * (1 if k == 0 else 2) / math.pi


def projection_2d(f, k: int, m: int) -> float:  # type: ignore[no-untyped-def]
    value, _ = integrate.dblquad(
        lambda t, s: f(math.cos(s), math.cos(t)) * math.cos(k * s) * math.cos(m * t),
        0,
        math.pi,
        0,
        math.pi,
        epsabs=1e-12,
        epsrel=0,
    )
    return value * (1 if k == 0 else 2) * (1 if m == 0 else 2) / math.pi**2


def sup_residual(coef: ch.QueryCoefficients, index_set: IndexSet, f, X: np.ndarray) -> float:  # type: ignore[no-untyped-def]
    approx = coef.constant[0] + coef.coefficients[0] @ index_set.evaluate(X)
    return float(np.max(np.abs(approx - f(X))))


# --- 1-D transforms ----------------------------------------------------------------------


def test_dct_coefficients_interpolate_at_chebyshev_points() -> None:
    x = ch.chebyshev_points(23)
    values = np.exp(x) * np.sin(3 * x)
    coef = ch.coefficients_from_values(values)
    np.testing.assert_allclose(npcheb.chebval(x, coef), values, atol=1e-14)
    np.testing.assert_allclose(
        coef, npcheb.chebinterpolate(lambda z: np.exp(z) * np.sin(3 * z), 22), atol=1e-14
    )


@pytest.mark.parametrize("p", [0, 1, 2, 5, 8, 13])
def test_monomial_coefficients_are_exact(p: int) -> None:
    e = np.zeros(p + 1)
    e[p] = 1.0
    np.testing.assert_array_equal(ch.monomial_coefficients(p), npcheb.poly2cheb(e))


@pytest.mark.parametrize(("c", "sigma"), [(0.3, 0.5), (-0.9, 2.0), (1.7, 0.8), (0.0, 10.0)])
def test_gaussian_factor_against_projection(c: float, sigma: float) -> None:
    factors, tails = ch.gaussian_factors(np.array([[c]]), np.array([sigma]))
    a = factors[0, 0]

    def g(x: float) -> float:
        return math.exp(-((x - c) ** 2) / (2 * sigma**2))

    for k in range(min(12, a.size)):
        assert a[k] == pytest.approx(projection_1d(g, k), abs=2e-13)
    # the proven l1 tail dominates the difference to a much longer expansion
    long, _ = ch.gaussian_factors(np.array([[c]]), np.array([sigma]), min_length=4 * a.size)
    diff = np.abs(long[0, 0, : a.size] - a).sum() + np.abs(long[0, 0, a.size :]).sum()
    assert diff <= tails[0]
    assert tails[0] < 1e-13


def test_gaussian_tail_bound_decreases_and_rejects_tiny_sigma() -> None:
    assert ch.gaussian_tail_bound(1.0, 40) < ch.gaussian_tail_bound(1.0, 20)
    assert ch.gaussian_tail_bound(2.0, 20) < ch.gaussian_tail_bound(1.0, 20)
    assert ch.gaussian_points(0.05) > ch.gaussian_points(0.5) > ch.gaussian_points(5.0)
    with pytest.raises(MechanismError, match="sigma"):
        ch.gaussian_points(1e-6)


def test_callable_factor_resolves_smooth_functions_and_refuses_rough_ones() -> None:
    coef, tail = ch.callable_factor(np.cos)
    for k in range(6):
        assert coef[k] == pytest.approx(projection_1d(math.cos, k), abs=1e-14)
    assert tail < 1e-13
    with pytest.raises(MechanismError, match="not smooth enough"):
        ch.callable_factor(np.sign)
    with pytest.raises(MechanismError, match="non-finite"):
        ch.callable_factor(lambda x: 1.0 / x * np.inf)
    with pytest.raises(MechanismError, match="one value per point"):
        ch.callable_factor(lambda x: np.ones(3))


# --- tensor coefficients of separable queries --------------------------------------------


def test_product_coefficients_against_1d_projection_in_d1() -> None:
    index_set = total_degree(1, 15)
    q = GaussianMixture(np.array([[0.4], [-0.7]]), np.array([0.6, 0.3]), sigma=0.6)
    coef = ch.query_coefficients(q, index_set)

    def f(x: float) -> float:
        return float(q.evaluate(np.array([[x]]))[0])

    assert coef.constant[0] == pytest.approx(projection_1d(f, 0), abs=1e-13)
    for j, k in enumerate(index_set.degrees[:, 0]):
        assert coef.coefficients[0, j] == pytest.approx(projection_1d(f, int(k)), abs=1e-13)


@pytest.mark.parametrize(
    "query",
    [
        AnisotropicGaussianMixture(
            np.array([[0.2, -0.5], [0.9, 0.1]]), np.array([1.0, -0.4]), np.array([0.7, 1.5])
        ),
        ProductQuery((np.sin, np.array([0.5, -0.25, 0.125])), weight=1.5),
        Polynomial(np.array([[2, 1], [0, 3], [1, 0]]), np.array([1.0, -0.5, 2.0])),
    ],
    ids=["anisotropic_gaussian", "product", "polynomial"],
)
def test_tensor_coefficients_against_2d_projection(query: object) -> None:
    index_set = full_tensor(2, 4)
    coef = ch.query_coefficients(query, index_set)

    def f(x: float, y: float) -> float:
        return float(query.evaluate(np.array([[x, y]]))[0])  # type: ignore[attr-defined]

    assert coef.constant[0] == pytest.approx(projection_2d(f, 0, 0), abs=1e-11)
    for j, (k, m) in enumerate(index_set.degrees):
        assert coef.coefficients[0, j] == pytest.approx(projection_2d(f, int(k), int(m)), abs=1e-11)


def test_restriction_equals_direct_product_in_high_dimension() -> None:
    """d = 30, total-degree set: the parent-chain products equal prod over all 30 columns."""
    rng = np.random.default_rng(3)
    d = 30
    index_set = total_degree(d, 600)
    batch = GaussianMixtureBatch.random(4, 5, d, 3.0, rng)
    expansion = ch.expand(batch, d, min_length=index_set.max_degree + 1)
    assert expansion is not None
    coef = ch.restrict(expansion, index_set)
    a = expansion.factors  # (Q, J, d, L)
    cols = np.arange(d)
    for q in range(4):
        direct = np.zeros(index_set.size)
        for j in range(5):
            direct += batch.weights[q, j] * np.prod(a[q, j][cols, index_set.degrees], axis=1)
        np.testing.assert_allclose(coef.coefficients[q], direct, rtol=1e-12, atol=1e-17)
        c0 = sum(batch.weights[q, j] * np.prod(a[q, j][:, 0]) for j in range(5))
        assert coef.constant[q] == pytest.approx(c0, rel=1e-12)


def test_group_path_equals_parent_path_and_handles_structural_zeros() -> None:
    """A set without parents (custom) takes the general path; zeros of x_i are exact."""
    rng = np.random.default_rng(4)
    d = 4
    closed = total_degree(d, 69)  # all |r| <= 3
    # drop the first-degree terms: parents of some degree-2 terms are missing
    custom = IndexSet(closed.degrees[d:], kind="custom")
    q = GaussianMixture(rng.uniform(-1, 1, (3, d)), rng.uniform(0, 1, 3), sigma=1.1)
    full = ch.query_coefficients(q, closed)
    part = ch.query_coefficients(q, custom)
    np.testing.assert_allclose(part.coefficients[0], full.coefficients[0, d:], rtol=1e-13)
    # x1 * x3^2 - x2: every monomial has structural zeros in its constant terms
    poly = Polynomial(np.array([[1, 0, 2, 0], [0, 1, 0, 0]]), np.array([1.0, -1.0]))
    coef = ch.query_coefficients(poly, closed)
    X = rng.uniform(-1, 1, (400, d))
    assert sup_residual(coef, closed, poly.evaluate, X) < 1e-14
    assert coef.truncation_bound[0] < 1e-13


@pytest.mark.parametrize(
    ("query", "index_set"),
    [
        (GaussianMixture(np.zeros((1, 3)), np.ones(1), sigma=0.8), total_degree(3, 83)),
        (
            AnisotropicGaussianMixture(
                np.array([[0.5, -0.5, 0.9, 0.0, 0.1]]), np.ones(1), np.array([1, 2, 0.6, 4, 1.0])
            ),
            total_degree(5, 251),
        ),
        (ProductQuery((np.exp, None, np.cos)), full_tensor(3, 5)),
        (
            ProductQuery((Gaussian1D(0.2, 0.3), None, Gaussian1D(-0.7, 0.06)), weight=-2.0),
            full_tensor(3, 12),
        ),
        (Polynomial(np.array([[3, 2, 1]]), np.array([2.0])), total_degree(3, 19)),
    ],
    ids=["gaussian", "anisotropic", "product", "product_gaussian", "polynomial_outside"],
)
def test_truncation_bound_dominates_the_sup_error(query: object, index_set: IndexSet) -> None:
    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, (3000, index_set.dim))
    corners = np.array(list(itertools.product([-1.0, 1.0], repeat=index_set.dim)))
    coef = ch.query_coefficients(query, index_set)
    error = sup_residual(coef, index_set, query.evaluate, np.vstack([X, corners]))  # type: ignore[attr-defined]
    assert error <= coef.truncation_bound[0]
    assert error > 0.05 * coef.truncation_bound[0]  # and it is not vacuous here


def test_truncation_bound_is_the_l1_norm_of_what_is_left_out() -> None:
    """1-D: tau equals the l1 norm of the omitted coefficients of a long expansion."""
    q = GaussianMixture(np.array([[0.3]]), np.array([1.0]), sigma=0.4)
    index_set = total_degree(1, 6)
    coef = ch.query_coefficients(q, index_set)
    long, _ = ch.gaussian_factors(np.array([[0.3]]), np.array([0.4]), min_length=200)
    omitted = float(np.abs(long[0, 0, 7:]).sum())
    assert coef.truncation_bound[0] == pytest.approx(omitted, rel=1e-9, abs=1e-15)


def test_uniform_expectation_from_coefficients() -> None:
    q = AnisotropicGaussianMixture(
        np.array([[0.1, 0.8], [-0.6, 0.0]]), np.array([0.5, 0.5]), np.array([0.9, 0.4])
    )
    expansion = ch.expand(q, 2)
    assert expansion is not None
    assert expansion.uniform_expectation()[0] == pytest.approx(q.uniform_expectation(), rel=1e-13)


def test_stack_expansions_pads_kernels_without_changing_answers() -> None:
    rng = np.random.default_rng(6)
    index_set = total_degree(3, 30)
    queries = [
        GaussianMixture(rng.uniform(-1, 1, (2, 3)), rng.uniform(0, 1, 2), sigma=1.0),
        Polynomial(np.array([[1, 1, 0], [0, 0, 2], [0, 0, 0]]), np.array([1.0, 2.0, 3.0])),
        ProductQuery((None, np.array([0.0, 1.0]), None)),
    ]
    stacked = ch.restrict(ch.stack_expansions([ch.expand(q, 3) for q in queries]), index_set)  # type: ignore[misc]
    for i, q in enumerate(queries):
        one = ch.query_coefficients(q, index_set)
        np.testing.assert_allclose(stacked.coefficients[i], one.coefficients[0], atol=1e-15)
        # equal up to the rounding slack (which depends on the padded length)
        assert stacked.truncation_bound[i] == pytest.approx(one.truncation_bound[0], abs=1e-12)


# --- Jackson kernel and general callables ------------------------------------------------


@pytest.mark.parametrize(("t", "K"), [(12, 2), (20, 4), (9, 1)])
def test_jackson_multipliers_against_the_integral_operator(t: int, K: int) -> None:
    """lambda_n = -int H(s) sum_l (-1)^l binom(K+1, l) cos(n l s) ds with H from its formula."""
    r = math.ceil((K + 3) / 2)
    t_prime = t // r + 1

    def kernel(s: float) -> float:
        if abs(math.sin(s / 2)) < 1e-12:
            return float(t_prime ** (2 * r))
        return (math.sin(t_prime * s / 2) / math.sin(s / 2)) ** (2 * r)

    norm, _ = integrate.quad(kernel, -math.pi, math.pi, limit=200)
    lam = ch.jackson_multipliers(t, K, t + 4)
    for n in range(t + 4):

        def integrand(s: float, n: int = n) -> float:
            total = sum(
                (-1) ** ell * math.comb(K + 1, ell) * math.cos(n * ell * s)
                for ell in range(1, K + 2)
            )
            return -kernel(s) * total / norm

        value, _ = integrate.quad(integrand, -math.pi, math.pi, limit=400)
        assert lam[n] == pytest.approx(value, abs=1e-9)
    assert lam[0] == 1.0
    assert np.all(lam[t + 1 :] == 0.0)


def smooth_3d(X: np.ndarray) -> np.ndarray:
    return np.cos(2 * X[:, 0] + X[:, 1]) * np.exp(-(X[:, 2] ** 2)) / (2 + X[:, 1] * X[:, 2])


@pytest.mark.parametrize("damping", ["none", "jackson", "auto"])
def test_interpolation_of_a_general_callable(damping: str) -> None:
    rng = np.random.default_rng(7)
    index_set = full_tensor(3, 10)
    coef = ch.interpolate(smooth_3d, index_set, smoothness=4, damping=damping, rng=rng)
    assert coef.check_residual is not None
    assert coef.check_residual[0] <= coef.truncation_bound[0]
    X = rng.uniform(-1, 1, (2000, 3))
    assert sup_residual(coef, index_set, smooth_3d, X) <= coef.truncation_bound[0]
    if damping != "jackson":
        assert coef.truncation_bound[0] < 1e-3  # smooth f, degree 9: plain truncation is good
        assert coef.method == "interpolation"


def test_interpolation_is_reproducible_and_answers_within_the_bound() -> None:
    index_set = full_tensor(2, 12)

    def f(X: np.ndarray) -> np.ndarray:
        return np.abs(X[:, 0] - 0.2) ** 3 + X[:, 1]

    a = ch.interpolate(f, index_set, smoothness=3, rng=np.random.default_rng(1))
    b = ch.interpolate(f, index_set, smoothness=3, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(a.coefficients, b.coefficients)
    np.testing.assert_array_equal(a.truncation_bound, b.truncation_bound)
    X = np.random.default_rng(2).uniform(-1, 1, (800, 2))
    answer = a.constant[0] + a.coefficients[0] @ moments(X, index_set)
    assert abs(answer - f(X).mean()) <= a.truncation_bound[0]


# --- errors ------------------------------------------------------------------------------


def test_clear_errors_for_queries_the_evaluator_cannot_handle() -> None:
    index_set = total_degree(4, 14)
    with pytest.raises(MechanismError, match="d = 3 columns but the synopsis has d = 4"):
        ch.query_coefficients(GaussianMixture(np.zeros((1, 3)), np.ones(1), 1.0), index_set)
    with pytest.raises(MechanismError, match="d <= 3"):
        ch.query_coefficients(lambda X: X[:, 0], index_set)
    with pytest.raises(MechanismError, match="not supported"):
        ch.query_coefficients("x^2", index_set)
    with pytest.raises(MechanismError, match="non-finite"):
        ch.query_coefficients(lambda X: np.full(len(X), np.nan), total_degree(2, 5))
    with pytest.raises(MechanismError, match="one value per row"):
        ch.query_coefficients(lambda X: X, total_degree(2, 5))
    with pytest.raises(MechanismError, match="sigma"):
        AnisotropicGaussianMixture(np.zeros((1, 2)), np.ones(1), np.array([1.0, np.nan]))
    with pytest.raises(MechanismError, match="sigma"):
        AnisotropicGaussianMixture(np.zeros((1, 2)), np.ones(1), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(MechanismError, match="finite"):
        GaussianMixture(np.array([[np.inf, 0.0]]), np.ones(1), 1.0)
    with pytest.raises(MechanismError, match="sigma"):
        ch.query_coefficients(GaussianMixture(np.zeros((1, 4)), np.ones(1), 1e-7), index_set)
    with pytest.raises(MechanismError, match="non-negative integers"):
        Polynomial(np.array([[1.5, 0.0]]), np.ones(1))
    with pytest.raises(MechanismError, match="non-finite"):
        ProductQuery((np.array([1.0, np.inf]),))
    with pytest.raises(MechanismError, match="damping"):
        ch.interpolate(smooth_3d, full_tensor(3, 3), smoothness=2, damping="fejer")


@pytest.mark.parametrize("pair_elements", [None, 1])
def test_truncation_estimate_against_brute_force_enumeration(
    pair_elements: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Axis tail and weighted interaction energy against all multi-indices of a 3-D mixture.

    The expansion is exact at length 12 (degree < 12 per column), so enumerating
    ``{0..11}^3`` gives every coefficient ``c_r``; the estimate must match to rounding.
    ``pair_elements=1``: one query per working array (the chunking of large ``J``).
    """
    from app.mechanisms.basis import axis_total_degree

    if pair_elements is not None:
        monkeypatch.setattr(ch, "_PAIR_ELEMENTS", pair_elements)

    rng = np.random.default_rng(7)
    d, L, J = 3, 12, 4
    factors = rng.normal(size=(2, J, d, L)) / (1.0 + np.arange(L)) ** 2
    weights = rng.uniform(0.2, 1.0, size=(2, J))
    expansion = ch.TensorExpansion(weights, factors, np.zeros((2, J, d)), method="test")
    mu = np.column_stack([np.ones(d), rng.uniform(0.1, 1.0, size=(d, L - 1))])
    index_set = axis_total_degree(d, 2, 4)
    coef = ch.restrict(expansion, index_set)
    est = ch.truncation_estimate(expansion, index_set, coef.coefficients, mu)
    members = {tuple(r) for r in index_set.degrees}
    for q in range(2):
        axis, cross = 0.0, 0.0
        for r in itertools.product(range(L), repeat=d):
            if sum(r) == 0 or r in members:
                continue
            c = sum(
                weights[q, j] * math.prod(factors[q, j, i, r[i]] for i in range(d))
                for j in range(J)
            )
            nonzero = [i for i in range(d) if r[i] > 0]
            if len(nonzero) == 1:
                axis += abs(c)
            else:
                cross += c * c * math.prod(mu[i, r[i]] for i in nonzero)
        assert est.axis_tail[q] == pytest.approx(axis, rel=1e-10)
        assert est.cross_scale[q] == pytest.approx(math.sqrt(cross), rel=1e-8)


@pytest.mark.parametrize(("d", "D", "K"), [(3, 1, 1), (3, 1, 3), (3, 2, 2), (4, 2, 4), (3, 3, 5)])
def test_independence_extrapolation_against_enumeration(d: int, D: int, K: int) -> None:
    """value = sum over r not in S with r_i <= K of prod_i a_{r_i} b_{r_i e_i}, by brute
    force over {0..K}^d; gradient against central differences of that sum (random
    coefficients and moments: no structure to hide a wrong term)."""
    rng = np.random.default_rng(d * 100 + D * 10 + K)
    S = axis_total_degree(d, D, K) if K > D else total_degree(d, count_total_degree(d, D))
    Q, J, L = 2, 3, 7
    expansion = TensorExpansion(
        weights=rng.normal(size=(Q, J)),
        factors=rng.normal(size=(Q, J, d, L)),
        tails=np.zeros((Q, J, d)),
        method="test",
    )
    b = rng.normal(size=S.size)
    out = independence_extrapolation(expansion, S, b)
    assert out is not None
    inside = {tuple(int(v) for v in r) for r in S.degrees}
    rows, cols, ks = S.one_column_terms()

    def brute(table: np.ndarray) -> np.ndarray:
        total = np.zeros(Q)
        for r in itertools.product(range(K + 1), repeat=d):
            if sum(r) == 0 or r in inside:
                continue
            term = np.ones((Q, J))
            for i in range(d):
                term = term * expansion.factors[:, :, i, r[i]] * table[i, r[i]]
            total += (expansion.weights * term).sum(axis=1)
        return total

    table = np.zeros((d, K + 1))
    table[:, 0] = 1.0
    table[cols, ks] = b[rows]
    np.testing.assert_allclose(out.value, brute(table), rtol=1e-10, atol=1e-10)
    h = 1e-5
    numeric = np.zeros((Q, S.size))
    for row, i, k in zip(rows, cols, ks, strict=True):
        up, down = table.copy(), table.copy()
        up[i, k] += h
        down[i, k] -= h
        numeric[:, row] = (brute(up) - brute(down)) / (2 * h)
    np.testing.assert_allclose(out.gradient, numeric, rtol=1e-6, atol=1e-6)


def test_independence_extrapolation_other_sets() -> None:
    """Full tensors already hold every term (zero); a partial total-degree level or a gap
    in a column's degrees has no closed form here (None); bad moments are refused."""
    rng = np.random.default_rng(3)
    expansion = TensorExpansion(
        weights=np.ones((1, 2)),
        factors=rng.normal(size=(1, 2, 3, 5)),
        tails=np.zeros((1, 2, 3)),
        method="test",
    )
    full = full_tensor(3, 3)
    out = independence_extrapolation(expansion, full, np.zeros(full.size))
    assert out is not None
    assert np.all(out.value == 0.0)
    assert np.all(out.gradient == 0.0)
    partial = total_degree(3, 5)  # the 3 first-degree terms and 2 of the 6 second-degree
    assert independence_extrapolation(expansion, partial, np.zeros(5)) is None
    gap = IndexSet(np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [3, 0, 0]]))
    assert independence_extrapolation(expansion, gap, np.zeros(4)) is None
    with pytest.raises(MechanismError, match="moments must have shape"):
        independence_extrapolation(expansion, full, np.zeros(2))


def test_separable_blocks_cover_every_query_once_in_order() -> None:
    """Mixed Gaussian mixtures (two shapes, isotropic and anisotropic), a polynomial and a
    product query: every position appears once and each block's expansion evaluates, on
    random points, to the query it stands for."""
    rng = np.random.default_rng(8)
    d = 3
    queries: list[object] = []
    for q in range(7):
        J = 2 if q % 2 else 3
        centers, weights = rng.uniform(-1, 1, (J, d)), rng.uniform(0, 1, J)
        if q % 3 == 0:
            queries.append(AnisotropicGaussianMixture(centers, weights, np.array([0.5, 1.0, 2.0])))
        else:
            queries.append(GaussianMixture(centers, weights, 0.7))
    queries.insert(3, Polynomial(np.array([[1, 0, 2], [0, 1, 0]]), np.array([0.5, -1.0])))
    queries.append(ProductQuery((np.cos, None, np.array([0.5, 0.0, 0.5])), weight=2.0))
    X = rng.uniform(-1, 1, (20, d))
    seen: list[int] = []
    for positions, expansion in ch.separable_blocks(queries, d, block=2):
        assert expansion.n_queries == positions.size
        for row, position in enumerate(positions):
            kernels = np.ones((expansion.factors.shape[1], X.shape[0]))
            for i in range(d):
                kernels *= npcheb.chebval(X[:, i], expansion.factors[row, :, i, :].T)
            value = expansion.weights[row] @ kernels
            np.testing.assert_allclose(value, queries[position].evaluate(X), atol=1e-6)  # type: ignore[attr-defined]
        seen += positions.tolist()
    assert sorted(seen) == list(range(len(queries)))
    with pytest.raises(MechanismError, match=r"query 1 .* no separable form"):
        list(ch.separable_blocks([queries[0], lambda X: X[:, 0]], d))


# --- product queries: Gaussian factors and batches ---------------------------------------


def _closure(center: float, sigma: float):  # type: ignore[no-untyped-def]
    """The service's former representation of a Gaussian factor (an opaque callable)."""
    return lambda x: np.exp(-((x - center) ** 2) / (2.0 * sigma * sigma))


@pytest.mark.parametrize("sigma", [2.0, 0.5, 0.13, 0.03, 0.01, 0.002])
def test_gaussian_factor_is_exact_with_a_proven_tail_and_a_bounded_degree(sigma: float) -> None:
    """Gaussian1D coefficients: their error on 4000 points and corners (and the l1 distance
    to a 4x longer expansion) stays below the stated tail; the tail is negligible
    (< 1e-11, rounding included); N is about 10 / sigma (at most 12 / sigma + 24); they equal the former
    closure path's (callable_factor) to 1e-14."""
    rng = np.random.default_rng(41)
    n_points, tail = ch.gaussian_factor_points(sigma)
    assert n_points <= 12.0 / sigma + 24
    # aliasing + omitted tail below the tolerance; the rest is the DCT's rounding 4 N eps
    assert tail - 4 * n_points * ch.EPS <= 2 * ch.GAUSSIAN_TAIL_TOLERANCE
    assert tail < 1e-11
    centers = np.array([0.0, 0.37, -0.999, 1.0, 1.4])
    table = ch.gaussian_factor_table(centers, np.full(centers.size, sigma), n_points)
    reference = ch.gaussian_factor_table(centers, np.full(centers.size, sigma), 4 * n_points)
    X = np.concatenate([rng.uniform(-1, 1, 4000), [-1.0, 1.0]])
    for k, c in enumerate(centers):
        exact = Gaussian1D(float(c), sigma).evaluate(X)
        assert np.max(np.abs(npcheb.chebval(X, table[k]) - exact)) <= tail
        distance = np.abs(reference[k, :n_points] - table[k]).sum()
        distance += np.abs(reference[k, n_points:]).sum()
        assert distance <= tail
        # a product query carries exactly these coefficients and this tail
        one = ch.product_expansion(ProductQuery((None, Gaussian1D(float(c), sigma))))
        np.testing.assert_allclose(one.factors[0, 0, 1], table[k], rtol=0, atol=1e-15)
        assert one.tails[0, 0].tolist() == [0.0, tail]
        assert one.rigorous
        if sigma >= 0.01:  # the callable path needs 2^16 points below that
            former, _ = ch.callable_factor(_closure(float(c), sigma))
            length = max(former.size, n_points)
            np.testing.assert_allclose(
                np.pad(table[k], (0, length - n_points)),
                np.pad(former, (0, length - former.size)),
                rtol=0,
                atol=1e-14,
            )


def test_gaussian_width_classes_and_too_narrow_factors() -> None:
    """The class width is the largest 2^(k/8) <= sigma (so the bound made for it holds for
    sigma); a width needing more than MAX_POINTS_1D points is refused, naming the query."""
    for sigma in [*np.random.default_rng(42).uniform(1e-3, 3.0, 200), 0.5, 0.25, 2 ** (3 / 8)]:
        width = ch.gaussian_width_class(float(sigma))
        assert width <= sigma < width * 2 ** (1 / 8) * (1 + 1e-15)
        assert math.log2(width) * 8 == pytest.approx(round(math.log2(width) * 8), abs=1e-9)
    # N and the tail only grow as the width shrinks
    counts = [ch.gaussian_factor_points(s)[0] for s in (1.0, 0.9, 0.5, 0.3, 0.1)]
    assert counts == sorted(counts)
    narrow = ProductQuery((None, Gaussian1D(0.0, 1e-4)))
    with pytest.raises(MechanismError, match=r"query 1: factor 1: .*sigma 0.0001 is too narrow"):
        list(ch.separable_blocks([ProductQuery((None, None)), narrow], 2))
    with pytest.raises(MechanismError, match="positive and finite"):
        Gaussian1D(0.0, 0.0)
    with pytest.raises(MechanismError, match="finite"):
        Gaussian1D(float("inf"), 1.0)


def _mixed_products(d: int) -> list[object]:
    """Product queries with None factors, coefficient vectors of lengths 1..40 and Gaussian
    factors of several widths (one narrow), among other separable queries."""
    rng = np.random.default_rng(43)
    queries: list[object] = []
    for q in range(23):
        factors: list[object] = [None] * d
        for i in rng.choice(d, size=1 + q % 3, replace=False):
            if (q + i) % 3 == 0:
                factors[i] = rng.normal(size=1 + (7 * q + i) % 40)
            else:
                sigma = 0.04 if q == 5 else float(rng.choice([0.3, 0.5, 1.7]))
                factors[i] = Gaussian1D(float(rng.uniform(-1.2, 1.2)), sigma)
        queries.append(ProductQuery(tuple(factors), weight=float(rng.normal())))  # type: ignore[arg-type]
    queries.insert(4, ProductQuery((None,) * d, weight=0.5))  # only None factors
    queries.insert(7, ProductQuery((np.cos,) + (None,) * (d - 1)))  # callable: per query
    queries.insert(9, GaussianMixture(rng.uniform(-1, 1, (2, d)), rng.uniform(0, 1, 2), 0.7))
    queries.insert(11, Polynomial(np.eye(d, dtype=np.int64)[:2] * 2, np.array([1.0, -1.0])))
    return queries


@pytest.mark.parametrize("min_length", [1, 9, 60])
def test_batched_product_expansion_equals_the_one_by_one_expansion(min_length: int) -> None:
    """separable_blocks puts the product queries without callables into shared blocks; each
    row equals that query's own expansion: weights, tails (bit for bit) and factors (to
    rounding, zero-padded to the block's length)."""
    d = 4
    queries = _mixed_products(d)
    batchable = {
        position
        for position, q in enumerate(queries)
        if isinstance(q, ProductQuery) and not any(callable(g) for g in q.factors)
    }
    seen: list[int] = []
    largest_product_block = 0
    for positions, expansion in ch.separable_blocks(queries, d, min_length=min_length, block=8):
        assert expansion.n_queries == positions.size
        assert expansion.factors.shape[3] >= min_length
        in_batch = batchable.intersection(positions.tolist())
        assert not in_batch or in_batch == set(positions.tolist())  # no mixed blocks
        if in_batch:
            assert expansion.method == "product"
            assert expansion.rigorous
            largest_product_block = max(largest_product_block, positions.size)
        for row, position in enumerate(positions):
            query = queries[position]
            one = ch.expand(query, d, min_length=min_length)
            assert one is not None
            J, L = one.factors.shape[1], one.factors.shape[3]
            if in_batch:  # padding at most doubles the length
                assert L <= expansion.factors.shape[3] < 2 * L
            np.testing.assert_array_equal(expansion.weights[row, :J], one.weights[0])
            np.testing.assert_array_equal(expansion.tails[row, :J], one.tails[0])
            np.testing.assert_allclose(
                expansion.factors[row, :J, :, :L], one.factors[0], rtol=0, atol=1e-15
            )
            assert not np.any(expansion.factors[row, :J, :, L:])
        seen += positions.tolist()
    assert sorted(seen) == list(range(len(queries)))
    assert largest_product_block == 8
    products = [q for q in queries if isinstance(q, ProductQuery)]
    # and the one-by-one expansions are right: on random points they are the queries
    X = np.random.default_rng(44).uniform(-1, 1, (50, d))
    for query in products:
        one = ch.expand(query, d, min_length=min_length)
        assert one is not None
        value = np.full(X.shape[0], one.weights[0, 0])
        for i in range(d):
            value *= npcheb.chebval(X[:, i], one.factors[0, 0, i])
        np.testing.assert_allclose(value, query.evaluate(X), rtol=0, atol=1e-13)


@pytest.mark.parametrize("min_length", [1, 9, 60])
def test_separable_layout_gives_each_blocks_shape_before_expanding(min_length: int) -> None:
    """separable_layout plans the blocks of separable_blocks from the queries' sizes alone
    (what an answers request's work bound counts): the same positions, and the shape each
    expansion then has, padding included (stacked polynomials and a batch of mixtures,
    mixtures, products of several lengths); a block holding a callable factor, whose
    length is only known once it is expanded, has none."""
    d = 4
    rng = np.random.default_rng(45)
    queries = [
        q
        for q in _mixed_products(d)
        if not (isinstance(q, ProductQuery) and any(callable(g) for g in q.factors))
    ]
    queries.insert(2, GaussianMixtureBatch(rng.uniform(-1, 1, (3, 5, d)), np.ones((3, 5)), 0.2))
    queries.append(Polynomial(np.array([[0, 7, 0, 1], [1, 0, 0, 0], [0, 0, 3, 3]]), np.ones(3)))
    layout = ch.separable_layout(queries, d, min_length=min_length, block=8)
    blocks = list(ch.separable_blocks(queries, d, min_length=min_length, block=8))
    assert len(layout) == len(blocks)
    assert {planned.kind for planned in layout} == {"gaussian", "product", "stacked"}
    for planned, (positions, expansion) in zip(layout, blocks, strict=True):
        np.testing.assert_array_equal(planned.positions, positions)
        Q, J, _, L = expansion.factors.shape
        assert planned.shape == (Q, J, L)
        expanded = ch.expand_block(queries, planned, d, min_length=min_length)
        np.testing.assert_array_equal(expanded.factors, expansion.factors)
    callable_factor = ProductQuery((np.cos,) + (None,) * (d - 1))
    (planned,) = ch.separable_layout([queries[-1], callable_factor], d, block=8)
    assert planned.kind == "stacked"
    assert planned.shape is None


def test_product_blocks_are_bounded_in_size() -> None:
    """A narrow Gaussian does not pad a whole block: blocks are grouped by power-of-two
    length and hold at most DEFAULT_BLOCK_ELEMENTS // (d L) queries."""
    d = 30
    wide = [ProductQuery((Gaussian1D(0.1, 0.5),) + (None,) * (d - 1)) for _ in range(40)]
    narrow = [ProductQuery((None, Gaussian1D(0.2, 0.001)) + (None,) * (d - 2)) for _ in range(3)]
    queries = wide[:20] + narrow + wide[20:]
    blocks = list(ch.separable_blocks(queries, d, block=500))
    n_narrow = ch.gaussian_factor_points(0.001)[0]
    assert n_narrow > 8192  # 1 << 14 per block, DEFAULT_BLOCK_ELEMENTS // (30 * 16384) = 2
    rows = ch.DEFAULT_BLOCK_ELEMENTS // (d * (1 << (n_narrow - 1).bit_length()))
    sizes = sorted((e.factors.shape[3], positions.size) for positions, e in blocks)
    assert sizes[0] == (ch.gaussian_factor_points(0.5)[0], 40)
    assert sorted(size for _, size in sizes[1:]) == [3 - rows, rows]
    assert all(length == n_narrow for length, _ in sizes[1:])


def test_product_expansions_refuse_mixed_dimensions() -> None:
    with pytest.raises(MechanismError, match="same number of columns"):
        ch.product_expansions([ProductQuery((None,)), ProductQuery((None, None))])
    with pytest.raises(MechanismError, match="no queries"):
        ch.product_expansions([])
    with pytest.raises(MechanismError, match="d = 2 columns but the synopsis has d = 3"):
        list(ch.separable_blocks([ProductQuery((None, Gaussian1D(0.0, 1.0)))], 3))


def test_mixture_blocks_hold_at_most_the_block_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gaussian mixtures share a block up to ``block`` queries and up to
    DEFAULT_BLOCK_ELEMENTS coefficients of factors (a block of 500 mixtures of 100
    centres was 767 MiB of factors on 30 columns); one query larger than that on its own
    is a block by itself. The blocks still cover every query once, in order."""
    monkeypatch.setattr(ch, "DEFAULT_BLOCK_ELEMENTS", 5000)
    rng = np.random.default_rng(12)
    d = 3
    small = [GaussianMixture(rng.uniform(-1, 1, (4, d)), np.full(4, 0.25), 1.0) for _ in range(60)]
    large = [GaussianMixture(rng.uniform(-1, 1, (900, d)), np.full(900, 1 / 900), 1.0)]
    queries: list[object] = small[:30] + large + small[30:]
    blocks = list(ch.separable_blocks(queries, d, block=500))
    layout = ch.separable_layout(queries, d, block=500)
    assert [b.positions.tolist() for b in layout] == [p.tolist() for p, _ in blocks]
    length = blocks[0][1].factors.shape[3]
    rows = 5000 // (4 * d * length)
    assert 1 < rows < 60
    sizes = []
    for positions, expansion in blocks:
        if positions.tolist() == [30]:
            assert expansion.factors.size == 900 * d * length > 5000
        else:
            assert expansion.factors.size <= 5000
            sizes.append(positions.size)
    assert sizes == [rows] * (60 // rows) + ([60 % rows] if 60 % rows else [])
    seen = sorted(int(p) for positions, _ in blocks for p in positions)
    assert seen == list(range(61))


@pytest.mark.parametrize("min_points", [8, 51])
def test_min_gaussian_sigma_is_the_smallest_width_expanded(min_points: int) -> None:
    """Rounded up to 3 digits (by less than 1 %): it expands within the point limit, and
    1 % less does not (the refusal names it); a smaller limit gives a wider smallest width.
    The search from 51 points (a synopsis of degree 50) stops at other lengths than from
    8: its threshold differs (0.000228 was refused naming 8's 0.00022: review)."""
    smallest = ch.min_gaussian_sigma(ch.MAX_POINTS_1D, min_points)
    assert ch.gaussian_points(smallest, min_points) <= ch.MAX_POINTS_1D
    with pytest.raises(MechanismError, match=f"smallest sigma expanded is {smallest:.3g} "):
        ch.gaussian_points(smallest * 0.99, min_points)
    assert ch.min_gaussian_sigma(1024, min_points) > 10 * smallest


def test_the_parent_chain_lives_and_dies_with_its_index_set() -> None:
    """The parent chain that expands a product query over a set is kept on the set
    (``IndexSet.parent_chain``). A module-level cache keyed by the set (sets compare by
    identity, and a release decoded again is a new set) kept the last 8 sets and their
    chains alive, outside the answer cache's byte limit: the soak audit saw 58 MB an entry
    at R = 2 10^5, d = 30 (the set's degrees, 48 MB, and its chain, 6.4 MB). Here the set,
    once dropped, is collected."""
    import gc
    import weakref

    index_set = total_degree(3, 200)
    query = GaussianMixture(np.array([[0.1, -0.2, 0.3]]), np.array([1.0]), sigma=0.8)
    with_chain = ch.query_coefficients(query, index_set)
    assert "_parent_chain" in vars(index_set)  # computed once and kept on the set
    assert index_set.parent_chain is not None
    again = ch.query_coefficients(query, index_set)
    np.testing.assert_array_equal(again.coefficients, with_chain.coefficients)
    alive = weakref.ref(index_set)
    del index_set
    gc.collect()
    assert alive() is None
