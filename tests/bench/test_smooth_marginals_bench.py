"""Smoke test of bench.smooth_marginals on a tiny dataset (the real run is not a test)."""

import json

import numpy as np
import pytest

from bench import smooth_marginals as bench


def test_bench_runs_and_renders_without_peers() -> None:
    rng = np.random.default_rng(70)
    X = np.clip(rng.normal(0.2, 0.3, size=(400, 3)), -1, 1)
    result = bench.run({"TINY": X}, 1, 1, 1, 30, None, [], log=lambda *args: None)
    result["settings"] = {"queries": 30, "rounds": 1, "lp_rounds": 1, "peer_rounds": 1}
    rows = result["datasets"]["TINY"]["rows"]
    assert set(rows) == {
        "independent columns (not private)",
        "marginals (eps), answers",
        "marginals (eps), support",
        "marginals (eps, delta), answers",
        "marginals (eps, delta), support",
        "tree of pairs (eps, delta), blend groups",
        "tree of pairs, blend groups, exact tables (not private)",
        "tree of pairs (eps, delta), quantile groups",
        "tree of pairs, quantile groups, exact tables (not private)",
        "tree of pairs (eps, delta), equal groups",
        "tree of pairs, equal groups, exact tables (not private)",
        "moment LP (eps)",
        "moment LP (eps, delta)",
    }
    for row in rows.values():
        assert len(row["ratio"]) == len(bench.SIGMAS) + len(bench.JOINT_SIGMAS)
        assert all(np.isfinite(v) and v >= 0 for v in row["ratio"].values())
    json.dumps(result)
    text = bench.render_markdown(result)
    assert "## TINY (n = 400, d = 3)" in text
    assert "| 0-DP baseline (Rel) |" in text


def test_joint_queries_are_centred_near_real_rows() -> None:
    X = np.random.default_rng(71).uniform(-1, 1, size=(50, 4))
    batch = bench.joint_queries(X, 20, 1.0, 5)
    nearest = np.min(np.linalg.norm(batch.centers[:, :, None, :] - X[None, None], axis=-1), axis=-1)
    assert batch.centers.shape == (20, 10, 4)
    assert np.median(nearest) < 0.5  # jitter N(0, 0.1^2) per coordinate


def test_product_law_answers_match_the_support_sample() -> None:
    """The service's exact answers and the C = 10^5-point support estimate one law: on the
    same release they differ by the support's sampling error only (relative 1e-2 here)."""
    from app.mechanisms import marginals
    from app.mechanisms.queries import GaussianMixtureBatch

    rng = np.random.default_rng(72)
    X = np.clip(rng.normal(0.2, 0.3, size=(400, 3)), -1, 1)
    batches = {"q": GaussianMixtureBatch.random(40, 4, 3, 2.0, np.random.default_rng(73))}
    release = marginals.synthesize(X, 1.0, 1e-9, grid_size=100_000, rng=np.random.default_rng(74))
    exact = batches["q"].answers(release.points, release.weights)
    ones = {"q": 1.0}
    ratio = bench._product_law_ratios(batches, {"q": exact}, ones, release.measurements)
    assert ratio["q"] < 1e-2
    truth = {"q": batches["q"].answers(X)}
    far = bench._product_law_ratios(batches, {"q": truth["q"] * 1.5}, ones, release.measurements)
    assert far["q"] > 0.2  # the comparison can fail


def test_lp_rounds_zero_leaves_the_moment_lp_out() -> None:
    X = np.clip(np.random.default_rng(75).normal(0.1, 0.3, size=(300, 2)), -1, 1)
    result = bench.run({"TINY": X}, 1, 0, 1, 20, None, [], log=lambda *args: None)
    rows = result["datasets"]["TINY"]["rows"]
    assert "tree of pairs (eps, delta), equal groups" in rows
    assert not any(label.startswith("moment LP") for label in rows)


