"""Standard errors of the marginals and tree laws by the parametric bootstrap.

The brute force: many releases of the same data whose noise is drawn here (numpy, seeded,
at the mechanism's own public scales, the tree held fixed as the bootstrap holds it), so
the actual standard deviation of an answer across them is what the bootstrap estimates.
Each release's bootstrap standard error is compared with that figure, pooled over the
queries in relative terms (``sqrt(sum_q mean se^2 / t^2 / sum_q var / t^2)``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from app.mechanisms import basis, bootstrap, marginal_tree, marginals, noise
from app.mechanisms import smooth_synthetic as ss
from app.mechanisms.chebyshev import TensorExpansion, gaussian_expansion
from app.mechanisms.data import as_source
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import GaussianMixtureBatch

N = 2000


def _data() -> np.ndarray:
    rng = np.random.default_rng(7)
    z = rng.normal(size=N)
    return np.clip(
        np.column_stack(
            [
                0.3 + 0.3 * z + 0.1 * rng.normal(size=N),
                -0.2 + 0.3 * rng.normal(size=N),
                np.tanh(z + 0.5 * rng.normal(size=N)),
            ]
        ),
        -1.0,
        1.0,
    )


def _queries(X: np.ndarray, sigma: float) -> tuple[TensorExpansion, np.ndarray]:
    centers = np.random.default_rng(3).uniform(-1, 1, size=(40, 1, X.shape[1]))
    truth = np.exp(-((X[None] - centers) ** 2).sum(-1) / (2 * sigma**2)).mean(axis=1)
    return gaussian_expansion(centers, np.ones((40, 1)), sigma), truth


def _pooled_ratio(
    make: Callable[
        [np.random.Generator], marginals.MarginalMeasurements | marginal_tree.TreeMeasurements
    ],
    expansion: TensorExpansion,
    truth: np.ndarray,
    releases: int,
) -> float:
    rng = np.random.default_rng(11)
    values, errors = [], []
    for _ in range(releases):
        release = make(rng)
        values.append(release.expectations(expansion))
        errors.append(release.stderrs(expansion))
    V, S = np.array(values), np.array(errors)
    return float(
        np.sqrt(np.sum((S**2).mean(axis=0) / truth**2) / np.sum(V.var(axis=0, ddof=1) / truth**2))
    )


def _release_noise(
    law: noise.NoiseCalibration, factor: float, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """A brute-force release's noise: the measurement's own law at ``factor`` times its
    scale (numpy, seeded: these releases are simulations, never published)."""
    if law.distribution == "laplace":
        return rng.laplace(0.0, law.scale * factor, shape)
    return rng.normal(0.0, law.scale * factor, shape)


def _marginal_release(
    X: np.ndarray, epsilon: float, delta: float, noise_factor: float = 1.0
) -> Callable[[np.random.Generator], marginals.MarginalMeasurements]:
    B, atoms = marginals.resolve(N, 3, epsilon, delta, None, None)
    law = marginals.noise_calibration(N, 3, epsilon, delta, B + 2 * atoms)
    h = marginals.exact_histograms(as_source(X), B, atoms)

    def make(rng: np.random.Generator) -> marginals.MarginalMeasurements:
        z = _release_noise(law, noise_factor, h.shape, rng)
        return marginals.MarginalMeasurements(N, 3, epsilon, delta, B, atoms, h + z, law)

    return make


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_marginal_stderr_is_the_noise_spread(delta: float) -> None:
    """400 releases at epsilon = 1 (Laplace or Gaussian histograms): pooled se / sd 0.99
    (Laplace), 1.02 (Gaussian) with these seeds; 0.8-1.25 admitted. Simulating the noise at
    the wrong scale fails: Laplace drawn at ``sqrt(2) b`` (its standard deviation taken for
    its scale) reads 1.37, and releases whose noise is half the declared one 1.85-1.88."""
    X = _data()
    expansion, truth = _queries(X, 0.5)
    ratio = _pooled_ratio(_marginal_release(X, 1.0, delta), expansion, truth, 400)
    assert 0.8 <= ratio <= 1.25, ratio
    broken = _pooled_ratio(_marginal_release(X, 1.0, delta, 0.5), expansion, truth, 400)
    assert broken > 1.6, broken


def _tree_release(
    X: np.ndarray, epsilon: float, delta: float
) -> Callable[[np.random.Generator], marginal_tree.TreeMeasurements]:
    """``marginal_tree.measure`` with the tree fixed at the exact scores' choice and the
    noise of steps 1 and 3 drawn here at the plan's scales."""
    fixed = marginal_tree.plan(N, 3, epsilon, delta)
    B, atoms, b = fixed.bins, fixed.atoms, fixed.pair_bins
    source = as_source(X)
    h = marginals.exact_histograms(source, B, atoms)
    sens_1 = marginals.histogram_sensitivity(N, 3)["l2"]
    law_1 = noise.gaussian_at_scale(sens_1, h.size, fixed.one_way_scale, epsilon, delta)
    exact = marginals.MarginalMeasurements(N, 3, epsilon, delta, B, atoms, h, law_1)
    group = marginal_tree.column_groups(exact.marginals(0.0), b, fixed.grouping)
    codes = marginal_tree.coarse_codes(source, B, atoms, group)
    pairs, scores = marginal_tree.pair_scores(codes, marginal_tree.group_sums(h, group, b))
    edges = marginal_tree.spanning_tree(pairs, scores, 3, lambda s: int(np.argmax(s)))

    def make(rng: np.random.Generator) -> marginal_tree.TreeMeasurements:
        one_way = replace(exact, frequencies=h + rng.normal(0.0, fixed.one_way_scale, h.shape))
        group = marginal_tree.column_groups(one_way.marginals(), b, fixed.grouping)
        codes = marginal_tree.coarse_codes(source, B, atoms, group)
        tables = np.stack([marginal_tree.pair_table(codes, i, j, b) for i, j in edges])
        return marginal_tree.TreeMeasurements(
            one_way=one_way,
            pair_bins=b,
            edges=tuple(edges),
            tables=tables + rng.normal(0.0, fixed.pair_scale, tables.shape),
            rho=fixed.rho,
            shares=dict(marginal_tree.SHARES),
            pair_scale=fixed.pair_scale,
            selection_scale=fixed.selection_scale,
            epsilon=epsilon,
            delta=delta,
            grouping=fixed.grouping,
        )

    return make


