"""Mechanism E of paper 004 and its estimators.

False-failure rates: chi-square and two-sample tests reject at p < 1e-6, z-tests at
5 sigma (~6e-7), the unbiasedness checks at 4 standard errors (~6e-5 each).

Several tests release one database of N identical rows instead of N one-row databases:
by the product form (eq. 15) the rows are perturbed independently with the same
one-row distribution, so the two are the same experiment.
"""

import math
from decimal import Decimal

import numpy as np
import opendp.prelude as dp
import pytest
from scipy import stats

from app.mechanisms import randomized_response as rr
from app.mechanisms import secure_random
from app.mechanisms.errors import MechanismError
from app.mechanisms.randomized_response import Conjunction, Domain, Heterogeneous, Table


def one_row_pmf(x: int, size: int, epsilon: float) -> np.ndarray:
    """Eq. 16: 1/g at x, e^-eps/g elsewhere."""
    g = 1 + (size - 1) * math.exp(-epsilon)
    pmf = np.full(size, math.exp(-epsilon) / g)
    pmf[x] = 1 / g
    return pmf


def exact_variance(x: np.ndarray, table: np.ndarray, release: rr.RRRelease) -> float:
    """Variance of the unbiased estimate at database x, by brute force over the pmf."""
    rho = release.replace_probability
    size = table.size
    total = 0.0
    for xi in x:
        pmf = np.full(size, rho / size)
        pmf[xi] += 1 - rho
        mean = pmf @ table
        total += pmf @ (table - mean) ** 2
    return total / (x.size * (1 - rho)) ** 2


# ----------------------------------------------------------------- sampling


@pytest.mark.parametrize(("size", "epsilon"), [(6, 1.0), (3, 0.3), (2, 2.5)])
def test_keep_and_replace_probabilities(size: int, epsilon: float) -> None:
    n = 120_000
    released = rr.release(np.full(n, 1), size, epsilon)
    counts = np.bincount(released.codes, minlength=size)
    expected = n * one_row_pmf(1, size, epsilon)
    assert stats.chisquare(counts, expected).pvalue > 1e-6
    assert released.keep_probability == pytest.approx(1 / (1 + (size - 1) * math.exp(-epsilon)))


