"""bench.joint_ceiling: its correlation models checked on cases with known answers."""

import numpy as np
import pytest

from bench import joint_ceiling as bench


def test_tree_correlation_recovers_a_gaussian_markov_chain() -> None:
    """An AR(1) correlation ``r^|i - j|`` is a Gaussian Markov chain: the Chow-Liu tree is
    the chain and the path products give back every entry, signs included."""
    d, r = 6, -0.7
    index = np.arange(d)
    R = r ** np.abs(index[:, None] - index[None, :])
    assert bench.tree_correlation(R) == pytest.approx(R, abs=1e-12)


def test_tree_correlation_drops_what_the_tree_cannot_carry() -> None:
    """Three columns with ``r_01 = 0.9, r_02 = 0.8, r_12 = 0.1``: the tree keeps the two
    strong edges, and the third entry becomes their product 0.72, not 0.1."""
    R = np.array([[1.0, 0.9, 0.8], [0.9, 1.0, 0.1], [0.8, 0.1, 1.0]])
    T = bench.tree_correlation(R)
    assert T[0, 1] == pytest.approx(0.9)
    assert T[0, 2] == pytest.approx(0.8)
    assert T[1, 2] == pytest.approx(0.72)
    assert pytest.approx(T.T) == T


def test_factor_correlation_is_a_correlation_and_full_rank_gives_r_back() -> None:
    rng = np.random.default_rng(3)
    A = rng.normal(size=(200, 5)) @ rng.normal(size=(5, 5))
    R = np.corrcoef(A, rowvar=False)
    assert bench.factor_correlation(R, 5) == pytest.approx(R, abs=1e-10)
    one = bench.factor_correlation(R, 1)
    assert np.diag(one) == pytest.approx(np.ones(5))
    assert np.linalg.eigvalsh(one).min() > -1e-12
    assert not np.allclose(one, R)  # a real restriction: the comparison can fail


def test_copula_sample_keeps_the_exact_marginals_and_the_correlation() -> None:
    """Each column of the sample is drawn from the data's own values (its quantiles
    match within 0.03, 2e5 points), and the normal scores of the sample
    correlate as ``R`` asks (within 0.01)."""
    rng = np.random.default_rng(4)
    X = np.column_stack([rng.exponential(size=500), rng.uniform(-1, 1, 500)])
    R = np.array([[1.0, 0.6], [0.6, 1.0]])
    sample = bench.copula_sample(X, R, 200_000, np.random.default_rng(5))
    assert set(np.unique(sample[:, 0])) <= set(X[:, 0])
    for i in range(2):
        q = [0.1, 0.5, 0.9]
        assert np.quantile(sample[:, i], q) == pytest.approx(np.quantile(X[:, i], q), abs=0.03)
    z = bench.normal_scores(sample)
    assert np.corrcoef(z, rowvar=False)[0, 1] == pytest.approx(0.6, abs=0.01)


def test_bench_runs_and_renders_on_a_tiny_dataset() -> None:
    rng = np.random.default_rng(6)
    base = rng.normal(size=(300, 1))
    X = np.clip(0.3 * (base + 0.5 * rng.normal(size=(300, 3))), -1, 1)
    result = bench.run({"TINY": X}, 2000, 20, log=lambda *args: None)
    result["settings"] = {"points": 2000, "queries": 20}
    rows = result["datasets"]["TINY"]["rows"]
    assert list(rows) == [
        "independent",
        "tree",
        "1 factor",
        "2 factors",
        "3 factors",
        "full",
        "4 clusters",
        "8 clusters",
        "16 clusters",
    ]
    # the columns share a factor: the full copula is far closer than independence
    assert rows["full"]["rows sigma=1"] < rows["independent"]["rows sigma=1"]
    assert "## TINY (n = 300, d = 3" in bench.render_markdown(result)


def test_cluster_sample_carries_dependence_through_the_cluster_alone() -> None:
    """Two far-apart groups of rows, the columns independent inside each: the mixture of
    two products is the data's own law. The sample's values are the data's, its columns
    correlate as the data's do (0.99 here, within 0.01 at 2e5 points), and inside a
    cluster they do not correlate at all (|r| < 0.01); with one cluster (the product of
    the marginals) the correlation is gone, so the check can fail."""
    rng = np.random.default_rng(7)
    centre = np.where(rng.uniform(size=(400, 1)) < 0.3, -0.6, 0.6)
    X = centre + 0.05 * rng.normal(size=(400, 2))
    r_data = np.corrcoef(X, rowvar=False)[0, 1]
    sample = bench.cluster_sample(X, 2, 200_000, np.random.default_rng(8))
    assert set(np.unique(sample[:, 1])) <= set(X[:, 1])
    assert np.corrcoef(sample, rowvar=False)[0, 1] == pytest.approx(r_data, abs=0.01)
    upper = sample[sample[:, 0] > 0]
    assert abs(np.corrcoef(upper, rowvar=False)[0, 1]) < 0.01
    assert (upper[:, 1] > 0).all()  # the second column follows the first's cluster
    assert upper.shape[0] / sample.shape[0] == pytest.approx((X[:, 0] > 0).mean(), abs=0.01)
    product = bench.cluster_sample(X, 1, 200_000, np.random.default_rng(8))
    assert abs(np.corrcoef(product, rowvar=False)[0, 1]) < 0.01