@pytest.mark.parametrize("joint_model", ["copula", "blocks"])
def test_exact_tree_beats_independence_on_dependent_columns(joint_model: str) -> None:
    """Two equal columns: the exact tree keeps them together, the product does not; a
    kernel centred on the diagonal sees the difference (and the test could fail)."""
    rng = np.random.default_rng(76)
    z = rng.uniform(-1, 1, size=4000)
    X = np.column_stack([z, z, rng.uniform(-1, 1, size=4000)])
    from app.mechanisms.chebyshev import gaussian_expansion

    ceiling = bench.ExactTree(X, 16, False, 8, "equal", joint_model)
    assert ceiling.model.edges[0] == (0, 1)
    expansion = gaussian_expansion(np.array([[[0.5, 0.5, 0.0]]]), np.ones((1, 1)), 0.2)
    truth = float(np.mean(np.exp(-np.sum((X - [0.5, 0.5, 0.0]) ** 2, axis=1) / 0.08)))
    tree_value = float(ceiling.expectations(expansion)[0])
    product = float(
        np.prod(
            [np.mean(np.exp(-((X[:, i] - c) ** 2) / 0.08)) for i, c in enumerate([0.5, 0.5, 0.0])]
        )
    )
    assert abs(tree_value - truth) < 0.25 * abs(product - truth)


def test_replace_one_epsilon_gives_the_peers_our_replace_one_cost() -> None:
    """At the returned epsilon, a peer's add/remove rho times its replace-one factor is our
    rho at (1, 1e-9); the factors are 8/3 (MST) and 2.2 (AIM), so both run below 1."""
    from app.mechanisms import noise

    ours = noise.rho_budget(1.0, bench.DELTA)
    for method, factor in (("mst", 8 / 3), ("aim", 2.2)):
        eps = bench.replace_one_epsilon(method)
        assert 0.5 < eps < 1.0
        assert noise.rho_budget(eps, bench.DELTA) * factor == pytest.approx(ours, rel=1e-4)


def test_peer_rows_are_copied_only_from_a_run_with_the_same_queries() -> None:
    """``peers_from`` copies the MST/AIM rows of an earlier result when its n, d and
    baselines equal this run's, and refuses otherwise (other queries, other data)."""
    X = np.clip(np.random.default_rng(77).normal(0.1, 0.3, size=(300, 2)), -1, 1)
    earlier = bench.run({"TINY": X}, 1, 0, 1, 20, None, [], log=lambda *args: None)
    mst = {"ratio": {"rows sigma=1": 0.5}, "seconds": 60.0, "rounds": 5}
    earlier["datasets"]["TINY"]["rows"]["MST (eps, delta; smartnoise)"] = mst
    again = bench.run({"TINY": X}, 1, 0, 1, 20, None, [], log=lambda *a: None, peers_from=earlier)
    rows = again["datasets"]["TINY"]["rows"]
    assert rows["MST (eps, delta; smartnoise)"] == mst
    assert rows["tree of pairs (eps, delta), equal groups"]["rounds"] == 1  # ours re-run
    with pytest.raises(ValueError, match="other queries"):
        bench.run({"TINY": X}, 1, 0, 1, 30, None, [], log=lambda *a: None, peers_from=earlier)
    earlier["datasets"]["TINY"]["n"] = 301
    with pytest.raises(ValueError, match="shape"):
        bench.run({"TINY": X}, 1, 0, 1, 20, None, [], log=lambda *a: None, peers_from=earlier)
    earlier["datasets"]["TINY"]["n"] = 300
    del earlier["datasets"]["TINY"]["rows"]["MST (eps, delta; smartnoise)"]
    with pytest.raises(ValueError, match="no peer rows"):
        bench.run({"TINY": X}, 1, 0, 1, 20, None, [], log=lambda *a: None, peers_from=earlier)


