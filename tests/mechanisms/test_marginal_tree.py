"""The tree of two-way histograms (app/mechanisms/marginal_tree.py)."""

import itertools
import math
from typing import Any

import numpy as np
import opendp.prelude as dp
import pytest
from scipy.special import chdtri

from app.mechanisms import bootstrap, marginal_tree, marginals, noise
from app.mechanisms.chebyshev import gaussian_expansion
from app.mechanisms.data import as_source
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import GaussianMixtureBatch
from tests.mechanisms.conftest import log_calls


def test_rho_budget_is_the_largest_rho_within_the_budget() -> None:
    rho = noise.rho_budget(1.0, 1e-9)
    unit = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.0
    )
    converted = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(unit), delta=1e-9)
    assert converted.map(math.sqrt(2 * rho))[0] <= 1.0
    assert converted.map(math.sqrt(2 * rho * 1.001))[0] > 1.0
    # the textbook bound eps <= rho + 2 sqrt(rho log(1/delta)) is looser than OpenDP's
    assert rho + 2 * math.sqrt(rho * math.log(1e9)) >= 1.0
    with pytest.raises(MechanismError, match="delta > 0"):
        noise.rho_budget(1.0, 0.0)


def _calls_to_opendp_searches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the OpenDP searches :func:`marginal_tree.plan` runs (``rho_budget``,
    ``calibrate``), recorded as they are called; their caches emptied first."""
    noise.rho_budget.cache_clear()
    marginals.noise_stddev.cache_clear()
    calls: list[str] = []
    for name in ("rho_budget", "calibrate"):
        original = getattr(noise, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            calls.append(_name)
            return _original(*args, **kw)

        monkeypatch.setattr(noise, name, counted)
    return calls


def test_a_tree_whose_pair_bins_exceed_the_cells_is_refused_before_the_opendp_searches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Near epsilon = 1e-12 every histogram resolves to 2 cells and the default 4 pair
    bins are refused; the refusal came after rho_budget's and the histogram noise's
    searches over OpenDP's conversions (2-8 s, about 150 maps). A closed-form floor on the
    noise settles the cells first: the same refusal, and no search is run."""
    calls = _calls_to_opendp_searches(monkeypatch)
    for n, d, delta, bins, atoms in (
        (4, 2, 1e-6, None, None),
        (569, 30, 1e-3, None, None),
        (4, 2, 0.5, None, None),
        (1000, 5, 1e-6, 3, None),
        (1000, 5, 1e-6, None, False),
    ):
        cells = 2 if bins is None else bins
        message = f"pair_bins \\(4, the default\\) cannot exceed the {cells} cells"
        with pytest.raises(MechanismError, match=message):
            marginal_tree.plan(n, d, 1e-12, delta, bins, atoms)
        assert calls == [], (n, d, delta, bins, atoms)


def test_the_noise_floor_is_below_the_calibrated_noise_and_settles_the_cells_as_plan_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gaussian_scale_floor is a lower bound on the scale OpenDP's conversions calibrate
    (the histograms' noise), and where it settles (bins, atoms) before them, plan resolves
    the same ones; where it does not (a larger budget), plan runs its searches as before."""
    for n, d, epsilon, delta in (
        (4, 2, 1e-12, 1e-6),
        (1000, 5, 1e-12, 0.5),
        (569, 30, 1e-6, 1e-9),
        (569, 30, 0.01, 1e-3),
        (100, 3, 0.3, 0.2),
        (10**5, 10, 0.05, 1e-6),
    ):
        sensitivity = marginals.histogram_sensitivity(n, d)["l2"]
        floor = noise.gaussian_scale_floor(sensitivity, epsilon, delta)
        stddev = marginals.noise_stddev(n, d, epsilon, delta)
        assert 0 <= floor <= stddev, (n, d, epsilon, delta)
        settled = marginal_tree._settled_cells(n, d, epsilon, delta, None, None)
        if settled is not None:
            assert settled == marginals.resolve(n, d, epsilon, delta), (n, d, epsilon, delta)
    calls = _calls_to_opendp_searches(monkeypatch)
    plan = marginal_tree.plan(569, 30, 1.0, 1e-6)
    assert plan.bins > 2
    assert "rho_budget" in calls
    assert "calibrate" in calls


def test_scales_meet_their_zcdp_shares() -> None:
    scale = noise.gaussian_scale_for_rho(0.3, 0.01)
    assert (0.3 / scale) ** 2 / 2 <= 0.01 * (1 + 1e-9)
    assert scale == pytest.approx(0.3 / math.sqrt(0.02), rel=1e-9)
    s = noise.noisy_max_scale(2.0, 1e-4)
    assert noise._noisy_max(s).map(2.0) <= 1e-4


def test_pair_table_and_score_sensitivity_brute_force() -> None:
    """Replace-one neighbours: the d - 1 pair tables move by at most sqrt(2 (d-1)) / n in
    L2 (attained), and every selection score n ||T - P_i (x) P_j||_1 by at most 2."""
    rng = np.random.default_rng(1)
    n, d, bins, b = 40, 4, 6, 3
    edges = [(0, 1), (1, 2), (1, 3)]
    P = rng.dirichlet(np.ones(b), size=d)
    bound = marginal_tree.pair_table_sensitivity(n, d - 1)
    worst = 0.0
    for trial in range(300):
        X = rng.uniform(-1, 1, size=(n, d))
        Y = X.copy()
        Y[rng.integers(n)] = rng.choice([-0.99, 0.99], size=d) * rng.uniform(0.5, 1, size=d)
        # the grouping is public (released marginals): any of the groupings
        grouping = marginal_tree.GROUPINGS[trial % len(marginal_tree.GROUPINGS)]
        group = marginal_tree.column_groups(rng.dirichlet(np.ones(bins), size=(d,)), b, grouping)
        cx = marginal_tree.coarse_codes(as_source(X), bins, False, group)
        cy = marginal_tree.coarse_codes(as_source(Y), bins, False, group)
        tx = np.stack([marginal_tree.pair_table(cx, i, j, b) for i, j in edges])
        ty = np.stack([marginal_tree.pair_table(cy, i, j, b) for i, j in edges])
        worst = max(worst, float(np.linalg.norm((tx - ty).ravel())))
        for i, j in itertools.combinations(range(d), 2):
            sx = n * np.abs(marginal_tree.pair_table(cx, i, j, b) - np.outer(P[i], P[j])).sum()
            sy = n * np.abs(marginal_tree.pair_table(cy, i, j, b) - np.outer(P[i], P[j])).sum()
            assert abs(sx - sy) <= 2.0 + 1e-9
        # the scores as the mechanism computes them, against the float-aware bound
        _, sx_all = marginal_tree.pair_scores(cx, P)
        _, sy_all = marginal_tree.pair_scores(cy, P)
        assert np.max(np.abs(sx_all - sy_all)) <= marginal_tree.score_sensitivity(n, b)
    assert worst <= bound + 1e-12
    assert worst == pytest.approx(bound)  # a row moved to the other end of every column


def test_score_sensitivity_covers_rounding_and_sets_the_selection_scale() -> None:
    """The rounding margin is positive, tiny, grows with n and b, and is what the plan's
    noisy max is calibrated to (2 alone would rest on exact arithmetic)."""
    small = marginal_tree.score_sensitivity(100, 4)
    large = marginal_tree.score_sensitivity(10**9, 16)
    assert 2.0 < small < large < 2.0 + 1e-3
    assert marginal_tree.score_sensitivity(10**6, 4) > marginal_tree.score_sensitivity(10**6, 3)
    fixed = marginal_tree.plan(5000, 10, 1.0, 1e-9)
    rho_round = fixed.rho * marginal_tree.SHARES["select"] / 9
    expected = noise.noisy_max_scale(marginal_tree.score_sensitivity(5000, 4), rho_round)
    assert fixed.selection_scale == expected
    assert expected > noise.noisy_max_scale(2.0, rho_round)
    # near-worst rounding: scores ~ n apart from Q in every cell, replaced row counted twice
    rng = np.random.default_rng(5)
    n, b = 2**20, 4
    P = rng.dirichlet(np.ones(b), size=2)
    codes = rng.integers(0, b, size=(n, 2))
    other = codes.copy()
    other[0] = (codes[0] + 1) % b
    _, sx = marginal_tree.pair_scores(codes, P)
    _, sy = marginal_tree.pair_scores(other, P)
    assert abs(float(sx[0] - sy[0])) <= marginal_tree.score_sensitivity(n, b)


def test_rake_matches_the_margins() -> None:
    rng = np.random.default_rng(2)
    rows, cols = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    rows[1] = 0.0
    rows /= rows.sum()
    t = marginal_tree.rake(rng.uniform(size=(4, 4)), rows, cols)
    np.testing.assert_allclose(t.sum(axis=1), rows, atol=1e-9)
    np.testing.assert_allclose(t.sum(axis=0), cols, atol=1e-6)
    assert np.all(t[1] == 0)


def _small_tree(seed: int, grouping: str = "equal") -> marginal_tree.TreeMeasurements:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=3000)
    X = np.clip(
        np.column_stack([z, z + 0.3 * rng.normal(size=3000), rng.normal(size=3000)]) / 3, -1, 1
    )
    return marginal_tree.measure(
        X, 2.0, 1e-6, bins=6, bound_atoms=True, pair_bins=3, grouping=grouping
    )


@pytest.mark.parametrize("law", ["model", "coarse_model"])
@pytest.mark.parametrize("grouping", marginal_tree.GROUPINGS)
def test_expectations_equal_brute_force_enumeration_of_the_tree_law(
    grouping: str, law: str
) -> None:
    """The copula law (each fine cell its own group) and the blocks law (coarse groups)."""
    tree = _small_tree(3, grouping)
    model = getattr(tree, law)
    d, cells = model.p.shape
    batch = GaussianMixtureBatch.random(5, 3, d, 0.7, np.random.default_rng(4))
    expansion = gaussian_expansion(batch.centers, batch.weights, batch.sigma)
    length = int(expansion.factors.shape[3])
    means = marginals.cell_means(tree.one_way.bins, tree.one_way.atoms, length)
    per_cell = np.einsum("qjik,ck->qjic", expansion.factors, means)  # (Q, J, d, cells)
    parent, tables = model.parent, model.tables
    brute = np.zeros(5)
    for combo in itertools.product(range(cells), repeat=d):
        g = [int(model.group[i, c]) for i, c in enumerate(combo)]
        prob = 1.0
        for i, c in enumerate(combo):
            if model.P[i, g[i]] == 0:
                prob = 0.0
                break
            prob *= model.p[i, c] / model.P[i, g[i]]
            prob *= model.P[i, g[i]] if parent[i] < 0 else tables[i][g[parent[i]], g[i]]
        if prob == 0.0:
            continue
        value = np.prod([per_cell[:, :, i, c] for i, c in enumerate(combo)], axis=0)
        brute += prob * np.einsum("qj,qj->q", batch.weights, value)
    np.testing.assert_allclose(model.expectations(expansion, means), brute, rtol=1e-10)
    if law == "model":
        np.testing.assert_allclose(tree.expectations(expansion), brute, rtol=1e-10)


@pytest.mark.parametrize("grouping", marginal_tree.GROUPINGS)
def test_sample_follows_the_tree_law_and_step_one_marginals(grouping: str) -> None:
    """The support's query averages match the exact expectations (Monte Carlo, 2e5 points:
    standard error < 2e-3 here) and each column's cell frequencies match ``p_i``."""
    tree = _small_tree(5, grouping)
    model = tree.model
    points = model.sample(200_000, np.random.default_rng(6), tree.one_way.bins, True)
    batch = GaussianMixtureBatch.random(5, 3, 3, 0.7, np.random.default_rng(7))
    exact = tree.expectations(gaussian_expansion(batch.centers, batch.weights, batch.sigma))
    np.testing.assert_allclose(batch.answers(points), exact, atol=1e-2)
    freq = marginals.exact_histograms(as_source(points), tree.one_way.bins, True)
    np.testing.assert_allclose(freq, model.p, atol=5e-3)