def test_tree_stderr_is_the_noise_spread() -> None:
    """40 releases at epsilon = 0.5, delta = 1e-6, the tree fixed: pooled se / sd 0.87
    with these seeds (0.91 over 80 releases; the bootstrap's law is the tempered fit, a
    little less variable than the data's), 0.65-1.25 admitted. A bootstrap that forgets
    step 3's noise reads 0.54."""
    X = _data()
    expansion, truth = _queries(X, 0.5)
    make = _tree_release(X, 0.5, 1e-6)
    ratio = _pooled_ratio(make, expansion, truth, 40)
    assert 0.65 <= ratio <= 1.25, ratio


def test_fine_joint_keeps_the_law_s_margins() -> None:
    """The tables a replicate is measured from are the law's own: each edge's fine joint
    table has the law's one-column marginals, under the copula and the blocks law."""
    X = _data()
    release = _tree_release(X, 2.0, 1e-6)(np.random.default_rng(5))
    for law in (release.model, release.coarse_model):
        for e, (i, j) in enumerate(law.edges):
            table = marginal_tree.fine_joint(law, e)
            np.testing.assert_allclose(table.sum(axis=1), law.p[i], atol=1e-9)
            np.testing.assert_allclose(table.sum(axis=0), law.p[j], atol=1e-9)


def test_stderrs_are_a_function_of_the_release() -> None:
    """Seeded by the released values: the same record answers with the same standard
    errors after a round trip, and another release with others."""
    X = _data()
    expansion, _ = _queries(X, 0.5)
    make = _tree_release(X, 1.0, 1e-6)
    rng = np.random.default_rng(9)
    first, second = make(rng), make(rng)
    again = marginal_tree.TreeMeasurements.from_dict(first.to_dict())
    np.testing.assert_array_equal(first.stderrs(expansion), again.stderrs(expansion))
    assert not np.array_equal(first.stderrs(expansion), second.stderrs(expansion))
    assert np.all(first.stderrs(expansion) > 0)
    marginal = _marginal_release(X, 1.0, 0.0)(rng)
    copy = marginals.MarginalMeasurements.from_dict(marginal.to_dict())
    np.testing.assert_array_equal(marginal.stderrs(expansion), copy.stderrs(expansion))


