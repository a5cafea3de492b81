"""bench.noise_floor: its noise scale, centre rows and leave-out answers against brute force."""

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from app.mechanisms import noise
from app.mechanisms.queries import GaussianMixtureBatch
from bench import noise_floor as bench
from bench.smooth_marginals import (
    FAMILY_KEYS,
    _scored_families,
    joint_queries,
    joint_queries_and_rows,
)
from bench.smooth_synthetic import QUERY_SEED


def test_mean_noise_scale_is_the_gaussian_scale_of_the_worst_replaced_row() -> None:
    """The mean vector's replace-one L2 sensitivity is ``2 sqrt(d) / n``: brute force over
    every pair of corners of ``[-1, 1]^d`` as the replaced row (the largest move), and no
    pair of random rows moves it further."""
    n, d = 7, 3
    rest = np.random.default_rng(1).uniform(-1, 1, size=(n - 1, d))
    corners = [np.array(c, dtype=float) for c in itertools.product((-1.0, 1.0), repeat=d)]
    moves = [
        np.linalg.norm(np.vstack([rest, a]).mean(0) - np.vstack([rest, b]).mean(0))
        for a, b in itertools.product(corners, corners)
    ]
    assert max(moves) == pytest.approx(2 * math.sqrt(d) / n, rel=1e-12)
    rng = np.random.default_rng(2)
    for _ in range(200):
        a, b = rng.uniform(-1, 1, size=(2, d))
        assert np.linalg.norm(a - b) / n <= max(moves) + 1e-15
    rho = noise.rho_budget(1.0, 1e-9)
    expected = noise.gaussian_scale_for_rho(max(moves), rho)
    assert bench.mean_noise_scale(n, d, 1.0, 1e-9) == pytest.approx(expected, rel=1e-12)
    assert bench.mean_noise_scale(4 * n, d, 1.0, 1e-9) == pytest.approx(expected / 4, rel=1e-12)


def test_centre_rows_are_the_rows_joint_queries_drew() -> None:
    X = np.random.default_rng(3).uniform(-1, 1, size=(50, 4))
    for sigma in (1, 2):
        _, rows = joint_queries_and_rows(X, 30, float(sigma), QUERY_SEED + sigma)
        rng = np.random.default_rng(QUERY_SEED + sigma)
        rng.integers(0, 50, size=(30, 10))
        jitter = rng.normal(0.0, 0.1, (30, 10, 4))
        batch = joint_queries(X, 30, float(sigma), QUERY_SEED + sigma)
        np.testing.assert_array_equal(batch.centers, X[rows] + jitter)


def test_leave_out_answers_equal_the_answers_of_the_other_rows() -> None:
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, size=(40, 3))
    rows = rng.integers(0, 40, size=(12, 10))
    rows[0, :3] = 7  # a row drawn twice is left out once
    batch = GaussianMixtureBatch(
        centers=X[rows] + rng.normal(0, 0.1, (12, 10, 3)),
        weights=rng.uniform(0, 1, (12, 10)),
        sigma=0.7,
    )
    answers, shares = bench.leave_out_answers(X, batch, rows)
    truth = batch.answers(X)
    for q in range(12):
        keep = np.setdiff1d(np.arange(40), rows[q])
        one = GaussianMixtureBatch(
            centers=batch.centers[q : q + 1], weights=batch.weights[q : q + 1], sigma=0.7
        )
        assert answers[q] == pytest.approx(one.answers(X[keep])[0], rel=1e-12)
        own = np.unique(rows[q])
        share = one.answers(X[own])[0] * own.size / (truth[q] * 40)
        assert shares[q] == pytest.approx(share, rel=1e-12)


