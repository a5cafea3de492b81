"""bench.tree_postprocessing: the settings are read off one release per round (paired)."""

import json
from typing import Any

import numpy as np
import pytest

from app.mechanisms import marginal_tree
from bench import tree_postprocessing as bench
from bench.smooth_marginals import JOINT_SIGMAS
from bench.smooth_synthetic import SIGMAS


def _sparse(n: int = 600, seed: int = 80) -> np.ndarray:
    """Three columns on a few values each: most cells of the histograms and tables are
    empty, so the thresholds change the law."""
    rng = np.random.default_rng(seed)
    z = rng.choice([-0.9, -0.5, 0.6], size=n, p=[0.5, 0.3, 0.2])
    return np.clip(np.column_stack([z, -z, rng.choice([-0.7, 0.8], size=n)]), -1, 1)


def test_parse_settings_reads_pairs_and_refuses_the_rest() -> None:
    text = "1.5:3:copula, 1:none:blocks:1,2:NONE:copula:3:free"
    assert bench.parse_settings(text) == [
        (1.5, 3.0, "copula", marginal_tree.TEMPER, "unimodal"),
        (1.0, None, "blocks", 1.0, "unimodal"),
        (2.0, None, "copula", 3.0, "free"),
    ]
    refusals = {
        "1.5:3": "one_way:table:joint",
        "1.5:3:copula:4:free:1": "one_way:table:joint",
        "1.5:3:copula:4:bimodal": "shape",
        "1.5:3:copula:0.5": "exponent",
        "1.5:3:copula:nan": "exponent",
        "a:3:copula": "could not convert",
        "none:3:copula": "could not convert",
        "-1:3:copula": "finite and >= 0",
        "1:inf:copula": "finite and >= 0",
        "1:3:vine": "joint model",
        "1:3:copula,1:3:copula": "twice",
    }
    for bad, message in refusals.items():
        with pytest.raises(ValueError, match=message):
            bench.parse_settings(bad)
    text = "1.5:3:copula:2:unimodal,1:none:blocks:1:free"
    assert [bench.label(s) for s in bench.parse_settings(text)] == text.split(",")


def test_default_settings_start_with_the_mechanism_default() -> None:
    first = bench.DEFAULT_SETTINGS[0]
    default = marginal_tree.measure(_sparse(), 1.0, 1e-9)
    assert first == (
        default.one_way_threshold,
        default.table_threshold,
        default.joint_model,
        default.temper,
        default.one_way_shape,
    )
    assert (*marginal_tree.LEGACY_THRESHOLDS, "blocks", 1.0, "free") in bench.DEFAULT_SETTINGS
    assert (first[0], first[1], "copula", 1.0, "free") in bench.DEFAULT_SETTINGS  # version 4
    assert (*first[:4], "free") in bench.DEFAULT_SETTINGS  # version 5
    assert len(set(bench.DEFAULT_SETTINGS)) == len(bench.DEFAULT_SETTINGS)
    text = ",".join(bench.label(s) for s in bench.DEFAULT_SETTINGS)
    assert bench.parse_settings(text) == list(bench.DEFAULT_SETTINGS)