def test_bootstrap_helpers() -> None:
    a = np.arange(6.0)
    assert bootstrap.seed_of(a) == bootstrap.seed_of(a.copy())
    assert bootstrap.seed_of(a) != bootstrap.seed_of(a + 1e-12)
    rng = np.random.default_rng(0)
    laplace = bootstrap.simulated_noise("laplace", 2.0, (200_000,), rng)
    gaussian = bootstrap.simulated_noise("gaussian", 2.0, (200_000,), rng)
    # Laplace(b) has standard deviation sqrt(2) b; 200000 draws: relative error < 1 %
    assert laplace.std() == pytest.approx(2.0 * np.sqrt(2.0), rel=0.01)
    assert gaussian.std() == pytest.approx(2.0, rel=0.01)
    with pytest.raises(MechanismError, match="no simulation"):
        bootstrap.simulated_noise("cauchy", 1.0, (3,), rng)
    with pytest.raises(MechanismError, match="two replicates"):
        bootstrap.standard_errors(np.ones((1, 4)))
    np.testing.assert_allclose(
        bootstrap.standard_errors(np.array([[1.0, 2.0], [3.0, 2.0]])), [np.sqrt(2.0), 0.0]
    )
    # answers of a heavily weighted query: their squares overflow, their spread does not
    np.testing.assert_allclose(
        bootstrap.standard_errors(np.array([[1e300, -1e-300], [3e300, 1e-300]])),
        [np.sqrt(2.0) * 1e300, np.sqrt(2.0) * 1e-300],
    )
    # replicate answers that are all zero have no scale to divide by: 0, not 0 / 0
    np.testing.assert_array_equal(bootstrap.standard_errors(np.zeros((3, 2))), [0.0, 0.0])


def _moment_release(
    X: np.ndarray, epsilon: float, delta: float, noise_factor: float = 1.0
) -> Callable[[np.random.Generator], ss.SyntheticRelease]:
    """:func:`ss.measure`'s record with the moment noise drawn here (numpy, seeded) at its
    calibrated scale times ``noise_factor``, synthesised on ``C = 2000`` candidates."""
    template = ss.measure(X, epsilon, delta, rng=np.random.default_rng(0))
    exact = basis.moments(as_source(X), template.index_set)
    law = template.moment_noise
    assert law is not None

    def make(rng: np.random.Generator) -> ss.SyntheticRelease:
        measured = replace(
            template, moments=exact + _release_noise(law, noise_factor, exact.shape, rng)
        )
        return ss.synthesize_from(measured, rng, grid_size=2000, sample_size=1)

    return make


def _moment_ratio(make: Callable[[np.random.Generator], ss.SyntheticRelease]) -> float:
    """Pooled se / sd over 60 releases and 40 queries of sigma = 2 (the moments fit keeps
    the first few moments, so broad kernels are its queries)."""
    X = _data()
    centers = np.random.default_rng(3).uniform(-1, 1, size=(40, 1, 3))
    batch = GaussianMixtureBatch(centers=centers, weights=np.ones((40, 1)), sigma=2.0)
    truth = batch.answers(X)
    rng = np.random.default_rng(11)
    values, errors = [], []
    for _ in range(60):
        release = make(rng)
        values.append(batch.answers(release.points, release.weights))
        replicates = ss.noise_replicates(release)
        errors.append([replicates.stderr(batch.query(q)) for q in range(len(batch))])
    V, S = np.array(values), np.array(errors)
    return float(
        np.sqrt(np.sum((S**2).mean(axis=0) / truth**2) / np.sum(V.var(axis=0, ddof=1) / truth**2))
    )