def test_leave_out_error_tells_isolated_rows_from_repeated_ones() -> None:
    """Rows far apart at a narrow kernel: each answer is its centre rows' (share ~1, the
    left-out answer ~0, relative error ~1). Each row twice: the other copy answers for it."""
    d, sigma = 3, 0.05
    X = np.random.default_rng(5).uniform(-1, 1, size=(20, d))
    rows = np.random.default_rng(6).integers(0, 20, size=(15, 10))
    batch = GaussianMixtureBatch(centers=X[rows], weights=np.ones((15, 10)), sigma=sigma)
    answers, shares = bench.leave_out_answers(X, batch, rows)
    truth = batch.answers(X)
    assert np.all(shares > 0.99)
    assert np.max(np.abs(answers - truth) / truth) > 0.99
    twice = np.vstack([X, X])
    answers, shares = bench.leave_out_answers(twice, batch, rows)
    truth = batch.answers(twice)
    assert np.all(shares < 0.51)
    assert np.max(np.abs(answers - truth) / truth) < 0.4  # n - |I_q| rows, not n


def _entry(n: int, d: int, base: dict[str, float], peers: dict[str, float]) -> dict:
    grouping = bench.marginal_tree.plan(n, d, bench.EPSILON, bench.DELTA).grouping
    rows = {
        f"{label} (eps = 0.600: replace-one equivalent)": {
            "ratio": {k: value * (i + 1) for i, k in enumerate(FAMILY_KEYS)}
        }
        for label, value in peers.items()
    }
    rows[bench.TREE_ROW.format(grouping)] = {"ratio": dict.fromkeys(FAMILY_KEYS, 0.2)}
    return {"n": n, "d": d, "baseline": dict(base), "rows": rows}


def test_target_is_half_the_better_peer_and_other_queries_are_refused(tmp_path: Path) -> None:
    X = np.random.default_rng(7).uniform(-1, 1, size=(600, 3))
    _, _, base = _scored_families(X, 20)
    entry = _entry(600, 3, base, {"MST": 0.3, "AIM": 0.2})
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"datasets": {"TINY": entry}}))
    found = bench.target_and_tree(bench.committed(path, "TINY", 600, 3, base), 600, 3)
    assert found["target"] == {k: 0.1 * (i + 1) for i, k in enumerate(FAMILY_KEYS)}
    assert found["default tree"] == dict.fromkeys(FAMILY_KEYS, 0.2)
    with pytest.raises(ValueError, match="other queries"):
        bench.committed(path, "TINY", 601, 3, base)
    other = dict(base) | {FAMILY_KEYS[0]: base[FAMILY_KEYS[0]] * 1.01}
    with pytest.raises(ValueError, match="other queries"):
        bench.committed(path, "TINY", 600, 3, other)
    with pytest.raises(ValueError, match="no peer rows"):
        bench.target_and_tree(_entry(600, 3, base, {}), 600, 3)


def test_run_renders_every_row_and_the_noise_moves_the_answers(tmp_path: Path) -> None:
    X = np.random.default_rng(8).uniform(-1, 1, size=(600, 3)) * 0.5
    _, _, base = _scored_families(X, 25)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"datasets": {"TINY": _entry(600, 3, base, {"MST": 0.4})}}))
    result = bench.run({"TINY": X}, 3, 25, {"TINY": path}, log=lambda *args: None)
    result["settings"] = {"rounds": 3, "queries": 25}
    entry = result["datasets"]["TINY"]
    noised = entry["rows"]["exact law, column means noised"]
    assert set(noised["ratio"]) == set(FAMILY_KEYS)
    assert all(v > 0 for v in noised["ratio"].values())  # the shifts move every family
    assert all(v > 0 for v in noised["stderr"].values())
    assert set(entry["rows"]["each query's centre rows left out"]["ratio"]) == set(bench.ROW_KEYS)
    assert set(entry["committed"]) == {"target", "default tree", next(iter(_peer_labels(entry)))}
    json.dumps(result)
    text = bench.render_markdown(result)
    assert "| target | x0.200 |" in text
    assert f"from `{path}`" in text  # outside the repository: shown as given
    for label in ("exact law, column means noised", "each query's centre rows left out"):
        assert f"| {label} |" in text


def _peer_labels(entry: dict) -> list[str]:
    return [k for k in entry["committed"] if k.startswith("MST")]