def test_selection_finds_the_dependent_pair() -> None:
    """Columns 0 and 1 are one variable; 2 and 3 are independent noise: at n = 20000 the
    first selected edge is (0, 1) (its score is ~ n / 2, the others' ~ sqrt(n))."""
    rng = np.random.default_rng(8)
    z = rng.uniform(-1, 1, size=20_000)
    X = np.column_stack([z, z, rng.uniform(-1, 1, size=(20_000, 2))])
    tree = marginal_tree.measure(X, 1.0, 1e-9)
    assert tree.edges[0] == (0, 1)
    assert np.trace(tree.coarse_model.joint[0]) > 0.9  # the raked table keeps the diagonal
    # the copula's fine table too: within a cell or two of it (66 cells here)
    fine = tree.model.joint[0]
    near = np.abs(np.subtract.outer(np.arange(len(fine)), np.arange(len(fine)))) <= 1
    assert fine[near].sum() > 0.9


def test_privacy_cost_json_round_trip_and_errors() -> None:
    tree = _small_tree(9)
    assert tree.privacy_cost.within(2.0, 1e-6)
    again = marginal_tree.TreeMeasurements.from_dict(tree.to_dict())
    np.testing.assert_array_equal(again.tables, tree.tables)
    assert again.to_dict() == tree.to_dict()
    with pytest.raises(MechanismError, match="format"):
        marginal_tree.TreeMeasurements.from_dict({"format": "x"})
    X = np.random.default_rng(10).uniform(-1, 1, size=(100, 3))
    with pytest.raises(MechanismError, match="delta > 0"):
        marginal_tree.measure(X, 1.0, 0.0)
    with pytest.raises(MechanismError, match="two columns"):
        marginal_tree.measure(X[:, :1], 1.0, 1e-6)
    with pytest.raises(MechanismError, match="pair_bins"):
        marginal_tree.measure(X, 1.0, 1e-6, pair_bins=1)


@pytest.mark.parametrize("grouping", marginal_tree.GROUPINGS)
def test_combined_coarse_marginals_have_less_error_than_step_one_alone(grouping: str) -> None:
    """Over 40 releases (n = 500, d = 4, epsilon = 1), the least-squares coarse margins
    (step 1's group sums and the tables' sums) are closer to the exact coarse margins
    than step 1's projected marginal summed by group: the tables carry independent
    measurements of the same margins (variance ratio ~0.6 here; asserted < 0.85)."""
    rng = np.random.default_rng(12)
    X = np.clip(rng.normal(0.1, 0.4, size=(500, 4)), -1, 1)
    errors = {"combined": 0.0, "one_way": 0.0}
    for _ in range(40):
        tree = marginal_tree.measure(X, 1.0, 1e-6, pair_bins=3, grouping=grouping)
        g = tree.group
        exact = marginals.exact_histograms(as_source(X), tree.one_way.bins, tree.one_way.atoms)
        truth = marginal_tree.group_sums(exact, g, 3)
        alone = marginal_tree.group_sums(tree.one_way.marginals(), g, 3)
        errors["combined"] += float(np.sum((tree.coarse_marginals() - truth) ** 2))
        errors["one_way"] += float(np.sum((alone - truth) ** 2))
        np.testing.assert_allclose(tree.coarse_model.P, tree.coarse_marginals())
        np.testing.assert_allclose(tree.model.p.sum(axis=1), 1.0)
        np.testing.assert_allclose(  # the fine law keeps the coarse margins
            marginal_tree.group_sums(tree.model.p, g, 3), tree.coarse_marginals(), atol=1e-12
        )
    assert errors["combined"] < 0.85 * errors["one_way"]


def test_quantile_groups_split_the_mass_into_b_runs_of_consecutive_cells() -> None:
    """Each column gets exactly ``b`` nonempty runs of consecutive cells; where the mass
    allows it, every group holds at least ``1 / b`` minus one cell's mass (brute force
    over random marginals, some with all their mass in one cell)."""
    rng = np.random.default_rng(13)
    for trial in range(200):
        cells, b = int(rng.integers(3, 12)), int(rng.integers(2, 5))
        b = min(b, cells)
        p = rng.dirichlet(np.full(cells, 0.3 if trial % 3 else 5.0), size=3)
        if trial % 7 == 0:
            p[0] = 0.0
            p[0, rng.integers(cells)] = 1.0
        g = marginal_tree.quantile_groups(p, b)
        for i in range(3):
            assert g[i, 0] == 0
            assert g[i, -1] == b - 1
            assert set(np.diff(g[i])) <= {0, 1}  # consecutive runs, in order
            assert len(set(g[i])) == b
            if trial % 7 and p[i].max() < 1.0 / b:  # no cell alone exceeds a share
                masses = marginal_tree.group_sums(p[i : i + 1], g[i : i + 1], b)[0]
                assert masses[:-1].min() >= 1.0 / b - p[i].max() - 1e-9
    with pytest.raises(MechanismError, match="groups"):
        marginal_tree.quantile_groups(np.full((1, 2), 0.5), 3)


def test_grouping_is_recorded_and_version_one_records_load_as_equal_groups() -> None:
    tree = _small_tree(14, "quantile")
    assert tree.parameters["pair_grouping"] == "quantile"
    again = marginal_tree.TreeMeasurements.from_dict(tree.to_dict())
    np.testing.assert_array_equal(again.group, tree.group)
    legacy = {**_small_tree(14, "equal").to_dict(), "format": marginal_tree.FORMATS[0]}
    del legacy["grouping"]
    old = marginal_tree.TreeMeasurements.from_dict(legacy)
    assert old.grouping == "equal"
    np.testing.assert_array_equal(old.group[1], marginal_tree.groups(old.one_way.cells, 3))
    X = np.random.default_rng(15).uniform(-1, 1, size=(100, 3))
    with pytest.raises(MechanismError, match="grouping"):
        marginal_tree.measure(X, 1.0, 1e-6, grouping="median")