def test_rows_keep_their_rounds_and_the_summary_divides_by_the_better_peer() -> None:
    """Each row keeps its per-round values and their standard error; the summary row is
    the default tree over the peer with the lower mean in each family, with the ratio's
    first-order standard error (checked by hand on made-up peer rows)."""
    X = np.clip(np.random.default_rng(78).normal(0.1, 0.3, size=(300, 2)), -1, 1)
    result = bench.run({"TINY": X}, 3, 0, 1, 20, None, [], log=lambda *args: None)
    entry = result["datasets"]["TINY"]
    assert entry["default_grouping"] in bench.marginal_tree.GROUPINGS
    ours = entry["rows"][bench.tree_label(entry["default_grouping"])]
    for k in bench.FAMILY_KEYS:
        values = ours["per_round"][k]
        assert len(values) == 3
        assert ours["ratio"][k] == pytest.approx(np.mean(values))
        assert ours["stderr"][k] == pytest.approx(np.std(values, ddof=1) / np.sqrt(3))
    assert bench.versus_better_peer(entry) is None  # no peer in this run
    keys = bench.FAMILY_KEYS
    entry["rows"]["MST (eps, delta; smartnoise)"] = {
        "ratio": dict.fromkeys(keys, 0.5),
        "stderr": dict.fromkeys(keys, 0.05),
        "seconds": 1.0,
        "rounds": 5,
    }
    entry["rows"]["AIM (eps, delta; smartnoise)"] = {
        "ratio": {k: (0.4 if k == keys[0] else 0.8) for k in keys},
        "seconds": 1.0,
        "rounds": 1,
    }
    versus = bench.versus_better_peer(entry)
    assert versus is not None
    first, se_first = versus[keys[0]]  # AIM is better here, and has no standard error
    assert first == pytest.approx(ours["ratio"][keys[0]] / 0.4)
    assert se_first is None
    last, se_last = versus[keys[-1]]  # MST is better here
    a, sa = ours["ratio"][keys[-1]], ours["stderr"][keys[-1]]
    assert last == pytest.approx(a / 0.5)
    assert se_last == pytest.approx(a / 0.5 * np.hypot(sa / a, 0.05 / 0.5))
    result["settings"] = {"queries": 20, "rounds": 3, "lp_rounds": 0, "peer_rounds": 5}
    text = bench.render_markdown(result)
    assert f"**default tree ({entry['default_grouping']} groups) / better peer**" in text
    assert " ±" in text


def test_tables_say_how_the_peers_got_their_domains() -> None:
    """Runs before the harness declared the bins (no ``peer_domain`` setting) are marked as
    flattering the peers; new runs say the domain was declared."""
    result = {"settings": {"queries": 1, "rounds": 1, "lp_rounds": 0, "peer_rounds": 1}}
    result["datasets"] = {}
    old = bench.render_markdown(result)
    assert "read off the data" in old
    assert "flattered" in old
    result["settings"]["peer_domain"] = "declared"
    new = bench.render_markdown(result)
    assert "declared to the peers: all 8 bins" in new
    assert "read off the data" not in new


def test_peer_model_sampled_iid_is_kept_out_of_the_shipped_summary() -> None:
    """A peer's model sampled i.i.d. (``--peer-iid``) is not the peer as shipped: the bold
    summary divides by the shipped rows only, and a second line divides by the i.i.d.
    rows; both rows are copied by ``--peers-from`` (their labels start with the peer's)."""
    X = np.clip(np.random.default_rng(79).normal(0.1, 0.3, size=(300, 2)), -1, 1)
    result = bench.run({"TINY": X}, 2, 0, 1, 20, None, [], log=lambda *args: None)
    entry = result["datasets"]["TINY"]
    keys = bench.FAMILY_KEYS
    shipped = "MST (eps, delta; smartnoise)"
    entry["rows"][shipped] = {"ratio": dict.fromkeys(keys, 0.5), "seconds": 1.0, "rounds": 1}
    assert bench.versus_better_peer(entry, "iid") is None  # no i.i.d. row yet
    entry["rows"][bench.iid_label(shipped)] = {
        "ratio": dict.fromkeys(keys, 0.25),  # better than shipped: must not enter the summary
        "seconds": 1.0,
        "rounds": 1,
        "peer_sampling": "iid",
    }
    ours = entry["rows"][bench.tree_label(entry["default_grouping"])]["ratio"]
    versus, versus_iid = bench.versus_better_peer(entry), bench.versus_better_peer(entry, "iid")
    assert versus is not None
    assert versus_iid is not None
    for k in keys:
        assert versus[k][0] == pytest.approx(ours[k] / 0.5)
        assert versus_iid[k][0] == pytest.approx(ours[k] / 0.25)
    result["settings"] = {"queries": 20, "rounds": 2, "lp_rounds": 0, "peer_rounds": 1}
    assert "sampled i.i.d. |" in bench.render_markdown(result)
    assert "comonotone" not in bench.render_markdown(result)
    result["settings"]["peer_iid"] = True
    assert "comonotone" in bench.render_markdown(result)
    copied = bench.copied_peer_rows(result, "TINY", entry)
    assert set(copied) == {shipped, bench.iid_label(shipped)}