def test_read_as_shares_the_noise_and_changes_only_the_post_processing() -> None:
    tree = marginal_tree.measure(_sparse(), 1.0, 1e-9)
    same = bench.read_as(
        tree,
        (
            tree.one_way_threshold,
            tree.table_threshold,
            tree.joint_model,
            tree.temper,
            tree.one_way_shape,
        ),
    )
    other = bench.read_as(tree, (0.0, None, "copula", 1.0, "unimodal"))
    assert other.one_way is tree.one_way
    assert other.edges == tree.edges
    np.testing.assert_array_equal(other.tables, tree.tables)
    np.testing.assert_allclose(same.model.p, tree.model.p, rtol=0, atol=0)
    # version 2's plain projections, as a stored version-2 record reads them
    legacy = bench.read_as(tree, (*marginal_tree.LEGACY_THRESHOLDS, "blocks", 1.0, "free"))
    record = tree.to_dict() | {"format": marginal_tree.FORMATS[1]}
    stored = marginal_tree.TreeMeasurements.from_dict(record)
    np.testing.assert_allclose(legacy.model.p, stored.model.p, rtol=0, atol=1e-15)
    for a, b in zip(legacy.model.joint, stored.model.joint, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-15)
    # and the thresholds do change the law (the comparison can fail): column 0 holds
    # three values (masses 0.5, 0.3, 0.2, noise ~0.04), and a one-way threshold between
    # its two largest noisy frequencies keeps its top cell alone in the fine histogram, so
    # the mass of the other two moves (within their coarse groups). (Threshold 0 against
    # the default 1.5 differs only when a noisy cell lands between them and survives the
    # projection, which the unseeded noise does not always give.) Both read with the free
    # shape: the unimodal one pools the third value's cell, two empty cells from the
    # others, in about one release in nine (a spike near the shape test's limit, module
    # doc "Unimodal one-way marginals"), and the premise would then fail, not the claim.
    tau = tree.one_way.calibration.stddev
    top, second = np.sort(tree.one_way.frequencies[0])[::-1][:2]
    base = bench.read_as(
        tree, (tree.one_way_threshold, tree.table_threshold, "copula", tree.temper, "free")
    )
    sharp = bench.read_as(
        tree, ((top + second) / 2 / tau, tree.table_threshold, "copula", tree.temper, "free")
    )
    assert np.count_nonzero(base.model.p[0] > 0.1) == 3
    assert np.abs(sharp.model.p[0] - base.model.p[0]).sum() > 0.1


def test_run_pairs_the_settings_and_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    """One release per round, shared by every setting: ``measure`` runs once a round."""
    calls = []
    measure = marginal_tree.measure

    def counted(*args: Any, **kwargs: Any) -> marginal_tree.TreeMeasurements:
        calls.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(bench.marginal_tree, "measure", counted)
    settings = [(1.5, 3.0, "copula", 2.0, "unimodal"), (0.0, None, "blocks", 1.0, "free")]
    result = bench.run({"TINY": _sparse()}, 3, 25, settings, log=lambda *args: None)
    assert len(calls) == 3
    labels = ["1.5:3:copula:2:unimodal", "0:none:blocks:1:free"]
    result["settings"] = {"rounds": 3, "queries": 25, "settings": labels}
    entry = result["datasets"]["TINY"]
    assert list(entry["rows"]) == labels
    first, other = entry["rows"].values()
    keys = first["ratio"].keys()
    assert len(keys) == len(SIGMAS) + len(JOINT_SIGMAS)
    assert list(keys) == bench.FAMILY_KEYS
    assert all(first["difference"][k] == 0.0 and first["stderr"][k] == 0.0 for k in keys)
    # no denoising at all moves the answers on sparse data (the comparison can fail)
    assert any(abs(other["difference"][k]) > 1e-6 for k in keys)
    for k in keys:
        assert other["difference"][k] == pytest.approx(other["ratio"][k] - first["ratio"][k])
    json.dumps(result)
    text = bench.render_markdown(result)
    assert "## TINY (n = 600, d = 3;" in text
    assert "| 0:none:blocks:1:free | x" in text
    assert "+-" in text


def test_run_refuses_settings_with_one_label() -> None:
    with pytest.raises(ValueError, match="twice"):
        settings = [
            (1.5, 3.0, "copula", 2.0, "free"),
            (1.5, 3.0 + 1e-12, "copula", 2.0, "free"),
        ]
        bench.run({"TINY": _sparse()}, 2, 10, settings, log=print)


def test_run_needs_two_rounds_for_a_standard_error() -> None:
    with pytest.raises(ValueError, match="2 rounds"):
        bench.run(
            {"TINY": _sparse()}, 1, 10, [(1.5, 3.0, "copula", 2.0, "free")], log=lambda *args: None
        )