def test_blend_groups_sit_between_equal_width_and_equal_mass() -> None:
    """On a column with 90 % of its mass in the first two cells, equal mass and the blend
    (quantiles of ``(p + u) / 2``) give each of those cells its own group where equal
    width merges them; in the tail, equal mass merges cells 3-7 into one group where the
    blend keeps two groups of three; on a uniform marginal all three groupings agree."""
    cells, b = 8, 4
    skewed = np.array([[0.45, 0.45, 0.02, 0.02, 0.02, 0.02, 0.01, 0.01]])
    bulk = {
        grouping: len(set(marginal_tree.column_groups(skewed, b, grouping)[0, :2]))
        for grouping in marginal_tree.GROUPINGS
    }
    assert bulk == {"quantile": 2, "blend": 2, "equal": 1}
    np.testing.assert_array_equal(
        marginal_tree.blend_groups(skewed, b)[0], [0, 1, 2, 2, 2, 3, 3, 3]
    )
    np.testing.assert_array_equal(
        marginal_tree.quantile_groups(skewed, b)[0], [0, 1, 2, 3, 3, 3, 3, 3]
    )
    uniform = np.full((2, cells), 1.0 / cells)
    for grouping in marginal_tree.GROUPINGS:
        np.testing.assert_array_equal(
            marginal_tree.column_groups(uniform, b, grouping)[0], marginal_tree.groups(cells, b)
        )


def test_default_grouping_compares_the_noise_with_an_average_cell() -> None:
    """``quantile`` exactly when ``s_2 > 1 / b^2``; else ``blend`` exactly when
    ``s_1 cells < 1/2``, else ``equal``: at epsilon = 1, delta = 1e-9 the WDBC size
    (569 x 30, s_2 ~ 0.11) gets quantile groups, the PKS size (5875 x 21, s_1 cells ~
    0.28) blend groups and the CRM size (1994 x 100, ~ 0.81) equal ones; an explicit
    grouping always wins."""
    assert marginal_tree.default_grouping(1 / 16 + 1e-9, 4, 0.0, 8) == "quantile"
    assert marginal_tree.default_grouping(1 / 16, 4, 0.5 / 8 - 1e-9, 8) == "blend"
    assert marginal_tree.default_grouping(1 / 16, 4, 0.5 / 8, 8) == "equal"
    small = marginal_tree.plan(569, 30, 1.0, 1e-9)
    large = marginal_tree.plan(5875, 21, 1.0, 1e-9)
    wide = marginal_tree.plan(1994, 100, 1.0, 1e-9)
    assert small.pair_scale > 1 / 16
    assert small.grouping == "quantile"
    assert large.pair_scale < 1 / 16
    assert large.one_way_scale * large.cells < 0.5
    assert large.grouping == "blend"
    assert wide.pair_scale < 1 / 16
    assert wide.one_way_scale * wide.cells > 0.5
    assert wide.grouping == "equal"
    assert marginal_tree.plan(569, 30, 1.0, 1e-9, grouping="equal").grouping == "equal"
    assert marginal_tree.plan(569, 30, 1.0, 1e-9, grouping="blend").grouping == "blend"
    assert small.as_dict()["pair_grouping"] == "quantile"
    assert large.as_dict()["pair_grouping"] == "blend"


def test_denoise_projects_the_cells_above_the_threshold_brute_force() -> None:
    """Cells below ``threshold * scale`` are 0 and the others are the simplex projection
    of those cells alone; ``None``, or nothing above the threshold, is the plain
    projection (random tables, some all below the threshold)."""
    rng = np.random.default_rng(17)
    for trial in range(100):
        scale = float(rng.uniform(0.01, 0.2))
        noisy = rng.normal(0.05 if trial % 5 else -0.5, scale, size=(3, 3))
        for threshold in (None, 1.5, 3.0):
            out = marginals.denoise(noisy, scale, threshold)
            assert out.shape == noisy.shape
            np.testing.assert_allclose(out.sum(), 1.0)
            keep = noisy >= (threshold or 0.0) * scale
            if threshold is None or not keep.any():
                expected = marginals.project_to_simplex(noisy.ravel()).reshape(3, 3)
            else:
                expected = np.zeros_like(noisy)
                expected[keep] = marginals.project_to_simplex(noisy[keep])
            np.testing.assert_allclose(out, expected, atol=1e-12)


def test_thresholds_are_recorded_and_version_two_records_answer_as_before() -> None:
    """A version-3 record keeps its thresholds; a version-2 record (no thresholds) loads
    with :data:`LEGACY_THRESHOLDS`, so its law is step 1 denoised at 1 standard deviation
    and each table projected whole, as version 2 released it."""
    tree = _small_tree(18, "equal")
    assert (tree.one_way_threshold, tree.table_threshold) == (
        marginal_tree.ONE_WAY_THRESHOLD,
        marginal_tree.TABLE_THRESHOLD,
    )
    again = marginal_tree.TreeMeasurements.from_dict(tree.to_dict())
    assert again.to_dict() == tree.to_dict()
    legacy = marginal_tree.TreeMeasurements.from_dict(
        {
            k: v
            for k, v in {**tree.to_dict(), "format": marginal_tree.FORMATS[1]}.items()
            if not k.endswith("threshold")
        }
    )
    assert (legacy.one_way_threshold, legacy.table_threshold) == (marginals.THRESHOLD, None)
    P = legacy.coarse_marginals()
    for (i, j), noisy, joint in zip(legacy.edges, legacy.tables, legacy.model.joint, strict=True):
        plain = marginals.project_to_simplex(noisy.ravel()).reshape(noisy.shape)
        np.testing.assert_allclose(joint, marginal_tree.rake(plain, P[i], P[j]))
    step_one = legacy.one_way.marginals(marginals.THRESHOLD)
    sums = marginal_tree.group_sums(step_one, legacy.group, legacy.pair_bins)
    inside = np.take_along_axis(sums, legacy.group, axis=1) > 0
    np.testing.assert_allclose(  # the law's p is step 1's, rescaled within each group
        (legacy.model.p / np.take_along_axis(legacy.model.P, legacy.group, axis=1))[inside],
        (step_one / np.take_along_axis(sums, legacy.group, axis=1))[inside],
    )


def test_thresholds_cut_the_mass_the_law_puts_where_the_data_has_none() -> None:
    """On sparse data (4 columns, each on 2-4 values, n = 2000, epsilon = 1), the mass the
    tree law gives to fine cells and pair-table cells that the exact data leaves empty,
    summed over 20 releases, with the version-3 thresholds against the same releases
    read as version 2 (paired): 0.68x (one-way, sd 0.054 over 20 releases) and 0.25x
    (tables, sd 0.053) over 120 simulated releases; asserted < 0.95x (5 sd, normal tail
    3e-7; none of 2e5 bootstrap resamples of 20 reached it) and < 0.6x (6.7 sd). The
    noise is OpenDP's, unseeded: the 0.85x this had was 3.1 sd, failed by 4.7e-4 of the
    bootstrap resamples. Unthresholded one-way cells read exactly 1x. (Dropping small real
    cells costs some L1 distance to the exact tables; the smooth-query gain is measured in
    ``bench/results/smooth_marginals.md``.)"""
    rng = np.random.default_rng(16)
    n = 2000
    z = rng.choice([-1.0, -0.5, 0.3, 0.9], size=n, p=[0.5, 0.3, 0.15, 0.05])
    X = np.column_stack(
        [
            z,
            np.clip(z + rng.normal(0, 0.05, n), -1, 1),
            rng.choice([-0.8, 0.6], size=n, p=[0.8, 0.2]),
            np.clip(-z + rng.normal(0, 0.05, n), -1, 1),
        ]
    )
    source = as_source(X)
    spurious = {"v3": np.zeros(2), "v2": np.zeros(2)}
    for _ in range(20):
        tree = marginal_tree.measure(X, 1.0, 1e-9)
        record = {**tree.to_dict(), "format": marginal_tree.FORMATS[1]}
        legacy = marginal_tree.TreeMeasurements.from_dict(record)
        exact_p = marginals.exact_histograms(source, tree.one_way.bins, tree.one_way.atoms)
        codes = marginal_tree.coarse_codes(
            source, tree.one_way.bins, tree.one_way.atoms, tree.group
        )
        for key, release in (("v3", tree), ("v2", legacy)):
            model = release.coarse_model  # the tables' own law (version 4 refines it)
            spurious[key][0] += model.p[exact_p == 0].sum()
            spurious[key][1] += sum(
                joint[marginal_tree.pair_table(codes, i, j, tree.pair_bins) == 0].sum()
                for joint, (i, j) in zip(model.joint, tree.edges, strict=True)
            )
    ratio = spurious["v3"] / spurious["v2"]
    assert ratio[0] < 0.95
    assert ratio[1] < 0.6