def test_mean_relative_error_is_scored_against_the_baselines_mean() -> None:
    """Issue 7 asks for the mean relative error beside the worst case: each family's score
    is the mean over its queries of ``|answer - truth| / truth`` divided by the uniform
    law's mean (checked by hand on made-up answers), every row records it per round, and
    the tables give it with the default tree over the better peer's mean; peer rows of
    earlier runs, which have no mean, are left out of that division."""
    err = np.array([0.1, 0.3, 0.2])
    base = {"q": 0.6, bench.mean_key("q"): 0.4}
    scores = bench._scores("q", err, base)
    assert scores == pytest.approx({"q": 0.3 / 0.6, bench.mean_key("q"): 0.2 / 0.4})
    assert bench._scores("q", err, {"q": 0.6}) == pytest.approx({"q": 0.5})

    X = np.clip(np.random.default_rng(80).normal(0.1, 0.3, size=(300, 2)), -1, 1)
    result = bench.run({"TINY": X}, 2, 0, 1, 20, None, [], log=lambda *args: None)
    entry = result["datasets"]["TINY"]
    keys = bench.FAMILY_KEYS
    assert set(entry["baseline_mean"]) == set(keys)
    for k in keys:  # the uniform law's mean error is below its worst case
        assert 0 < entry["baseline_mean"][k] <= entry["baseline"][k]
    ours = entry["rows"][bench.tree_label(entry["default_grouping"])]
    for k in keys:
        assert len(ours["mean_per_round"][k]) == 2
        assert ours["mean_ratio"][k] == pytest.approx(np.mean(ours["mean_per_round"][k]))
        assert ours["mean_stderr"][k] >= 0
        assert ours["mean_ratio"][k] != pytest.approx(ours["ratio"][k])
    entry["rows"]["MST (eps, delta; smartnoise)"] = {
        "ratio": dict.fromkeys(keys, 0.5),
        "mean_ratio": dict.fromkeys(keys, 0.2),
        "seconds": 1.0,
        "rounds": 1,
    }
    entry["rows"]["AIM (eps, delta; smartnoise)"] = {  # an earlier run's row: no mean
        "ratio": dict.fromkeys(keys, 0.4),
        "seconds": 1.0,
        "rounds": 1,
    }
    worst, mean = bench.versus_better_peer(entry), bench.versus_better_peer(entry, metric="mean")
    assert worst is not None
    assert mean is not None
    for k in keys:
        assert worst[k][0] == pytest.approx(ours["ratio"][k] / 0.4)
        assert mean[k][0] == pytest.approx(ours["mean_ratio"][k] / 0.2)
    result["settings"] = {"queries": 20, "rounds": 2, "lp_rounds": 0, "peer_rounds": 1}
    text = bench.render_markdown(result)
    assert bench.MEAN_NOTE in text
    assert "Mean relative error over the queries" in text
    assert text.count("| 0-DP baseline (Rel) |") == 2
    assert text.count(f"**default tree ({entry['default_grouping']} groups) / better peer**") == 2