def test_replacement_is_uniform_on_a_huge_domain() -> None:
    size = (1 << 40) + 3  # never materialised
    n = 200_000
    released = rr.release(np.zeros(n, dtype=np.int64), size, 2.0)
    kept = released.codes == 0
    p_keep = released.keep_probability
    z = (kept.mean() - p_keep) / math.sqrt(p_keep * (1 - p_keep) / n)
    assert abs(z) < 5
    moved = released.codes[~kept]
    assert moved.max() < size
    quarters = np.bincount(moved // (size // 4 + 1), minlength=4)
    assert stats.chisquare(quarters).pvalue > 1e-6
    assert stats.chisquare(np.bincount(moved % 5, minlength=5)).pvalue > 1e-6


@pytest.mark.parametrize(
    ("size", "epsilon"), [(2, 1.0), (6, 0.01), (1000, 3.0), ((1 << 62), 40.0), (5, 1e-9)]
)
def test_rounded_threshold_keeps_epsilon(size: int, epsilon: float) -> None:
    threshold = rr.replace_threshold(size, epsilon)
    rho = Decimal(size) / (Decimal(epsilon).exp() + Decimal(size - 1))
    assert Decimal(threshold) / secure_random.TWO_64 >= rho
    assert Decimal(threshold - 2) / secure_random.TWO_64 < rho  # rounded by at most 2 units
    effective = rr.effective_epsilon(size, threshold)
    assert effective <= epsilon
    assert effective == pytest.approx(epsilon, rel=1e-9, abs=1e-12)


def test_empirical_privacy_ratio_on_neighbouring_one_row_databases() -> None:
    """P[y | x = (0)] / P[y | x' = (1)] <= e^eps for every output y (Lemma 1).

    Tolerance: 5 standard errors of the log ratio, sqrt(1/c + 1/c') by the delta method.
    The largest ratio must also reach e^eps (the mechanism is tight, so a sampler that
    randomised more than claimed would be caught too).
    """
    size, epsilon, runs = 4, 1.0, 400_000
    counts_x = np.bincount(
        rr.release(np.zeros(runs, np.int64), size, epsilon).codes, minlength=size
    )
    counts_y = np.bincount(rr.release(np.ones(runs, np.int64), size, epsilon).codes, minlength=size)
    log_ratio = np.log(counts_x / counts_y)
    tolerance = 5 * np.sqrt(1 / counts_x + 1 / counts_y)
    assert np.all(np.abs(log_ratio) <= epsilon + tolerance)
    assert np.max(np.abs(log_ratio)) >= epsilon - tolerance.max()


@pytest.mark.slow
def test_matches_opendp_randomized_response() -> None:
    """Same output law as OpenDP's vetted make_randomized_response(categories, prob = 1/g)."""
    dp.enable_features("contrib")
    size, epsilon, runs = 5, 1.0, 8_000
    g = 1 + (size - 1) * math.exp(-epsilon)
    measurement = dp.m.make_randomized_response(list(range(size)), 1 / g)
    theirs = np.bincount([measurement(2) for _ in range(runs)], minlength=size)
    ours = np.bincount(rr.release(np.full(runs, 2), size, epsilon).codes, minlength=size)
    assert stats.chi2_contingency(np.stack([theirs, ours])).pvalue > 1e-6
    released = rr.release(np.array([0, 1]), size, epsilon)
    assert released.epsilon_effective == pytest.approx(measurement.map(1), rel=1e-9)


# ----------------------------------------------------------------- estimators


def test_unbiased_estimator_over_2000_draws() -> None:
    rng = np.random.default_rng(7)
    size, epsilon, draws = 5, 1.0, 2000
    x = rng.integers(0, size, size=30)
    table = rng.uniform(0, 1, size=size)
    truth = table[x].mean()
    releases = [rr.release(x, size, epsilon) for _ in range(draws)]
    estimates = np.array([r.estimate(table) for r in releases])
    standard_error = estimates.std(ddof=1) / math.sqrt(draws)
    # 6 standard errors (false failure 2e-9; the 4 used before failed 6e-5 per run, and
    # so did the plug-in check below): still rejects a bias of 0.13 estimate sds
    assert abs(estimates.mean() - truth) < 6 * standard_error
    # the closed-form variance (module docstring) equals the brute-force one ...
    variance = exact_variance(x, table, releases[0])
    assert estimates.var(ddof=1) == pytest.approx(variance, rel=0.2)  # ~6 sigma for 2000 draws
    # ... its plug-in estimate is unbiased, and the worst case and bound (20) dominate it
    plug_in = np.array([r.stderr(table, "plug_in") ** 2 for r in releases])
    assert abs(plug_in.mean() - variance) < 6 * plug_in.std(ddof=1) / math.sqrt(draws)
    worst = releases[0].stderr(table, "worst_case")
    bound = releases[0].stderr(table, "bound")
    assert variance <= worst**2 <= bound**2
    assert releases[0].stderr(table, "bound_proper") == pytest.approx(2 * bound)


def test_worst_case_stderr_is_attained() -> None:
    """The worst case is exact: some database reaches it (rows at the argmax of |phi - mu|)."""
    size = 4
    table = np.array([0.0, 0.1, 0.2, 1.0])
    released = rr.release(np.zeros(20, np.int64), size, 0.5)
    worst_row = int(np.argmax(np.abs(table - table.mean())))
    x = np.full(20, worst_row)
    assert released.stderr(table) == pytest.approx(math.sqrt(exact_variance(x, table, released)))


def test_heterogeneous_query_with_public_column() -> None:
    rng = np.random.default_rng(3)
    size, draws = 4, 2000
    x = rng.integers(0, size, size=40)
    public = np.repeat([10, 20, 30, 40], 10)
    tables = {g: rng.uniform(-1, 1, size=size) for g in (10, 20, 30, 40)}
    query = Heterogeneous(tables)
    truth = np.mean([tables[g][xi] for g, xi in zip(public, x, strict=True)])
    releases = [rr.release(x, size, 1.0, public=public) for _ in range(draws)]
    assert all(np.array_equal(r.public, public) for r in releases[:5])
    estimates = np.array([r.estimate(query) for r in releases])
    # 6 standard errors: false failure 2e-9 (4, as before, failed 6e-5 per run)
    assert abs(estimates.mean() - truth) < 6 * estimates.std(ddof=1) / math.sqrt(draws)
    # the same row function for every group is the linear query
    same = Heterogeneous(dict.fromkeys((10, 20, 30, 40), tables[10]))
    assert releases[0].estimate(same) == pytest.approx(releases[0].estimate(tables[10]))


def test_conjunction_is_the_papers_predicate() -> None:
    """C_phi = 2^{l-k} (remark after eq. 22) and evaluation equals the brute-force table."""
    domain = Domain((2, 2, 2, 2, 2))  # l = 5 binary attributes
    predicate = Conjunction(domain, {0: 1, 3: 1})  # k = 2
    assert predicate.total == 2 ** (5 - 2)
    cells = domain.decode(np.arange(domain.size))
    table = ((cells[:, 0] == 1) & (cells[:, 3] == 1)).astype(float)
    assert np.array_equal(predicate.evaluate(np.arange(domain.size)), table)
    x = domain.encode(np.random.default_rng(0).integers(0, 2, size=(500, 5)))
    released = rr.release(x, domain, 1.0)
    assert released.estimate(predicate) == pytest.approx(released.estimate(table))
    assert released.stderr(predicate) == pytest.approx(released.stderr(table))
    assert released.estimate_proper(predicate) == pytest.approx(released.estimate_proper(table))


def test_conjunction_with_value_sets_on_mixed_domain() -> None:
    domain = Domain((3, 5, 4))
    conj = Conjunction(domain, {1: [0, 2], 2: 3})
    cells = domain.decode(np.arange(domain.size))
    table = (np.isin(cells[:, 1], [0, 2]) & (cells[:, 2] == 3)).astype(float)
    assert np.array_equal(conj.evaluate(np.arange(domain.size)), table)
    assert conj.mean == pytest.approx(table.mean())


def test_conjunction_on_a_domain_too_large_to_list() -> None:
    domain = Domain((2,) * 60)
    x = np.random.default_rng(1).integers(0, 1 << 60, size=1000)
    released = rr.release(x, domain, 1.0)
    value = released.estimate(Conjunction(domain, {0: 1, 59: 0}))
    assert math.isfinite(value)
    assert math.isfinite(released.stderr(Conjunction(domain, {0: 1})))
    assert not rr.preview(1000, domain.size, 1.0).useful


def test_proper_estimator_is_on_the_lattice_and_within_lemma_3() -> None:
    size, n = 3, 50
    table = np.array([0.0, 1.0, 1.0])
    x = np.random.default_rng(2).integers(0, size, size=n)
    truth = table[x].mean()
    for _ in range(200):
        released = rr.release(x, size, 1.0)
        proper = released.estimate_proper(table)
        unbiased = released.estimate(table)
        assert proper * n == pytest.approx(round(proper * n))
        assert 0.0 <= proper <= 1.0
        assert abs(proper - truth) <= 2 * abs(unbiased - truth) + 1e-12  # Appendix B


def test_one_pass_answer_is_the_separate_estimators() -> None:
    """answer() reads the rows once for what estimate/estimate_proper and the two stderr
    kinds each read them for; it must give exactly their values, and refuse the proper
    estimate where they do (row functions of different two values, here by group)."""
    rng = np.random.default_rng(5)
    domain = Domain((2, 3, 4))
    x = domain.encode(rng.integers(0, [2, 3, 4], size=(300, 3)))
    public = rng.integers(0, 3, size=300)
    released = rr.release(x, domain, 1.0, public=public)
    indicator = np.isin(np.arange(domain.size), [1, 5, 7, 20]).astype(float)
    queries = [
        Conjunction(domain, {0: 1, 2: [0, 3]}),
        indicator,
        Heterogeneous({0: indicator, 1: Conjunction(domain, {1: 2}), 2: indicator}),
        rng.uniform(-1, 1, size=domain.size),  # not two-valued: no proper estimate
        Heterogeneous({0: indicator, 1: 2 * indicator, 2: indicator}),  # pairs differ
    ]
    for position, query in enumerate(queries):
        assert released.answer(query, proper=False) == (
            released.estimate(query),
            released.stderr(query, "worst_case"),
            released.stderr(query, "bound"),
            released.interval(query),
        ), position
        if position < 3:
            assert released.answer(query, proper=True) == (
                released.estimate_proper(query),
                released.stderr(query, "worst_case"),
                released.stderr(query, "bound_proper"),
                released.interval(query, proper=True),
            ), position
        else:
            with pytest.raises(MechanismError, match="same two"):
                released.answer(query, proper=True)
            with pytest.raises(MechanismError, match="same two"):
                released.estimate_proper(query)


def test_answers_from_the_cell_counts_are_the_row_by_row_sums() -> None:
    """Answers read the released rows counted by (public value, code) once, not every row
    per query: the estimate and the plug-in stderr (the two that read the rows' values)
    equal the row-by-row formulas (eq. 17-18) to rounding, with a public column of many
    values, one of them held by a single row, and without one."""
    rng = np.random.default_rng(11)
    domain = Domain((3, 4))
    n = 2000
    x = domain.encode(rng.integers(0, [3, 4], size=(n, 2)))
    public = np.concatenate([rng.integers(0, 40, size=n - 1), [99]])
    for released in (rr.release(x, domain, 0.7, public=public), rr.release(x, domain, 0.7)):
        counts = released.cell_counts
        assert int(counts.counts.sum()) == n
        assert counts.size <= domain.size * (41 if released.public is not None else 1)
        tables = {g: rng.uniform(-1, 1, size=domain.size) for g in range(100)}
        queries: list[rr.Query] = [tables[0], Conjunction(domain, {0: [0, 2], 1: 3})]
        if released.public is not None:
            queries.append(Heterogeneous({g: tables[g] for g in np.unique(public)}))
        rho, margin = released.replace_probability, released.keep_margin
        for query in queries:
            if isinstance(query, Heterogeneous):
                functions = [query.functions[int(g)] for g in released.public]
            else:
                function = rr._as_row_function(query)
                functions = [function] * n
            rows = zip(functions, released.codes, strict=True)
            phi = np.array([f.evaluate(np.array([c]))[0] for f, c in rows])
            mu = np.array([f.mean for f in functions])
            spread = np.array([f.spread for f in functions])
            estimate = (phi.sum() - rho * mu.sum()) / (n * margin)
            assert released.estimate(query) == pytest.approx(estimate, rel=1e-12, abs=1e-15)
            dev2 = max((((phi - mu) ** 2).sum() - rho * spread.sum()) / margin, 0.0)
            plug_in = math.sqrt(rho / (n * margin) ** 2 * (margin * dev2 + spread.sum()))
            assert released.stderr(query, "plug_in") == pytest.approx(plug_in, rel=1e-12)


def test_preview_gives_bound_20_and_warns() -> None:
    good = rr.preview(1_000_000, 4, 1.0)
    e = math.exp(-1.0)
    assert good.rmse_bound == pytest.approx((1 + 3 * e) / (1 - e) / 1000)
    assert good.warning is None
    assert good.useful
    useless = rr.preview(1000, 2**20, 1.0)
    assert not useless.useful
    assert useless.warning is not None
    assert useless.warning.startswith("useless")
    weak = rr.preview(1000, 4, 1.0)
    assert weak.warning is not None
    assert weak.warning.startswith("weak")
    assert weak.rows_for_rmse_0_1 == math.ceil(((1 + 3 * e) / (1 - e) / 0.1) ** 2)


def test_preview_calls_useless_only_a_release_worse_than_answering_one_half() -> None:
    """Bound (20) bounds a row's term of the exact variance by ``(b - a)^2``; it is at most
    ``(b - a)^2 / 4`` (``RRPreview``'s docstring), so no database and no query with range
    1 gives the estimate (17) an RMS error above half of it. With n = 569 and |D| = 32 at epsilon 1 (WDBC's diagnosis and two columns
    of 16 cells) the bound is 0.82, but the largest RMS error the release can have is
    0.41 < 0.5: a weak release, not a useless one (it was called useless, "worse than
    answering 1/2 without data"). Checked against the release's exact worst-case stderr
    (the maximum over databases) of every indicator query of the first k cells."""
    n, size, epsilon = 569, 32, 1.0
    preview = rr.preview(n, size, epsilon)
    assert 0.5 <= preview.rmse_bound < 1.0
    assert preview.rmse_worst_case == preview.rmse_bound / 2
    assert preview.useful
    assert preview.warning is not None
    assert preview.warning.startswith("weak")
    codes = np.random.default_rng(3).integers(0, size, n)
    release = rr.release(codes, size, epsilon)
    worst = [release.stderr(rr.Table((np.arange(size) < k).astype(float))) for k in range(1, size)]
    assert max(worst) <= preview.rmse_worst_case * (1 + 1e-9)
    assert max(worst) >= 0.99 * preview.rmse_worst_case  # attained up to rho's rounding
    useless = rr.preview(n, size, 0.1)
    assert useless.rmse_worst_case >= 0.5
    assert not useless.useful
    assert useless.warning is not None
    assert useless.warning.startswith("useless")


# ----------------------------------------------------------------- helpers


def test_domain_codes_match_numpy_mixed_radix() -> None:
    domain = Domain((3, 4, 5))
    values = np.random.default_rng(0).integers(0, [3, 4, 5], size=(100, 3))
    codes = domain.encode(values)
    assert np.array_equal(codes, np.ravel_multi_index(values.T, (3, 4, 5)))
    assert np.array_equal(domain.decode(codes), values)
    assert domain.size == 60
    big = Domain((1000,) * 6)
    row = np.array([[999, 0, 1, 2, 3, 998]])
    assert np.array_equal(big.decode(big.encode(row)), row)


def test_discretisation_of_section_v_a() -> None:
    assert rr.default_bits(65_536) == 4  # 2^(2k) = 256 = sqrt(65536)
    assert rr.default_bits(32_561) == 4
    assert rr.default_bits(2) == 1
    x = np.linspace(-1, 1, 10_001)
    for bits in (1, 3, 8):
        cells = rr.discretize(x, bits)
        assert cells.min() == 0
        assert cells.max() == 2**bits - 1
        assert np.max(np.abs(rr.cell_midpoints(cells, bits) - x)) <= 2.0**-bits + 1e-15


def test_round_trip_through_dict() -> None:
    domain = Domain((2, 3))
    released = rr.release(np.array([0, 5, 3, 1]), domain, 0.7, public=np.array([1, 1, 2, 2]))
    back = rr.RRRelease.from_dict(released.to_dict())
    assert np.array_equal(back.codes, released.codes)
    assert np.array_equal(back.public, released.public)
    assert back.replace_threshold == released.replace_threshold
    assert back.cardinalities == (2, 3)
    assert back.privacy_cost == released.privacy_cost
    assert released.privacy_cost.epsilon == 0.7
    assert released.privacy_cost.kind == "dp"


# ----------------------------------------------------------------- bad arguments


SECRET = 987_654_321


@pytest.mark.parametrize(
    ("codes", "size", "epsilon", "match"),
    [
        (np.array([0.5, 1.0]), 4, 1.0, "integers"),
        (np.zeros((2, 2), np.int64), 4, 1.0, "1-D"),
        (np.array([0, SECRET]), 4, 1.0, "^codes has entries outside"),
        (np.array([-1, 0]), 4, 1.0, "outside"),
        (np.array([], np.int64), 4, 1.0, "empty"),
        (np.array([0]), 1, 1.0, "domain_size"),
        (np.array([0]), 1 << 63, 1.0, "domain_size"),
        (np.array([0]), 2.0, 1.0, "domain_size"),
        (np.array([0]), 4, 0.0, "epsilon"),
        (np.array([0]), 4, math.inf, "epsilon"),
        (np.array([0]), 4, math.nan, "epsilon"),
        (np.array([0]), 1 << 62, 0.05, "pure noise"),
    ],
)
def test_release_rejects(codes: np.ndarray, size: int, epsilon: float, match: str) -> None:
    with pytest.raises(MechanismError, match=match) as info:
        rr.release(codes, size, epsilon)
    assert str(SECRET) not in str(info.value)


@pytest.mark.parametrize(
    ("public", "match"),
    [
        (np.array([1, 2]), "one entry per row"),
        (np.array([1, 2, -3]), "negative"),
        (np.array([1.0, 2.0, 3.0]), "integer"),
    ],
)
def test_release_rejects_public(public: np.ndarray, match: str) -> None:
    with pytest.raises(MechanismError, match=match):
        rr.release(np.array([0, 1, 2]), 4, 1.0, public=public)


def test_queries_reject() -> None:
    released = rr.release(np.array([0, 1, 2]), 4, 1.0)
    with pytest.raises(MechanismError, match="defined on 3 cells"):
        released.estimate(np.array([0.0, 1.0, 2.0]))
    with pytest.raises(MechanismError, match="constant"):
        released.estimate(np.ones(4))
    with pytest.raises(MechanismError, match="same two"):
        released.estimate_proper(np.array([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(MechanismError, match="kind"):
        released.stderr(np.arange(4.0), "exact")  # type: ignore[arg-type]
    with pytest.raises(MechanismError, match="public column"):
        released.estimate(Heterogeneous({0: np.arange(4.0)}))
    with pytest.raises(MechanismError, match="release's domain"):
        released.estimate(Conjunction(Domain((2, 2)), {0: 1}))
    with_public = rr.release(np.array([0, 1, 2]), 4, 1.0, public=np.array([5, 5, 6]))
    with pytest.raises(MechanismError, match="no row function for 1"):
        with_public.estimate(Heterogeneous({5: np.arange(4.0)}))


@pytest.mark.parametrize(
    ("terms", "match"),
    [
        ({}, "at least one term"),
        ({3: 0}, "outside the domain"),
        ({0: 2}, "outside its 2 categories"),
        ({0: []}, "no allowed value"),
        ({0: [-1]}, "outside its 2 categories"),
        ({1: [0, 3]}, "outside its 3 categories"),
        ({1: range(1, 4)}, "outside its 3 categories"),
        ({1: range(2, 2)}, "no allowed value"),
        ({0: [True]}, "value must be an integer"),
        ({0: [0.0]}, "value must be an integer"),
        ({0: "0"}, "value must be an integer"),
        ({0: [0, 1], 1: [0, 1, 2]}, "every value"),
    ],
)
def test_conjunction_rejects(terms: dict[int, object], match: str) -> None:
    with pytest.raises(MechanismError, match=match):
        Conjunction(Domain((2, 3)), terms)  # type: ignore[arg-type]


def test_conjunction_takes_numpy_integers() -> None:
    domain = Domain((2, 3))
    plain = Conjunction(domain, {1: [0, 2]})
    assert Conjunction(domain, {1: np.array([0, 2])}).terms == plain.terms
    assert Conjunction(domain, {np.int64(1): (np.int32(2), 0)}).terms == plain.terms
    assert plain.terms == {1: frozenset({0, 2})}
    assert Conjunction(domain, {1: range(1, 3)}).terms == {1: frozenset({1, 2})}


def test_helpers_reject() -> None:
    with pytest.raises(MechanismError, match="cardinality"):
        Domain((2, 0))
    with pytest.raises(MechanismError, match="2\\^62"):
        Domain((1 << 40, 1 << 40))
    # neither the value nor a count of them (on the measure path it reaches the status)
    with pytest.raises(MechanismError, match=r"^attribute 0 has values outside its 3"):
        Domain((3,)).encode(np.array([[SECRET], [SECRET]]))
    with pytest.raises(MechanismError, match="outside \\[-1, 1\\]"):
        rr.discretize(np.array([0.0, 1.5]), 3)
    with pytest.raises(MechanismError, match="non-finite") as info:
        rr.discretize(np.array([np.nan, np.inf, 0.0]), 3)
    assert "2" not in str(info.value)  # no count of the offending values
    with pytest.raises(MechanismError, match="bits"):
        rr.discretize(np.array([0.0]), 0)
    with pytest.raises(MechanismError, match="n"):
        rr.preview(0, 4, 1.0)
    with pytest.raises(MechanismError, match="1-D"):
        Table(np.ones((2, 2)))


def _seeded_sampler(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """A seeded stand-in for OpenDP's CSPRNG (which cannot be seeded): the same laws,
    ``P[True] = T / 2^64`` and uniform integers below ``bound``."""
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(
        secure_random,
        "bernoulli",
        lambda size, threshold: rng.random(size) < threshold / secure_random.TWO_64,
    )
    monkeypatch.setattr(
        secure_random, "uniform_below", lambda size, bound: rng.integers(0, bound, size)
    )


def test_intervals_are_clipped_to_the_range_of_the_row_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At small epsilon ``value +- 1.96 stderr`` of a proportion spans far more than
    [0, 1] (Adult at epsilon 0.1: [-31, 32]); every exact answer lies in ``[a, b]``, the
    least and greatest value of the row functions, so the interval is clipped there,
    both ends, for the unbiased and the proper estimate, a table with values in [-1, 2]
    and a heterogeneous query (its range: the least ``a_i`` to the greatest ``b_i``). Where
    the clipped normal interval is inside ``[a, b]`` it is unchanged."""
    _seeded_sampler(monkeypatch, 3)
    rng = np.random.default_rng(3)
    domain = Domain((2, 3, 4))
    x = domain.encode(rng.integers(0, [2, 3, 4], size=(400, 3)))
    public = rng.integers(0, 2, size=400)
    table = rng.uniform(-1, 2, size=domain.size)
    z = 1.959963984540054
    for epsilon in (0.1, 12.0):
        released = rr.release(x, domain, epsilon, public=public)
        queries: list[tuple[rr.Query, float, float, bool]] = [
            (Conjunction(domain, {0: 1, 2: [0, 3]}), 0.0, 1.0, True),
            (table, float(table.min()), float(table.max()), False),
            (Heterogeneous({0: 2 * (table > 0), 1: Conjunction(domain, {1: 2})}), 0.0, 2.0, False),
        ]
        for query, a, b, proper_too in queries:
            for proper in (False, True) if proper_too else (False,):
                value, stderr, _, interval = released.answer(query, proper=proper)
                assert interval == released.interval(query, proper=proper)
                low, high = value - z * stderr, value + z * stderr
                want = (min(max(low, a), b), max(min(high, b), a))
                assert interval == pytest.approx(want, rel=1e-12, abs=1e-12)
                assert a <= interval[0] <= interval[1] <= b
                if epsilon < 1:  # the normal interval is wider than the range: clipped
                    assert low < a
                    assert high > b
                    assert interval == (a, b)
    with pytest.raises(MechanismError, match="level"):
        released.interval(queries[0][0], level=1.0)


def test_interval_coverage_at_a_fixed_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 95 % interval holds the exact answer (on the raw rows) at its level: 600
    releases of 300 rows from a seeded stand-in for the CSPRNG, a conjunction and a 0/1
    table whose uniform mean is 1/2 (there the worst-case stderr is exact, so the
    interval is not conservative), at epsilon 1 and 3. Tolerance: 3 binomial standard
    errors of the pooled share (1.3 %) below 0.95; this draw gives 0.940. A variance
    without its ``rho s^2`` term (0.51), without its ``(1 - rho) (phi - mu)^2`` term
    (0.92), or a 1.645 quantile (0.905) fails it."""
    _seeded_sampler(monkeypatch, 11)
    rng = np.random.default_rng(11)
    domain = Domain((2, 4, 4))
    x = domain.encode(
        np.column_stack(
            [rng.integers(0, 2, 300), rng.binomial(3, 0.3, 300), rng.binomial(3, 0.6, 300)]
        )
    )
    half_of_the_cells = np.zeros(domain.size)
    half_of_the_cells[rng.permutation(domain.size)[: domain.size // 2]] = 1.0
    # mu = 1/2: the worst-case stderr is the exact one, the interval is not conservative
    queries: list[rr.Query] = [Conjunction(domain, {0: 1}), half_of_the_cells]
    truth = np.array([np.mean(_as_table(q, domain)[x]) for q in queries])
    releases = 600
    inside = np.zeros((len(queries), releases, 2), dtype=bool)
    for k, epsilon in enumerate((1.0, 3.0)):
        for r in range(releases):
            released = rr.release(x, domain, epsilon)
            for i, q in enumerate(queries):
                low, high = released.answer(q, proper=False)[3]
                inside[i, r, k] = low <= truth[i] <= high
    coverage = inside.mean()
    tolerance = 3 * math.sqrt(0.95 * 0.05 / inside.size)
    assert coverage >= 0.95 - tolerance, inside.mean(axis=1)


def _as_table(query: rr.Query, domain: Domain) -> np.ndarray:
    if isinstance(query, Conjunction):
        return query.evaluate(np.arange(domain.size))
    return np.asarray(query)