def test_copula_table_at_zero_correlation_is_the_product_of_the_margins() -> None:
    rng = np.random.default_rng(30)
    p_i, p_j = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(5))
    (table,) = marginal_tree.copula_tables(p_i, p_j, [0.0])
    np.testing.assert_allclose(table, np.outer(p_i, p_j), atol=1e-15)


@pytest.mark.parametrize("r", [-0.5, 0.3, 0.8])
def test_copula_table_has_the_normal_scores_correlation_it_was_built_with(r: float) -> None:
    """On 40 cells of equal mass, the raked copula table is a discretised bivariate normal
    copula: the correlation of the cells' normal scores under it is ``r`` up to the
    discretisation (brute force over the 1600 cells: within 0.01 here; tolerance 0.02)."""
    p = np.full(40, 1 / 40)
    table = marginal_tree.rake_fine(marginal_tree.copula_tables(p, p, [r]), p, p, 200)[0]
    np.testing.assert_allclose(table.sum(axis=1), p, atol=1e-9)
    np.testing.assert_allclose(table.sum(axis=0), p, atol=1e-9)
    z = marginal_tree.normal_scores(p)
    mean = p @ z
    var = p @ (z - mean) ** 2
    corr = np.sum(table * np.outer(z - mean, z - mean)) / var
    assert corr == pytest.approx(r, abs=0.02)


def test_rake_fine_meets_the_fine_margins_and_the_coarse_table_and_keeps_zeros() -> None:
    rng = np.random.default_rng(31)
    group_i, group_j = np.array([0, 0, 1, 1, 1, 2]), np.array([0, 1, 1, 2, 2])
    truth = rng.dirichlet(np.ones(30)).reshape(6, 5)
    truth[0, 4] = 0.0
    truth /= truth.sum()
    rows, cols = truth.sum(axis=1), truth.sum(axis=0)
    blocks = np.eye(3)[group_i].T @ truth @ np.eye(3)[group_j]
    start = rng.uniform(0.5, 1.5, size=(6, 5))
    start[0, 4] = 0.0
    out = marginal_tree.rake_fine(start, rows, cols, 500, blocks, group_i, group_j)
    np.testing.assert_allclose(out.sum(axis=1), rows, atol=1e-9)
    np.testing.assert_allclose(out.sum(axis=0), cols, atol=1e-9)
    np.testing.assert_allclose(np.eye(3)[group_i].T @ out @ np.eye(3)[group_j], blocks, atol=1e-9)
    assert out[0, 4] == 0.0
    with pytest.raises(MechanismError, match="groups"):
        marginal_tree.rake_fine(start, rows, cols, 1, blocks)


def test_fit_copula_table_recovers_the_correlation_from_the_coarse_table() -> None:
    """A fine copula table with r = 0.7 summed into 4 x 4 groups: the fit picks r within
    the grid's spacing there (0.025) and returns a table with the coarse sums and the fine
    margins."""
    rng = np.random.default_rng(32)
    p_i, p_j = rng.dirichlet(np.full(16, 3.0)), rng.dirichlet(np.full(12, 3.0))
    group_i, group_j = marginal_tree.groups(16, 4), marginal_tree.groups(12, 4)
    exact = marginal_tree.rake_fine(marginal_tree.copula_tables(p_i, p_j, [0.7]), p_i, p_j, 200)
    coarse = np.eye(4)[group_i].T @ exact[0] @ np.eye(4)[group_j]
    r, table = marginal_tree.fit_copula_table(p_i, p_j, group_i, group_j, coarse)
    assert r == pytest.approx(0.7, abs=0.03)
    np.testing.assert_allclose(table.sum(axis=1), p_i, atol=1e-6)
    np.testing.assert_allclose(table.sum(axis=0), p_j, atol=1e-6)
    np.testing.assert_allclose(np.eye(4)[group_i].T @ table @ np.eye(4)[group_j], coarse, atol=1e-6)
    np.testing.assert_allclose(table, exact[0], atol=2e-3)