def test_moment_stderr_is_the_release_spread() -> None:
    """The moments release (Gaussian moments at epsilon = 0.1, delta = 1e-6, R = 7, vertex
    LP on fresh candidates): pooled se / sd 0.95 over 60 releases with these seeds
    (Laplace at delta = 0: 1.06), 0.8-1.25 admitted. The spread is the noise's and the
    candidates' (at epsilon = 1 it is nearly all the candidates'), and the bootstrap
    redraws both. Releases whose noise is three times the declared one read 0.45."""
    ratio = _moment_ratio(_moment_release(_data(), 0.1, 1e-6))
    assert 0.8 <= ratio <= 1.25, ratio
    broken = _moment_ratio(_moment_release(_data(), 0.1, 1e-6, 3.0))
    assert broken < 0.7, broken


def test_moment_replicates_round_trip_and_checks() -> None:
    """Seeded by the release: the same release gives the same supports; each replicate's
    weights sum to 1 and keep all but REPLICATE_MASS_CUT of the refit's mass; the arrays
    round-trip, and malformed ones are refused."""
    make = _moment_release(_data(), 1.0, 0.0)
    release = make(np.random.default_rng(4))
    assert ss.replicate_work(release) == 2000 * release.measurements.index_set.size
    first, again = ss.noise_replicates(release), ss.noise_replicates(release)
    np.testing.assert_array_equal(first.points, again.points)
    assert first.count == bootstrap.REPLICATES
    back = ss.SupportReplicates.from_arrays(first.to_arrays(), 3)
    np.testing.assert_array_equal(back.weights, first.weights)
    query = GaussianMixtureBatch(
        centers=np.zeros((1, 1, 3)), weights=np.ones((1, 1)), sigma=1.0
    ).query(0)
    assert back.stderr(query) == first.stderr(query) > 0
    other = ss.noise_replicates(make(np.random.default_rng(5)))
    assert other.stderr(query) != first.stderr(query)
    with pytest.raises(MechanismError, match=r"(K, d)"):
        ss.SupportReplicates.from_arrays(first.to_arrays(), 4)
    with pytest.raises(MechanismError, match="lack"):
        ss.SupportReplicates.from_arrays({"points": first.points}, 3)
    bad = dict(first.to_arrays(), weights=first.weights * 2)
    with pytest.raises(MechanismError, match="sum to 1"):
        ss.SupportReplicates.from_arrays(bad, 3)
    with pytest.raises(MechanismError, match="at least 2"):
        ss.noise_replicates(release, replicates=1)


def test_answers_share_the_cell_means_across_the_laws(monkeypatch: pytest.MonkeyPatch) -> None:
    """``answers`` gives :meth:`expectations` and the bootstrap standard errors together,
    equal to each law's answer computed on its own, with the cells' Chebyshev means
    computed once for the 21 laws (not once a law: cosines, up to cells x length)."""
    X = _data()
    expansion, _ = _queries(X, 0.5)
    rng = np.random.default_rng(11)
    marginal = _marginal_release(X, 1.0, 1e-6)(rng)
    tree = _tree_release(X, 1.0, 1e-6)(rng)
    length = int(expansion.factors.shape[3])

    # each law on its own, with the means recomputed each time (the former path)
    own_marginal = [
        marginals.product_expectations(p, marginal.bins, marginal.atoms, expansion)
        for p in (marginal.marginals(), *marginal.noise_replicates)
    ]
    tree_means = marginals.cell_means(tree.one_way.bins, tree.one_way.atoms, length)
    own_tree = [m.expectations(expansion, tree_means) for m in (tree.model, *tree.noise_replicates)]

    calls: list[int] = []
    cell_means = marginals.cell_means

    def counted(*args: object) -> np.ndarray:
        calls.append(1)
        return cell_means(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(marginals, "cell_means", counted)
    for law, own in ((marginal, own_marginal), (tree, own_tree)):
        calls.clear()
        values, errors = law.answers(expansion)
        assert len(calls) == 1
        np.testing.assert_allclose(values, own[0], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(
            errors, bootstrap.standard_errors(np.stack(own[1:])), rtol=1e-9, atol=1e-15
        )
        np.testing.assert_array_equal(values, law.expectations(expansion))
        np.testing.assert_array_equal(errors, law.stderrs(expansion))