def test_the_copula_fit_holds_a_block_of_candidates_not_all_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 edges of 66 x 66 fine cells: the fit builds its candidate tables a block of
    correlations at a time, so its peak (numpy's allocations, traced) stays within a few
    blocks plus a few tables per edge; all 161 candidates at once held ~650 tables per edge
    (an audit's ``bins = 4096`` request took a whole machine's memory). The result does not
    depend on the block: one correlation at a time and all at once agree to the bit."""
    import tracemalloc

    rng = np.random.default_rng(34)
    edges, cells, b = 20, 66, 4
    p_i, p_j = rng.dirichlet(np.full(cells, 2.0), edges), rng.dirichlet(np.full(cells, 2.0), edges)
    group = np.tile(marginal_tree.groups(cells, b), (edges, 1))
    exact = marginal_tree.copula_tables(p_i, p_j, [0.6])[:, 0]
    to_groups = np.eye(b)[group[0]]
    coarse = to_groups.T @ exact @ to_groups
    table_bytes = 8 * edges * cells * cells
    monkeypatch.setattr(marginal_tree, "COPULA_CHUNK_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        r_small, t_small = marginal_tree.fit_copula_table(p_i, p_j, group, group, coarse)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * table_bytes, peak / table_bytes
    monkeypatch.setattr(marginal_tree, "COPULA_CHUNK_BYTES", 1 << 40)
    r_all, t_all = marginal_tree.fit_copula_table(p_i, p_j, group, group, coarse)
    np.testing.assert_array_equal(r_small, r_all)
    np.testing.assert_array_equal(t_small, t_all)
    monkeypatch.setattr(marginal_tree, "COPULA_CHUNK_BYTES", 1)
    r_one, t_one = marginal_tree.fit_copula_table(p_i, p_j, group, group, coarse)
    np.testing.assert_array_equal(r_one, r_all)
    np.testing.assert_array_equal(t_one, t_all)


def test_plan_keeps_the_fine_tables_within_their_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared bins whose fine edge tables exceed ``MAX_FINE_TABLE_CELLS`` are refused
    before a row is read (two columns of 4096 bins: 16.8 10^6 entries); default bins are
    lowered to fit (300 columns at n = 10^9 would default to 64 bins, 1.3 10^6 entries)."""
    limit = marginal_tree.MAX_FINE_TABLE_CELLS
    with pytest.raises(MechanismError, match="fine-table entries"):
        marginal_tree.plan(1000, 2, 1.0, 1e-6, bins=4096)
    with pytest.raises(MechanismError, match="fine-table entries"):
        marginal_tree.measure(np.zeros((50, 2)), 1.0, 1e-6, bins=4096)
    # two rows give each histogram 2 bins: the default pair_bins (4) cannot apply, and
    # the refusal says that neither number was the request's
    with pytest.raises(MechanismError) as refused:
        marginal_tree.plan(2, 2, 1.0, 1e-6)
    assert str(refused.value) == (
        "pair_bins (4, the default) cannot exceed the 2 cells of a column's histogram "
        "(bins 2, from n, d, epsilon and delta): set pair_bins to at most 2, or more bins"
    )
    assert marginal_tree.plan(2, 2, 1.0, 1e-6, pair_bins=2).pair_bins == 2
    # and says which of them the request did set
    with pytest.raises(MechanismError) as refused:
        marginal_tree.plan(2, 2, 1.0, 1e-6, bins=2, pair_bins=5)
    assert str(refused.value).startswith(
        "pair_bins (5, declared) cannot exceed the 2 cells of a column's histogram "
        "(bins 2, declared): "
    )
    fits = marginal_tree.plan(1000, 2, 1.0, 1e-6, bins=500, bound_atoms=False)
    assert marginal_tree.fine_table_cells(2, fits.cells) <= limit
    assert marginals.resolve(10**9, 300, 1.0, 1e-6)[0] == marginals.MAX_BINS
    # (10^9 rows of 300 columns are refused for their pair-count work, 4.5 10^13
    # pair-rows; the bins are checked here with that bound lifted)
    with pytest.raises(MechanismError, match="pair-rows"):
        marginal_tree.plan(10**9, 300, 1.0, 1e-6)
    monkeypatch.setattr(marginal_tree, "MAX_PAIR_COUNT_WORK", 10**15)
    wide = marginal_tree.plan(10**9, 300, 1.0, 1e-6)
    assert marginal_tree.fine_table_cells(300, wide.cells) <= limit
    assert marginal_tree.fine_table_cells(300, wide.cells + 1) > limit


def test_joint_model_is_recorded_and_version_three_records_answer_as_blocks() -> None:
    tree = _small_tree(33, "equal")
    assert tree.joint_model == "copula"
    assert tree.parameters["joint_model"] == "copula"
    again = marginal_tree.TreeMeasurements.from_dict(tree.to_dict())
    assert again.to_dict() == tree.to_dict()
    v3 = {k: v for k, v in tree.to_dict().items() if k != "joint_model"}
    legacy = marginal_tree.TreeMeasurements.from_dict(v3 | {"format": marginal_tree.FORMATS[2]})
    assert legacy.joint_model == "blocks"
    assert legacy.model is legacy.coarse_model
    batch = GaussianMixtureBatch.random(6, 3, 3, 0.5, np.random.default_rng(34))
    expansion = gaussian_expansion(batch.centers, batch.weights, batch.sigma)
    blocks = marginal_tree.TreeMeasurements.from_dict(tree.to_dict() | {"joint_model": "blocks"})
    np.testing.assert_allclose(legacy.expectations(expansion), blocks.expectations(expansion))
    assert not np.allclose(tree.expectations(expansion), blocks.expectations(expansion))
    with pytest.raises(MechanismError, match="joint_model"):
        marginal_tree.TreeMeasurements.from_dict(tree.to_dict() | {"joint_model": "vine"})


def test_copula_law_is_less_diffuse_than_blocks_on_dependent_columns() -> None:
    """Two columns that are one variable plus a little noise (n = 5000, epsilon = 1):
    kernels (sigma = 0.1) centred at real rows, the worst-case relative error of the
    copula law against the blocks law on the same 10 releases (paired): about 0.3x here,
    asserted < 0.7x; the blocks law spreads each coarse cell's mass over its whole square,
    the copula keeps it near the diagonal."""
    rng = np.random.default_rng(35)
    n = 5000
    z = np.clip(rng.normal(0.0, 0.45, size=n), -1, 1)
    X = np.column_stack([z, np.clip(z + rng.normal(0, 0.03, n), -1, 1)])
    centres = X[rng.integers(0, n, size=(200, 1))]
    batch = GaussianMixtureBatch(centers=centres, weights=np.ones((200, 1)), sigma=0.1)
    truth = batch.answers(X)
    expansion = gaussian_expansion(batch.centers, batch.weights, batch.sigma)
    worst = {"copula": 0.0, "blocks": 0.0}
    for _ in range(10):
        tree = marginal_tree.measure(X, 1.0, 1e-9)
        blocks = marginal_tree.TreeMeasurements.from_dict(
            tree.to_dict() | {"joint_model": "blocks"}
        )
        for key, release in (("copula", tree), ("blocks", blocks)):
            error = np.abs(release.expectations(expansion) - truth) / truth
            worst[key] += float(error.max())
    assert worst["copula"] < 0.7 * worst["blocks"]


def _two_column_model(r: float) -> marginal_tree.TreeModel:
    """One edge whose fine table is the Gaussian copula of correlation ``r`` on a skewed
    12-cell marginal, raked to it (each cell its own group)."""
    p = np.linspace(1.0, 3.0, 12) ** 2
    p /= p.sum()
    table = marginal_tree.rake_fine(marginal_tree.copula_tables(p, p, [r])[0], p, p, 200)
    cells = np.tile(np.arange(12), (2, 1))
    return marginal_tree.TreeModel(
        p=np.stack([p, p]), P=np.stack([p, p]), group=cells, edges=((0, 1),), joint=(table,)
    )


def test_temper_two_sharpens_a_gaussian_copula_edge_to_a_known_correlation() -> None:
    """``c_r(u, v)`` is ``exp(r u v / (1 - r^2))`` times functions of ``u`` and of ``v``
    alone, which the rake absorbs: tempering at 2 gives the copula table of the ``r'``
    with ``r' / (1 - r'^2) = 2 r / (1 - r^2)`` (to the rake's convergence, 1e-6 here), the
    same marginals and more dependence. ``tau = 1`` is the model itself; a ``tau`` below 1
    or not finite is refused."""
    for r in (0.3, -0.6):
        model = _two_column_model(r)
        tempered = marginal_tree.temper_tree(model, 2.0)
        k = 2 * r / (1 - r**2)
        expected = _two_column_model((math.sqrt(1 + 4 * k**2) - 1) / (2 * k)).joint[0]
        np.testing.assert_allclose(tempered.joint[0], expected, atol=1e-6)
        np.testing.assert_allclose(tempered.joint[0].sum(axis=1), model.p[0], atol=1e-9)
        np.testing.assert_allclose(tempered.joint[0].sum(axis=0), model.p[1], atol=1e-9)
        assert not np.allclose(tempered.joint[0], model.joint[0], atol=1e-3)
    assert marginal_tree.temper_tree(model, 1.0) is model
    for bad in (0.5, math.inf, math.nan):
        with pytest.raises(MechanismError, match="temper"):
            marginal_tree.temper_tree(model, bad)


def test_temper_is_recorded_and_version_four_records_answer_untempered() -> None:
    tree = _small_tree(36, "equal")
    assert tree.temper == marginal_tree.TEMPER == 2.0
    assert tree.parameters["temper"] == 2.0
    assert marginal_tree.TreeMeasurements.from_dict(tree.to_dict()).to_dict() == tree.to_dict()
    v4 = {k: v for k, v in tree.to_dict().items() if k != "temper"}
    legacy = marginal_tree.TreeMeasurements.from_dict(v4 | {"format": marginal_tree.FORMATS[3]})
    assert legacy.temper == 1.0
    untempered = marginal_tree.TreeMeasurements.from_dict(tree.to_dict() | {"temper": 1.0})
    batch = GaussianMixtureBatch.random(6, 3, 3, 0.5, np.random.default_rng(37))
    expansion = gaussian_expansion(batch.centers, batch.weights, batch.sigma)
    np.testing.assert_allclose(legacy.expectations(expansion), untempered.expectations(expansion))
    assert not np.allclose(tree.expectations(expansion), untempered.expectations(expansion))
    # the tempered law keeps the one-column marginals as well as the fitted one does (a
    # coarse cell the threshold emptied can keep the rake from reaching them exactly, and
    # there its TEMPER_RAKE_ITERATIONS passes converge slowly: 3.2e-4 past the fitted
    # table's gap failed CI once with a margin of 1e-6, in fewer than 1 of 200 releases;
    # one pass leaves 8e-4 to 9e-3, no rake 0.6 to 1.3)
    model, fitted = tree.model, untempered.model
    for (i, j), table, before in zip(model.edges, model.joint, fitted.joint, strict=True):
        for axis, p in ((1, model.p[i]), (0, model.p[j])):
            reached = np.abs(before.sum(axis=axis) - p).max()
            assert np.abs(table.sum(axis=axis) - p).max() <= reached + 5e-4
    with pytest.raises(MechanismError, match="temper"):
        marginal_tree.TreeMeasurements.from_dict(tree.to_dict() | {"temper": 0.5})


def _rises_again(values: np.ndarray) -> bool:
    """Whether ``values`` fall and then rise again (not unimodal)."""
    steps = np.sign(np.diff(values).round(12))
    return bool(np.any(np.diff(steps[steps != 0]) > 0))


def test_one_way_shape_is_recorded_and_version_five_records_answer_free() -> None:
    tree = _small_tree(38, "equal")
    assert tree.one_way_shape == "unimodal"
    assert tree.parameters["one_way_shape"] == "unimodal"
    assert marginal_tree.TreeMeasurements.from_dict(tree.to_dict()).to_dict() == tree.to_dict()
    v5 = {k: v for k, v in tree.to_dict().items() if k != "one_way_shape"}
    legacy = marginal_tree.TreeMeasurements.from_dict(v5 | {"format": marginal_tree.FORMATS[4]})
    assert legacy.one_way_shape == "free"
    free = marginal_tree.TreeMeasurements.from_dict(tree.to_dict() | {"one_way_shape": "free"})
    batch = GaussianMixtureBatch.random(6, 3, 3, 0.5, np.random.default_rng(39))
    expansion = gaussian_expansion(batch.centers, batch.weights, batch.sigma)
    np.testing.assert_allclose(legacy.expectations(expansion), free.expectations(expansion))
    with pytest.raises(MechanismError, match="one_way_shape"):
        marginal_tree.TreeMeasurements.from_dict(tree.to_dict() | {"one_way_shape": "smooth"})
    # at a noise that leaves bumps in the denoised bins, the law's bins are unimodal unless
    # the unimodal fit moves them by more than the noise explains (then the column keeps its
    # free bins: a mode the noise cannot hide); its atoms and the one-way grouping (as
    # measured) are untouched. The noise is OpenDP's, unseeded: releases are drawn until one
    # has a bump that the shape removes (298 of 300 simulated releases had one; all 5
    # without: ~1e-11). A kept bump is no failure: 10 of those 300 releases had one, and
    # asserting every column unimodal failed CI about one run in 30.
    rng = np.random.default_rng(42)
    X = np.clip(rng.normal(size=(400, 3)) / 3, -1, 1)
    for _ in range(5):
        noisy = marginal_tree.measure(X, 1.0, 1e-6, bins=12, bound_atoms=True, pair_bins=3)
        free_p = noisy.one_way.marginals(noisy.one_way_threshold)
        scale = noisy.one_way.calibration.stddev
        shaped_p = marginal_tree.shaped_marginals(free_p, scale)
        removed = [
            _rises_again(free_row[1:-1]) and not _rises_again(shaped_row[1:-1])
            for shaped_row, free_row in zip(shaped_p, free_p, strict=True)
        ]
        if any(removed):
            break
    plain_tree = marginal_tree.TreeMeasurements.from_dict(
        noisy.to_dict() | {"one_way_shape": "free"}
    )
    np.testing.assert_array_equal(noisy.group, plain_tree.group)
    np.testing.assert_array_equal(shaped_p[:, [0, -1]], free_p[:, [0, -1]])
    for shaped_row, free_row in zip(shaped_p, free_p, strict=True):
        if _rises_again(shaped_row[1:-1]):  # kept: the fit would move more than the noise
            np.testing.assert_array_equal(shaped_row, free_row)
            fit, distance = marginals.unimodal_projection(free_row[1:-1])
            k = marginal_tree.pooled_degrees(free_row[1:-1], fit)
            limit = chdtri(k, 1.0 - marginal_tree.SHAPE_TEST_LEVEL) * scale**2
            assert k > 0
            assert distance > limit
    assert sum(removed) >= 1  # what the shape changes
    # the law's fine marginal is the shaped one, rescaled inside each group to the coarse
    # marginal of every measurement (module doc, "Post-processing")
    law = noisy.coarse_model.p
    for i in range(3):
        for k in range(noisy.pair_bins):
            inside = noisy.group[i] == k
            if shaped_p[i, inside].sum() > 0:
                np.testing.assert_allclose(
                    law[i, inside] * shaped_p[i, inside].sum(),
                    shaped_p[i, inside] * law[i, inside].sum(),
                    atol=1e-12,
                )
    assert not np.allclose(noisy.expectations(expansion), plain_tree.expectations(expansion))
    # without atoms the bound mass sits in the edge bins, and the law keeps its free shape
    rng = np.random.default_rng(40)
    X = np.clip(rng.normal(size=(2000, 3)) / 3, -1, 1)
    no_atoms = marginal_tree.measure(X, 2.0, 1e-6, bins=6, bound_atoms=False, pair_bins=3)
    assert no_atoms.one_way_shape == "unimodal"
    np.testing.assert_array_equal(
        no_atoms.coarse_model.p,
        marginal_tree.TreeMeasurements.from_dict(
            no_atoms.to_dict() | {"one_way_shape": "free"}
        ).coarse_model.p,
    )


def test_shaped_marginals_denoise_a_unimodal_law_and_keep_two_clear_modes() -> None:
    """On noisy histograms of a unimodal law (discretised normal between two atoms, the
    tree's threshold and projection applied first), the unimodal projection of the bins
    is nearer the truth than the denoised law itself (200 replicates, fixed seed: the
    total L1 error 0.82 of the denoised law's at this noise, 0.94 at a quarter of it); a
    law with two modes far above the noise keeps them."""
    rng = np.random.default_rng(41)
    centres = np.linspace(-1, 1, 21)[:-1] + 0.05
    bins = np.exp(-((centres - 0.2) ** 2) / (2 * 0.3**2))
    truth = np.concatenate([[0.05], 0.9 * bins / bins.sum(), [0.05]])
    scale = 0.02
    free_error = shaped_error = 0.0
    for _ in range(200):
        noisy = truth + rng.normal(0.0, scale, size=truth.size)
        p = marginals.denoise(noisy, scale, marginal_tree.ONE_WAY_THRESHOLD)[None, :]
        shaped = marginal_tree.shaped_marginals(p, scale)
        np.testing.assert_array_equal(shaped[0, [0, -1]], p[0, [0, -1]])
        assert shaped.sum() == pytest.approx(1.0)
        free_error += np.abs(p[0] - truth).sum()
        shaped_error += np.abs(shaped[0] - truth).sum()
    assert shaped_error < 0.87 * free_error
    two_modes = np.concatenate([[0.0], [0.3, 0.15, 0.0, 0.0, 0.15, 0.4], [0.0]])[None, :]
    np.testing.assert_array_equal(marginal_tree.shaped_marginals(two_modes, scale), two_modes)
    # where the noise could hide the valley, the bins are made unimodal
    shallow = marginal_tree.shaped_marginals(two_modes, 0.3)
    assert not np.array_equal(shallow, two_modes)
    assert shallow.sum() == pytest.approx(1.0)
    # a spike of five noise standard deviations two empty cells from the mode is a mode:
    # pooled with them it moves by 16.7 variances on 2 degrees of freedom (a test on all
    # 6 bins' degrees of freedom would let it go, at 22.5); at 4 standard deviations (10.7
    # variances) the noise could have made it, and it is pooled
    spike = np.array([[0.0, 0.5, 0.3, 0.0, 0.0, 0.2, 0.0, 0.0]])
    np.testing.assert_array_equal(marginal_tree.shaped_marginals(spike, 0.04), spike)
    pooled = marginal_tree.shaped_marginals(spike, 0.05)
    np.testing.assert_allclose(pooled[0, 3:6], 0.2 / 3)


def test_pooled_degrees_count_the_cells_each_pooled_run_took() -> None:
    values = np.array([0.5, 0.3, 0.0, 0.0, 0.2, 0.0])
    fit, _ = marginals.unimodal_projection(values)
    assert marginal_tree.pooled_degrees(values, fit) == 2  # one run of 3 cells
    assert marginal_tree.pooled_degrees(values, values) == 0
    fit = np.array([0.2, 0.2, 0.1, 0.1, 0.1, 0.0])  # runs of 2 and 3 moved cells
    assert marginal_tree.pooled_degrees(np.array([0.3, 0.1, 0.0, 0.2, 0.1, 0.0]), fit) == 3
    # equal cells the fit did not move take nothing
    assert marginal_tree.pooled_degrees(np.array([0.0, 0.0, 0.4]), np.array([0.0, 0.0, 0.4])) == 0


def test_edges_are_fitted_at_once_as_one_by_one() -> None:
    """The batched copula fit and rake (leading axes: edges) give each edge the table it
    gets alone."""
    rng = np.random.default_rng(8)
    p = rng.dirichlet(np.full(12, 2.0), size=3)
    group = marginal_tree.quantile_groups(p, 4)
    P = marginal_tree.group_sums(p, group, 4)
    edges = [(0, 1), (1, 2)]
    coarse = np.stack(
        [marginal_tree.rake(rng.uniform(0.1, 1.0, (4, 4)), P[i], P[j]) for i, j in edges]
    )
    i, j = np.array(edges).T
    r, tables = marginal_tree.fit_copula_table(p[i], p[j], group[i], group[j], coarse)
    for e, (a, b) in enumerate(edges):
        r_e, table = marginal_tree.fit_copula_table(p[a], p[b], group[a], group[b], coarse[e])
        assert r[e] == r_e
        np.testing.assert_allclose(tables[e], table, rtol=1e-12, atol=1e-15)
    tempered = marginal_tree.rake_fine(tables**2, p[i], p[j], 30)
    for e in range(2):
        alone = marginal_tree.rake_fine(tables[e] ** 2, p[i][e], p[j][e], 30)
        np.testing.assert_allclose(tempered[e], alone, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("grouping", marginal_tree.GROUPINGS)
def test_measure_streams_the_pair_tables_it_used_to_read_from_all_the_codes(
    grouping: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """measure counts every pair's coarse table batch by batch (``all_pair_counts``), never
    building the ``(n, d)`` codes of every row (``n d`` bytes: 80 MB at 10^7 rows of 8
    columns, more for their concatenation and each pair's temporaries); its scores and
    tables are, float for float, what ``pair_scores`` and ``pair_table`` give on
    ``coarse_codes``."""
    rng = np.random.default_rng(11)
    n, d, bins, b = 5000, 5, 8, 4
    X = np.clip(rng.normal(0, 0.5, size=(n, d)) + 0.3 * rng.normal(size=(n, 1)), -1, 1)
    source = as_source(X, batch_rows=777)  # several batches, a short last one
    group = marginal_tree.column_groups(rng.dirichlet(np.ones(bins), size=(d,)), b, grouping)
    P = rng.dirichlet(np.ones(b), size=d)
    rows, counts = marginal_tree.all_pair_counts(source, bins, False, group, b)
    codes = marginal_tree.coarse_codes(source, bins, False, group)
    pairs, scores = marginal_tree.pair_scores(codes, P)
    assert rows == n
    assert pairs == marginal_tree.all_pairs(d)
    for k, (i, j) in enumerate(pairs):
        np.testing.assert_array_equal(counts[k], marginal_tree.pair_counts(codes, i, j, b))
        np.testing.assert_array_equal(counts[k] / rows, marginal_tree.pair_table(codes, i, j, b))
    np.testing.assert_array_equal(marginal_tree.scores_of_counts(rows, counts, P), scores)

    # measure itself: what it hands the noisy max and the pair tables' noise is the codes'
    seen: dict[str, list[np.ndarray]] = {"max": [], "noise": []}

    def noisy_max(scores: object, scale: float) -> int:
        seen["max"].append(np.asarray(scores, dtype=np.float64))
        return int(np.argmax(np.asarray(scores)))

    def sample(calibration: noise.NoiseCalibration, values: object) -> np.ndarray:
        seen["noise"].append(np.asarray(values, dtype=np.float64).copy())
        return np.asarray(values, dtype=np.float64)

    def no_codes(*args: object) -> None:
        raise AssertionError("measure built the (n, d) coarse codes")

    monkeypatch.setattr(noise, "noisy_max", noisy_max)
    monkeypatch.setattr(noise, "sample", sample)
    monkeypatch.setattr(marginal_tree, "coarse_codes", no_codes)
    tree = marginal_tree.measure(source, 1.0, 1e-6, grouping=grouping)
    monkeypatch.undo()
    one_way = tree.one_way
    group = marginal_tree.column_groups(one_way.marginals(), tree.pair_bins, grouping)
    P = marginal_tree.group_sums(one_way.marginals(), group, tree.pair_bins)
    codes = marginal_tree.coarse_codes(source, one_way.bins, one_way.atoms, group)
    pairs, scores = marginal_tree.pair_scores(codes, P)
    np.testing.assert_array_equal(seen["max"][0], scores)  # the first round sees every pair
    exact = [marginal_tree.pair_table(codes, i, j, tree.pair_bins) for i, j in tree.edges]
    np.testing.assert_array_equal(seen["noise"][1], np.stack(exact).ravel())


def _union_find_tree(
    pairs: list[tuple[int, int]], scores: np.ndarray, d: int, pick: object
) -> list[tuple[int, int]]:
    """The selection as first written (a union-find scanned pair by pair each round): the
    reference :func:`marginal_tree.spanning_tree` must match pick for pick."""
    component = list(range(d))

    def find(a: int) -> int:
        while component[a] != a:
            component[a] = component[component[a]]
            a = component[a]
        return a

    edges = []
    for _ in range(d - 1):
        open_pairs = [k for k, (i, j) in enumerate(pairs) if find(i) != find(j)]
        chosen = open_pairs[pick([float(v) for v in scores[open_pairs]])]  # type: ignore[operator]
        i, j = pairs[chosen]
        component[find(i)] = find(j)
        edges.append((i, j))
    return edges


class _RandomPick:
    """A stand-in for the noisy max: a seeded random position, recording what it was
    offered."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.offered: list[list[float]] = []

    def __call__(self, scores: object) -> int:
        self.offered.append([float(x) for x in scores])  # type: ignore[attr-defined]
        return int(self.rng.integers(len(self.offered[-1])))


@pytest.mark.parametrize("d", [2, 3, 7, 12])
def test_spanning_tree_offers_the_same_open_pairs_and_picks_as_a_union_find(d: int) -> None:
    """Every round offers ``pick`` the same scores in the same order as the union-find it
    replaced, so the same picks give the same tree: the argmax (the exact tree) and
    positions drawn at random (a stand-in for the noisy max), on tied scores too."""
    rng = np.random.default_rng(d)
    pairs = marginal_tree.all_pairs(d)
    for scores in (rng.normal(size=len(pairs)), np.round(rng.uniform(size=len(pairs)), 1)):
        assert marginal_tree.spanning_tree(
            pairs, scores, d, lambda v: int(np.argmax(v))
        ) == _union_find_tree(pairs, scores, d, lambda v: int(np.argmax(v)))
        for seed in range(5):
            mine, reference = _RandomPick(seed), _RandomPick(seed)
            tree = marginal_tree.spanning_tree(pairs, scores, d, mine)
            assert tree == _union_find_tree(pairs, scores, d, reference)
            assert mine.offered == reference.offered
            marginal_tree.TreeModel(  # raises unless the edges span the d columns
                p=np.full((d, 2), 0.5),
                P=np.full((d, 2), 0.5),
                group=np.tile(np.arange(2), (d, 1)),
                edges=tuple(tree),
                joint=tuple(np.full((2, 2), 0.25) for _ in tree),
            )


def test_every_noise_record_is_made_before_a_row_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan fixes the scales and both Gaussian steps' records (OpenDP's map at delta)
    are made from public values before the rows are read: a record that failed would fail
    with nothing read and nothing spent."""
    events: list[object] = []
    log_calls(monkeypatch, noise, "gaussian_at_scale", events, lambda *a: ("record", a[1]))
    log_calls(monkeypatch, marginals, "exact_histograms", events, lambda *a: "read")
    X = np.random.default_rng(5).uniform(-1, 1, size=(400, 4))
    released = marginal_tree.measure(X, 1.0, 1e-6)
    b = released.pair_bins
    assert events == [("record", 4 * released.one_way.cells), ("record", 3 * b * b), "read"]


@pytest.mark.parametrize("joint_model", ["copula", "blocks"])
def test_stored_laws_are_taken_only_in_the_layout_of_the_release(joint_model: str) -> None:
    """restore_model takes the release's own model_arrays (the copula law over the fine
    cells, each its own group; the blocks law over pair_bins groups, the release's own)
    and nothing else: two laws, an infinite value, groups out of place or out of range;
    restore_noise_replicates takes two laws or more in the same layout."""
    record = _small_tree(5).to_dict() | {"joint_model": joint_model}
    fitted = marginal_tree.TreeMeasurements.from_dict(record)
    arrays = fitted.model_arrays()
    b, cells = fitted.pair_bins, fitted.one_way.cells
    assert arrays["P"].shape[2] == (cells if joint_model == "copula" else b)

    def taken(stored: dict[str, np.ndarray], replicates: bool = False) -> bool:
        fresh = marginal_tree.TreeMeasurements.from_dict(record)
        name = "noise_replicates" if replicates else "model"
        restore = fresh.restore_noise_replicates if replicates else fresh.restore_model
        done = restore(stored)
        assert done == (name in fresh.__dict__)
        return done

    assert taken(arrays)
    two = {k: np.concatenate([v, v]) for k, v in arrays.items()}
    assert not taken(two)
    assert taken(two, replicates=True)
    assert not taken(arrays, replicates=True)  # one law is no bootstrap
    infinite = {**arrays, "P": arrays["P"].copy()}
    infinite["P"][0, 0, 0] = np.inf
    assert not taken(infinite)
    group = arrays["group"]
    moved = np.where(group == group[0, 0, 0], group[0, 0, -1], group)  # still in range
    assert not np.array_equal(moved, group)
    assert moved.max() < arrays["P"].shape[2]
    assert not taken({**arrays, "group": moved})
    wide = group.copy()
    wide[0, 0, 0] = arrays["P"].shape[2]  # no such group
    assert not taken({**two, "group": np.concatenate([wide, wide])}, replicates=True)
    assert not taken({**two, "group": two["group"][:, :1]}, replicates=True)  # one column's


def _brute_pair_counts(codes: np.ndarray, b: int) -> np.ndarray:
    """The count of every pair as all_pair_counts made it before its one-hot products: one
    bincount per pair."""
    d = codes.shape[1]
    return np.stack(
        [
            np.bincount(codes[:, i].astype(np.int64) * b + codes[:, j], minlength=b * b).reshape(
                b, b
            )
            for i, j in marginal_tree.all_pairs(d)
        ]
    ).reshape(-1, b, b)


@pytest.mark.parametrize(
    ("d", "b", "batch_rows", "max_rows", "chunk_bytes"),
    [
        (2, 2, 65_536, 8192, 16 << 20),
        (3, 4, 1, 8192, 16 << 20),  # one row a batch
        (7, 3, 50, 16, 16 << 20),  # chunks of 16 rows inside batches of 50
        (11, 5, 777, 8192, 4 * 11 * 5 * 5),  # 5 rows a chunk, bands of one column
        (23, 4, 333, 100, 4 * 23 * 4 * 12),  # bands of 3 columns, a short last one
        (6, 16, 400, 8192, 16 << 20),  # the largest pair_bins
        # one band of d - 1 columns: every table, but not the last column's own rows (the
        # whole product's shortcut took it for the whole and could not reshape: review)
        (7, 3, 100, 8192, 4 * 7 * 3 * 3 * 6),
    ],
)
def test_all_pair_counts_one_hot_products_equal_the_per_pair_bincounts(
    d: int,
    b: int,
    batch_rows: int,
    max_rows: int,
    chunk_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one-hot Gram products of all_pair_counts count exactly what one bincount per
    pair counted, integer for integer, across batch, chunk and band boundaries, with
    groups of uneven sizes and some groups never used."""
    monkeypatch.setattr(marginal_tree, "PAIR_COUNT_MAX_ROWS", max_rows)
    monkeypatch.setattr(marginal_tree, "PAIR_COUNT_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(d * 100 + b)
    n, bins = 1237, 9
    X = np.clip(rng.normal(0, 0.5, size=(n, d)) + 0.4 * rng.normal(size=(n, 1)), -1, 1)
    X[rng.random(size=X.shape) < 0.05] = 1.0  # the bounds' atoms
    X[rng.random(size=X.shape) < 0.05] = -1.0
    source = as_source(X, batch_rows=batch_rows)
    group = rng.integers(0, b, size=(d, bins + 2))
    group[0] = 0  # a column all in one group
    rows, counts = marginal_tree.all_pair_counts(source, bins, True, group, b)
    codes = marginal_tree.coarse_codes(source, bins, True, group)
    expected = _brute_pair_counts(codes, b)
    assert rows == n
    assert counts.dtype == np.int64
    assert counts.shape == (d * (d - 1) // 2, b, b)
    np.testing.assert_array_equal(counts, expected)
    assert (counts.sum(axis=(1, 2)) == n).all()


def test_all_pair_counts_refuses_groups_outside_the_tables() -> None:
    X = np.zeros((10, 3))
    group = np.full((3, 6), 4)
    with pytest.raises(MechanismError, match="pair_bins"):
        marginal_tree.all_pair_counts(as_source(X), 4, True, group, 4)


def test_plan_bounds_the_pair_count_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan refuses, from public n, d and pair_bins, a tree whose pair counts would take
    more than MAX_PAIR_COUNT_WORK (about 10 minutes here), before anything is read."""
    assert marginal_tree.pair_count_work(1000, 3, 4) == 3000
    assert marginal_tree.pair_count_work(1000, 3, 2) == 3000  # overheads as at 4 x 4
    assert marginal_tree.pair_count_work(1000, 3, 16) == 3000 * 16
    # the service's bound: n = 10^5 rows of 191 columns (the audit's case) pass, and the
    # largest tree of MAX_TREE_COLUMNS still takes some 10^5 rows
    limit = marginal_tree.MAX_PAIR_COUNT_WORK
    assert marginal_tree.pair_count_work(10**5, 191, 4) <= limit
    assert marginal_tree.pair_count_work(10**5, marginal_tree.MAX_TREE_COLUMNS, 4) <= limit
    assert marginal_tree.pair_count_work(10**7, marginal_tree.MAX_TREE_COLUMNS, 4) > limit
    marginal_tree.plan(5000, 4, 1.0, 1e-6)
    monkeypatch.setattr(marginal_tree, "MAX_PAIR_COUNT_WORK", 5000 * 6 - 1)
    with pytest.raises(MechanismError, match=r"5000 rows and 4 columns \(3e\+04 pair-rows"):
        marginal_tree.plan(5000, 4, 1.0, 1e-6)
    with pytest.raises(MechanismError, match="method 'marginals'"):
        marginal_tree.measure(np.zeros((5000, 4)), 1.0, 1e-6)


def test_noise_replicates_report_progress_after_each_refit_and_stay_the_same() -> None:
    """A tree synthesis spends most of its time in the bootstrap refits: with a progress
    callback, noise_replicate_arrays reports the fraction done after each refit, in
    increasing steps up to 1, and the replicates are the ones computed without it (the
    same seed and draws)."""
    tree = _small_tree(5)  # its noise is OpenDP's: copies of one record, not two trees
    seen: list[float] = []
    fresh = marginal_tree.TreeMeasurements.from_dict(tree.to_dict())
    with_progress = fresh.noise_replicate_arrays(progress=seen.append)
    assert len(seen) == bootstrap.REPLICATES
    assert all(a < b for a, b in itertools.pairwise(seen))
    assert seen[0] > 0
    assert seen[-1] == 1.0
    without = marginal_tree.TreeMeasurements.from_dict(tree.to_dict()).noise_replicate_arrays()
    assert with_progress.keys() == without.keys()
    for key in without:
        np.testing.assert_array_equal(with_progress[key], without[key])
    # cached: asking again refits nothing and reports nothing
    seen.clear()
    fresh.noise_replicate_arrays(progress=seen.append)
    assert seen == []


class _LoggedSource:
    """An array source that logs each batch it yields (``("read", rows)``) in ``events``."""

    def __init__(self, X: np.ndarray, batch_rows: int, events: list[tuple[str, float]]) -> None:
        self.inner = as_source(X, batch_rows=batch_rows)
        self.events = events

    @property
    def n_rows(self) -> int:
        return self.inner.n_rows

    @property
    def n_cols(self) -> int:
        return self.inner.n_cols

    def batches(self) -> Any:
        for batch in self.inner.batches():
            self.events.append(("read", batch.shape[0]))
            yield batch


def test_measure_reports_progress_after_its_first_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measure stage's progress stood still after the first read: the pair counts (a
    second read) and the d - 1 selection rounds reported nothing, so a wide table showed
    the same value for its longest part, and a cancel was noticed only after it.
    ``progress`` is now called after each chunk of the pair counts (up to
    PROGRESS_COUNTED), after each selection round (up to PROGRESS_SELECTED) and at the
    end (1.0), never during the first read (the stage counts its rows), in strictly
    increasing steps."""
    monkeypatch.setattr(marginal_tree, "PAIR_COUNT_MAX_ROWS", 500)  # 2 chunks a batch
    d = 6
    X = np.clip(np.random.default_rng(5).normal(0.0, 0.4, size=(3000, d)), -1, 1)
    events: list[tuple[str, float]] = []
    marginal_tree.measure(
        _LoggedSource(X, 1000, events),
        2.0,
        1e-6,
        progress=lambda done: events.append(("progress", done)),
    )
    kinds = [kind for kind, _ in events]
    values = [value for kind, value in events if kind == "progress"]
    assert kinds[:3] == ["read"] * 3  # the first read (the histograms): no progress
    assert kinds.count("read") == 6
    assert all(a < b for a, b in itertools.pairwise(values)), values
    assert values[0] > 0.0
    assert values[-1] == 1.0
    # the pair counts: one call per chunk, the rows counted over n
    counted = values[:6]
    assert counted == pytest.approx([marginal_tree.PROGRESS_COUNTED * k / 6 for k in range(1, 7)])
    # after the last read: its two chunks, the d - 1 selection rounds and step 3
    last_read = len(kinds) - 1 - kinds[::-1].index("read")
    after = [value for kind, value in events[last_read + 1 :] if kind == "progress"]
    assert len(after) == 2 + (d - 1) + 1
    rounds = after[2:-1]
    span = marginal_tree.PROGRESS_SELECTED - marginal_tree.PROGRESS_COUNTED
    assert rounds == pytest.approx(
        [marginal_tree.PROGRESS_COUNTED + span * k / (d - 1) for k in range(1, d)]
    )


def test_progress_draws_no_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress calls take nothing from the noise: with the noise drawn from one seeded
    generator (a stand-in for OpenDP's, which takes no seed), a measurement with a
    progress callback and one without are the same, draw for draw."""

    def seeded_noise() -> None:
        rng = np.random.default_rng(17)

        def noisy_max(scores: Any, scale: float) -> int:
            values = np.asarray(scores, dtype=np.float64)
            return int(np.argmax(values + rng.gumbel(scale=scale, size=values.size)))

        def sample(calibration: noise.NoiseCalibration, values: Any) -> np.ndarray:
            vector = np.asarray(values, dtype=np.float64).ravel()
            return vector + rng.normal(scale=calibration.scale, size=vector.size)

        monkeypatch.setattr(noise, "noisy_max", noisy_max)
        monkeypatch.setattr(noise, "sample", sample)

    X = np.clip(np.random.default_rng(6).normal(0.0, 0.4, size=(2000, 5)), -1, 1)
    seeded_noise()
    seen: list[float] = []
    with_progress = marginal_tree.measure(X, 1.0, 1e-6, progress=seen.append).to_dict()
    seeded_noise()
    without = marginal_tree.measure(X, 1.0, 1e-6).to_dict()
    assert len(seen) > 5
    np.testing.assert_equal(with_progress, without)
