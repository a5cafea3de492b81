"""smooth_synthetic and smooth_synopsis through the API: release, download, answers."""

from __future__ import annotations

import io
import itertools
import json
import math
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pacsv
import pytest
from fastapi.testclient import TestClient
from numpy.polynomial import chebyshev as npcheb

from app.mechanisms import smooth_synopsis as sy
from app.mechanisms.smooth_synopsis import Synopsis
from app.releases.adapters import smooth_synopsis as smooth_synopsis_adapter
from tests.conftest import Caller
from tests.datasets.helpers import upload
from tests.releases.helpers import (
    budget,
    finished_release,
    heartbeat_sees_the_cancel,
    published_progress,
    request_release,
    run_all,
    services_of,
)

BOUNDS = {"x": (0.0, 10.0), "y": (-5.0, 5.0), "z": (100.0, 200.0)}


def _dataset(
    client: TestClient, curator: Caller, n: int = 500, delta_budget: float = 1e-6
) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(11)
    normalised = np.clip(rng.normal([0.3, -0.2, 0.0], [0.2, 0.3, 0.4], size=(n, 3)), -1, 1)
    lower = np.array([b[0] for b in BOUNDS.values()])
    upper = np.array([b[1] for b in BOUNDS.values()])
    data = lower + (normalised + 1) * (upper - lower) / 2
    lines = ["x,y,z,label"] + [
        f"{a:.6f},{b:.6f},{c:.6f},{'u' if i % 2 else 'v'}" for i, (a, b, c) in enumerate(data)
    ]
    schema = {
        "name": "smooth",
        "columns": [
            {"name": k, "kind": "continuous", "lower": lo, "upper": hi}
            for k, (lo, hi) in BOUNDS.items()
        ]
        + [{"name": "label", "kind": "categorical", "categories": ["u", "v"]}],
        "budget": {"epsilon": 10, "delta": delta_budget},
    }
    response = upload(client, curator, ("\n".join(lines) + "\n").encode(), schema)
    assert response.status_code == 201, response.text
    return str(response.json()["id"]), data


def _answers(
    client: TestClient, caller: Caller, release_id: str, queries: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    response = client.post(
        f"/v1/releases/{release_id}/answers", headers=caller.headers, json={"queries": queries}
    )
    assert response.status_code == 200, response.text
    return list(response.json()["answers"])


def _original_to_normalised_query(center: list[float], sigma: float) -> dict[str, Any]:
    lower = np.array([b[0] for b in BOUNDS.values()])
    upper = np.array([b[1] for b in BOUNDS.values()])
    c = 2 * (np.asarray(center) - lower) / (upper - lower) - 1
    return {
        "type": "gaussian_mixture",
        "centers": [c.tolist()],
        "weights": [1.0],
        "sigma": (2 * sigma / (upper - lower)).tolist(),
    }


def test_smooth_synthetic_moments_end_to_end(client: TestClient, curator: Caller) -> None:
    dataset_id, _data = _dataset(client, curator)
    body = {
        "mechanism": "smooth_synthetic",
        "epsilon": 1.0,
        "params": {"method": "moments", "grid_size": 2000, "sample_size": 300},
    }
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    assert preview.json()["resolved"]["basis_size"] >= 3
    assert preview.json()["accuracy"]["noise"] == "laplace"
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    assert response.json()["columns"] == ["x", "y", "z"]
    release_id = response.json()["id"]
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "succeeded", release
    assert release["privacy_cost"]["epsilon"] <= 1.0

    rows = pacsv.read_csv(
        io.BytesIO(
            client.get(
                f"/v1/releases/{release_id}/synthetic?format=csv", headers=curator.headers
            ).content
        )
    )
    assert rows.num_rows == 300
    for name, (lo, hi) in BOUNDS.items():
        values = np.asarray(rows[name].to_pylist())
        assert np.all((values >= lo - 1e-9) & (values <= hi + 1e-9)), name
    support = pacsv.read_csv(
        io.BytesIO(
            client.get(
                f"/v1/releases/{release_id}/synthetic?kind=support", headers=curator.headers
            ).content
        )
    )
    weights = np.asarray(support["weight"].to_pylist())
    assert weights.sum() == pytest.approx(1.0)

    # the same function in original and normalised units gives the same answer
    center, sigma = [5.0, 0.0, 150.0], 4.0
    original = {
        "type": "gaussian_mixture",
        "centers": [center],
        "weights": [1.0],
        "sigma": sigma,
        "space": "original",
    }
    a, b = _answers(
        client, curator, release_id, [original, _original_to_normalised_query(center, sigma)]
    )
    assert a["value"] == pytest.approx(b["value"], rel=1e-12)
    # the bootstrap's standard error, the same for the same function in either unit
    assert a["stderr"] == pytest.approx(b["stderr"], rel=1e-9)
    # a kernel's values lie in [0, 1], so any spread of them is at most 1/2 (Popoviciu);
    # the noise is not seeded (OpenDP), and 30 runs spread 0.03-0.16 (one of 0.217 failed
    # an earlier bound of 0.2)
    assert 0 < a["stderr"] <= 0.5
    assert a["interval"] is None
    assert "parametric bootstrap" in a["note"]
    # a polynomial in original units is the weighted mean over the downloaded support
    poly = {
        "type": "polynomial",
        "terms": [
            {"coefficient": 1.0, "powers": {"z": 1}},
            {"coefficient": 2.0, "powers": {"x": 2}},
        ],
        "space": "original",
    }
    product = {
        "type": "product",
        "factors": {"y": {"type": "polynomial", "coefficients": [1.0, 0.5]}},
        "space": "original",
    }
    p, q = _answers(client, curator, release_id, [poly, product])
    z, x, y = (np.asarray(support[k].to_pylist()) for k in ("z", "x", "y"))
    assert p["value"] == pytest.approx(float(weights @ (z + 2 * x**2)), rel=1e-9)
    assert q["value"] == pytest.approx(float(weights @ (1 + 0.5 * y)), rel=1e-9)
    # Gaussian product factors in original units (one narrow: sigma' = 2 * 0.5 / 100 = 0.01)
    # centred near the heaviest support point are the weighted mean of the kernel
    heaviest = int(np.argmax(weights))
    cz, cx = float(z[heaviest]) + 0.2, float(x[heaviest])
    gaussians = {
        "type": "product",
        "factors": {
            "z": {"type": "gaussian", "center": cz, "sigma": 0.5},
            "x": {"type": "gaussian", "center": cx, "sigma": 3.0},
        },
        "weight": 2.0,
        "space": "original",
    }
    (g,) = _answers(client, curator, release_id, [gaussians])
    kernel = np.exp(-((z - cz) ** 2) / (2 * 0.5**2) - (x - cx) ** 2 / (2 * 3.0**2))
    assert g["value"] == pytest.approx(2.0 * float(weights @ kernel), rel=1e-12)
    # the heaviest point alone (the others add >= 0); 0.99 leaves room for rounding
    assert g["value"] >= 0.99 * 2.0 * weights[heaviest] * math.exp(-(0.2**2) / (2 * 0.5**2))

    resynthesized = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"solver": "ipm", "sample_size": 50}},
    )
    assert resynthesized.status_code == 202, resynthesized.text
    run_all(client, release_id)
    again = pacsv.read_csv(
        io.BytesIO(
            client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers).content
        )
    )
    assert again.num_rows == 50
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == [
        "reserve",
        "commit",
    ]
    assert client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"smoothness": 9}},
    ).status_code in (409, 422)


def _csv(client: TestClient, caller: Caller, release_id: str, query: str = "") -> Any:
    response = client.get(f"/v1/releases/{release_id}/synthetic{query}", headers=caller.headers)
    assert response.status_code == 200, response.text
    return pacsv.read_csv(io.BytesIO(response.content))


def _kernel_truth(data: np.ndarray, center: np.ndarray, sigma: np.ndarray) -> float:
    """A gaussian_mixture query (normalised space) evaluated exactly on the data."""
    lower = np.array([b[0] for b in BOUNDS.values()])
    upper = np.array([b[1] for b in BOUNDS.values()])
    x = 2 * (data - lower) / (upper - lower) - 1
    return float(np.mean(np.exp(-np.sum((x - center) ** 2 / (2 * sigma**2), axis=1))))


@pytest.mark.parametrize(("delta", "noise"), [(0.0, "laplace"), (1e-6, "gaussian")])
def test_smooth_synthetic_marginals_preview(
    client: TestClient, curator: Caller, delta: float, noise: str
) -> None:
    from app.mechanisms import marginals

    dataset_id, _ = _dataset(client, curator)
    # the default method with delta = 0; with delta > 0 the default is "tree"
    body: dict[str, Any] = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "delta": delta}
    if delta > 0:
        body["params"] = {"method": "marginals"}
    response = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert response.status_code == 200, response.text
    preview = response.json()
    tau = marginals.noise_stddev(500, 3, 1.0, delta)
    assert preview["resolved"] == {
        "method": "marginals",
        "d": 3,
        "n": 500,
        "bins": marginals.default_bins(500, 3, 1.0, delta),
        "bound_atoms": tau < marginals.ATOM_NOISE_LIMIT,
        "grid_size": marginals.DEFAULT_SUPPORT_SIZE,
        "noise_mechanism": noise,
    }
    accuracy = preview["accuracy"]
    assert accuracy["noise"] == noise
    assert accuracy["frequency_stddev"] == pytest.approx(tau, rel=1e-12)
    assert accuracy["noise_scale"] > 0
    assert "simplex" in accuracy["note"]
    explicit = client.post(
        f"/v1/datasets/{dataset_id}/preview",
        headers=curator.headers,
        json={
            **body,
            "params": {
                **body.get("params", {}),
                "bins": 7,
                "bound_atoms": False,
                "grid_size": 300,
            },
        },
    ).json()["resolved"]
    assert (explicit["bins"], explicit["bound_atoms"], explicit["grid_size"]) == (7, False, 300)
    assert budget(client, curator, dataset_id)["entries"] == []


def test_smooth_synthetic_marginals_end_to_end(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.releases.adapters import smooth_synthetic as adapter

    n = 2000
    dataset_id, data = _dataset(client, curator, n=n)
    body = {"mechanism": "smooth_synthetic", "epsilon": 2.0}  # the default method
    preview = client.post(
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body
    ).json()
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    assert response.json()["params"]["method"] == "marginals"
    release_id = response.json()["id"]
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "succeeded", release
    assert release["privacy_cost"]["epsilon"] <= 2.0
    resolved = release["resolved"]
    assert resolved["method"] == "marginals"
    # preview (public values only) and measurement resolve the same histogram
    assert resolved["bins"] == preview["resolved"]["bins"]
    assert resolved["bound_atoms"] == preview["resolved"]["bound_atoms"]
    assert resolved["noise_stddev"] == pytest.approx(preview["accuracy"]["frequency_stddev"])
    assert resolved["synthesis"]["parameters"]["C"] == 10_000

    rows = _csv(client, curator, release_id, "?format=csv")
    assert rows.num_rows == n  # m defaults to n
    for j, (name, (lo, hi)) in enumerate(BOUNDS.items()):
        values = np.asarray(rows[name].to_pylist())
        assert np.all((values >= lo - 1e-9) & (values <= hi + 1e-9)), name
        # original units: each column's mean within 3 % of its range of the data's (300
        # simulated releases and samples of n rows: worst 2.1 % on z, which broke the 2 %
        # this test had in about 1 run in 300; a lost unit or column order is off by > 10 %)
        assert abs(values.mean() - data[:, j].mean()) <= 0.03 * (hi - lo), name
    support = _csv(client, curator, release_id, "?kind=support")
    assert support.num_rows == 10_000
    weights = np.asarray(support["weight"].to_pylist())
    assert weights.sum() == pytest.approx(1.0)

    # Gaussian kernels against their exact value on the data. At n = 2000, epsilon = 2 the
    # worst error over 400 simulated releases was 0.023 (first) and 0.010 (second); the
    # uniform distribution is 0.42 and 0.09 off, so a release that lost the marginals (or
    # their units or column order) fails.
    center, sigma = np.array([0.3, -0.2, 0.0]), np.full(3, 0.5)
    in_original = {
        "type": "gaussian_mixture",
        "centers": [[5.0, 0.0, 150.0]],
        "weights": [1.0],
        "sigma": 4.0,
        "space": "original",
    }
    a, b = _answers(
        client,
        curator,
        release_id,
        [
            {
                "type": "gaussian_mixture",
                "centers": [center.tolist()],
                "weights": [1.0],
                "sigma": sigma.tolist(),
            },
            in_original,
        ],
    )
    assert abs(a["value"] - _kernel_truth(data, center, sigma)) <= 0.05
    normalised_sigma = np.array([0.8, 0.8, 0.08])
    assert abs(b["value"] - _kernel_truth(data, np.zeros(3), normalised_sigma)) <= 0.03
    # the noise's standard error by the parametric bootstrap: at epsilon = 2, n = 2000 it
    # is 2e-3 to 5e-3 for such kernels (a few releases, marginals and tree; a 0 or a
    # missing standard error fails, and so would one the size of the uniform law's 0.42)
    assert 1e-4 < a["stderr"] < 0.02
    assert a["interval"] is None
    assert "parametric bootstrap" in a["note"]
    assert "product of the noisy one-column marginals" in a["note"]

    # a Gaussian product factor in original units answers like the same function given as
    # Chebyshev coefficients (numpy's interpolant at degree 200, normalised units: on y,
    # c' = 1 / 5 = 0.2, sigma' = 0.6 / 5 = 0.12): the coefficients differ by < 1e-13 in l1
    # and every moment is at most 1, so the answers agree to 1e-12
    reference = npcheb.chebinterpolate(lambda t: np.exp(-((t - 0.2) ** 2) / (2 * 0.12**2)), 200)
    gaussian, chebyshev_form = _answers(
        client,
        curator,
        release_id,
        [
            {
                "type": "product",
                "factors": {"y": {"type": "gaussian", "center": 1.0, "sigma": 0.6}},
                "weight": -3.0,
                "space": "original",
            },
            {
                "type": "product",
                "factors": {"y": {"type": "chebyshev", "coefficients": reference.tolist()}},
                "weight": -3.0,
            },
        ],
    )
    assert gaussian["value"] == pytest.approx(chebyshev_form["value"], rel=0, abs=1e-12)
    assert gaussian["value"] < -0.01  # the kernel has mass on the data (y' ~ N(-0.2, 0.3))

    # a Gaussian too narrow to expand in Chebyshev points is refused by its position in the
    # batch, with the smallest width that expands (the refusal named no query, and no width),
    # found by planning alone: the batch's work is not checked yet, and bisecting it by
    # expanding took 73 s for 40 wide mixtures (review)
    narrow = {"type": "gaussian_mixture", "centers": [[0, 0, 0]], "weights": [1], "sigma": 1e-6}
    expanded: list[object] = []
    expand_block = adapter.expand_block
    monkeypatch.setattr(
        adapter, "expand_block", lambda *args: expanded.append(args) or expand_block(*args)
    )
    refused = client.post(
        f"/v1/releases/{release_id}/answers",
        headers=curator.headers,
        json={"queries": [in_original, in_original, narrow, in_original]},
    )
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert message.startswith("queries.2: sigma (1e-06) is too small to expand"), message
    assert message.endswith("(the smallest sigma expanded is 0.00022 on the normalised scale)")
    assert expanded == []
    monkeypatch.undo()

    # re-synthesis with another support size: post-processing, no budget
    spent = budget(client, curator, dataset_id)["epsilon_spent"]
    resynthesized = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"grid_size": 500, "sample_size": 50}},
    )
    assert resynthesized.status_code == 202, resynthesized.text
    # while it runs, the published version answers and downloads as before
    assert resynthesized.json()["status"] == "synthesizing"
    (during,) = _answers(client, curator, release_id, [in_original])
    assert during == b
    assert _csv(client, curator, release_id).num_rows == n
    run_all(client, release_id)
    again = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert again["status"] == "succeeded", again
    assert again["synthesis_version"] == release["synthesis_version"] + 1
    assert _csv(client, curator, release_id).num_rows == 50
    assert _csv(client, curator, release_id, "?kind=support").num_rows == 500
    after = budget(client, curator, dataset_id)
    assert after["epsilon_spent"] == spent
    assert [e["kind"] for e in after["entries"]] == ["reserve", "commit"]
    measurement_param = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"bins": 9}},
    )
    assert measurement_param.status_code == 422, measurement_param.text
    # the refusal lists what this release's method can change, not the moment LP's solver
    assert "(['grid_size', 'sample_size']); not: ['bins']" in measurement_param.text
    moments_only = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"solver": "ipm"}},
    )
    assert moments_only.status_code == 422, moments_only.text
    assert "solver apply to method 'moments' only" in moments_only.text
    unchanged = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert unchanged["synthesis_version"] == again["synthesis_version"]


@pytest.mark.parametrize(
    ("params", "fragments"),
    [
        (
            {"method": "marginals", "smoothness": 8, "solver": "ipm"},
            ["smoothness, solver apply to method 'moments' only", "method 'marginals'"],
        ),
        ({"grid": "pca_ellipsoid"}, ["grid apply to method 'moments' only", "(the default)"]),
        (
            {"method": "moments", "bins": 8, "bound_atoms": True},
            ["bins, bound_atoms apply to method 'marginals' or 'tree' only"],
        ),
        ({"pair_bins": 4}, ["pair_bins apply to method 'tree' only", "(the default)"]),
        (
            {"method": "marginals", "pair_grouping": "equal"},
            ["pair_grouping apply to method 'tree' only", "method 'marginals'"],
        ),
        (
            {"method": "tree", "solver": "ipm", "bins": 6},
            ["solver apply to method 'moments' only", "method 'tree'"],
        ),
    ],
)
def test_smooth_synthetic_refuses_the_other_methods_params(
    client: TestClient, curator: Caller, params: dict[str, Any], fragments: list[str]
) -> None:
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "params": params}
    for response in (
        client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body),
        request_release(client, curator, dataset_id, body),
    ):
        assert response.status_code == 422, response.text
        message = response.json()["error"]["message"]
        for fragment in fragments:
            assert fragment in message
    assert budget(client, curator, dataset_id)["entries"] == []
    assert services_of(client).queue.pending() == 0


def test_pair_grouping_choices_are_the_mechanisms_groupings() -> None:
    """The API's ``pair_grouping`` Literal spells out :data:`marginal_tree.GROUPINGS`
    (a type checker needs the literal values); they must not drift apart."""
    from typing import get_args

    from app.mechanisms import marginal_tree
    from app.releases.adapters.smooth_synthetic import SyntheticParams

    annotation = SyntheticParams.model_fields["pair_grouping"].annotation
    choices = {value for arg in get_args(annotation) for value in get_args(arg)}
    assert choices == set(marginal_tree.GROUPINGS)


@pytest.mark.parametrize("grouping", [None, "quantile", "equal"])
def test_smooth_synthetic_tree_end_to_end(
    client: TestClient, curator: Caller, grouping: str | None
) -> None:
    from app.mechanisms import marginal_tree

    n = 2000
    dataset_id, data = _dataset(client, curator, n=n)
    params: dict[str, Any] = {"method": "tree"}
    if grouping is not None:
        params["pair_grouping"] = grouping
    body = {"mechanism": "smooth_synthetic", "epsilon": 2.0, "delta": 1e-6, "params": params}
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    fixed = marginal_tree.plan(n, 3, 2.0, 1e-6, grouping=grouping)
    # the default here (little noise: s_2 < 1 / 16, s_1 cells < 1/2) is the blend
    assert fixed.grouping == (grouping or "blend")
    assert preview.json()["resolved"] == {
        **fixed.as_dict(),
        "d": 3,
        "n": n,
        "grid_size": 10_000,
    }
    assert budget(client, curator, dataset_id)["entries"] == []
    release = finished_release(client, curator, dataset_id, body)
    release_id = release["id"]
    assert release["privacy_cost"]["epsilon"] <= 2.0
    assert release["privacy_cost"]["delta"] <= 1e-6
    resolved = release["resolved"]
    assert resolved["method"] == "tree"
    assert len(resolved["edges"]) == 2  # a spanning tree over the 3 continuous columns
    keys = ("bins", "bound_atoms", "pair_bins", "pair_grouping", "rho", "pair_frequency_stddev")
    for key in keys:
        assert resolved[key] == pytest.approx(preview.json()["resolved"][key]), key
    rows = _csv(client, curator, release_id, "?format=csv")
    assert rows.num_rows == n
    # a column mean's error (noisy one-way cells, 10^4 support points, n rows drawn from
    # them) over 300 simulated releases per grouping: rms 0.0037-0.0065 of the range,
    # worst 0.0186 (a 0.02 tolerance failed about once in a few hundred CI runs). 0.04 is
    # six times the largest rms; the uniform law is 0.15 (x) and 0.10 (y) off
    for j, (name, (lo, hi)) in enumerate(BOUNDS.items()):
        values = np.asarray(rows[name].to_pylist())
        assert np.all((values >= lo - 1e-9) & (values <= hi + 1e-9)), name
        assert abs(values.mean() - data[:, j].mean()) <= 0.04 * (hi - lo), name
    support = _csv(client, curator, release_id, "?kind=support")
    assert support.num_rows == 10_000

    # exact answers under the tree law. Over 200 simulated releases (n = 2000, epsilon = 2,
    # delta = 1e-6) the worst errors were 0.026 and 0.012; the uniform law is 0.42 and
    # 0.09 off
    center, sigma = np.array([0.3, -0.2, 0.0]), np.full(3, 0.5)
    wide, narrow_z = np.zeros(3), np.array([0.8, 0.8, 0.08])
    a, b = _answers(
        client,
        curator,
        release_id,
        [
            {"type": "gaussian_mixture", "centers": [c.tolist()], "weights": [1.0], "sigma": s}
            for c, s in ((center, sigma.tolist()), (wide, narrow_z.tolist()))
        ],
    )
    assert abs(a["value"] - _kernel_truth(data, center, sigma)) <= 0.05
    assert abs(b["value"] - _kernel_truth(data, wide, narrow_z)) <= 0.03
    assert "private tree" in a["note"]
    for answer in (a, b):  # the noise's standard error (2e-3 to 5e-3 here), no interval
        assert 1e-4 < answer["stderr"] < 0.02
        assert answer["interval"] is None
    # the downloadable support is a sample of the same law (C = 10^4: MC error < 0.01)
    lower = np.array([v[0] for v in BOUNDS.values()])
    upper = np.array([v[1] for v in BOUNDS.values()])
    points = np.column_stack([np.asarray(support[k].to_pylist()) for k in BOUNDS])
    weights = np.asarray(support["weight"].to_pylist())
    x = 2 * (points - lower) / (upper - lower) - 1
    on_support = float(weights @ np.exp(-np.sum((x - center) ** 2 / (2 * sigma**2), axis=1)))
    assert abs(on_support - a["value"]) <= 0.01

    spent = budget(client, curator, dataset_id)["epsilon_spent"]
    again = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"grid_size": 500, "sample_size": 40}},
    )
    assert again.status_code == 202, again.text
    run_all(client, release_id)
    assert _csv(client, curator, release_id, "?kind=support").num_rows == 500
    assert budget(client, curator, dataset_id)["epsilon_spent"] == spent
    refused = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"solver": "ipm"}},
    )
    assert refused.status_code == 422
    assert "uses method 'tree'" in refused.text


@pytest.mark.parametrize(("delta", "method"), [(0.0, "marginals"), (1e-6, "tree")])
def test_smooth_synthetic_default_method_follows_delta(
    client: TestClient, curator: Caller, delta: float, method: str
) -> None:
    """No method: 'tree' with delta > 0, 'marginals' with delta = 0; preview, the stored
    params and the measurement agree, and the 422 for another method's parameter says
    the method was the default."""
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "delta": delta}
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    assert preview.json()["params"]["method"] == method
    assert preview.json()["resolved"]["method"] == method
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    assert response.json()["params"]["method"] == method
    release_id = response.json()["id"]
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "succeeded", release
    assert release["resolved"]["method"] == method
    # the release keeps the accuracy its request predicted (DESIGN.md section 4)
    assert preview.json()["accuracy"]
    assert response.json()["accuracy"] == release["accuracy"] == preview.json()["accuracy"]
    # what the release shows of its params is what this method takes (with no moment-LP
    # smoothness or solver beside a tree), also in the preview and after a re-synthesis
    others = {"smoothness", "solver", "ellipsoid_radius"}
    if method == "marginals":
        others |= {"pair_bins", "pair_grouping"}
    for shown in (preview.json()["params"], release["params"]):
        assert not others & set(shown), shown
        assert {"bins", "grid_size", "sample_size"} <= set(shown)
    resynthesized = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"grid_size": 64}},
    )
    assert resynthesized.status_code == 202, resynthesized.text
    assert resynthesized.json()["synthesis_params"] == {"grid_size": 64, "sample_size": None}
    refused = client.post(
        f"/v1/datasets/{dataset_id}/preview",
        headers=curator.headers,
        json={**body, "params": {"solver": "ipm"}},
    )
    assert refused.status_code == 422
    assert f"uses method '{method}' (the default)" in refused.json()["error"]["message"]


def test_default_method_is_marginals_when_the_histograms_are_too_coarse_for_the_tree(
    client: TestClient, curator: Caller
) -> None:
    """A small budget for n and d resolves each histogram to 2 or 3 cells, fewer than the
    tree's 4 x 4 tables need: a request that names no method gets 'marginals' there (it
    got 'tree' and a 422 about pair_bins), unless it asks for the tree's own parameters."""
    from app.mechanisms import marginals

    dataset_id, _ = _dataset(client, curator)
    for epsilon, method in ((0.2, "marginals"), (1.0, "tree")):
        B, atoms = marginals.resolve(500, 3, epsilon, 1e-6)
        assert (B + 2 * atoms >= 4) == (method == "tree")
        body = {"mechanism": "smooth_synthetic", "epsilon": epsilon, "delta": 1e-6}
        preview = client.post(
            f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body
        )
        assert preview.status_code == 200, preview.text
        assert preview.json()["resolved"]["method"] == method
    asked = client.post(
        f"/v1/datasets/{dataset_id}/preview",
        headers=curator.headers,
        json={**body, "epsilon": 0.2, "params": {"pair_bins": 2}},
    )
    assert asked.status_code == 200, asked.text
    assert asked.json()["resolved"]["method"] == "tree"
    assert asked.json()["resolved"]["pair_bins"] == 2


def test_a_table_wider_than_the_tree_allows_gets_marginals_or_a_422(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree's selection grows as d^3 (a 2000-column table measured for over 14 minutes
    in an audit): above ``MAX_TREE_COLUMNS`` a request that names no method gets
    'marginals', and one that asks for the tree is a 422 before anything is reserved."""
    from app.mechanisms import marginal_tree

    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "delta": 1e-6}
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.json()["resolved"]["method"] == "tree", preview.text
    monkeypatch.setattr(marginal_tree, "MAX_TREE_COLUMNS", 2)
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.json()["resolved"]["method"] == "marginals", preview.text
    narrow = {**body, "columns": ["x", "y"]}
    preview = client.post(
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=narrow
    )
    assert preview.json()["resolved"]["method"] == "tree", preview.text
    asked = {**body, "params": {"method": "tree"}}
    for response in (
        client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=asked),
        request_release(client, curator, dataset_id, asked),
    ):
        assert response.status_code == 422, response.text
        assert "at most 2 columns (3 here)" in response.json()["error"]["message"]
    assert budget(client, curator, dataset_id)["entries"] == []


def test_a_tree_whose_pair_counts_are_too_much_work_gets_marginals_or_a_422(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting every pair's table is ``n d (d - 1) / 2`` pair-rows (``MAX_TREE_COLUMNS``
    was calibrated at n = 1000 only): above ``MAX_PAIR_COUNT_WORK`` a request that names
    no method gets 'marginals', and one that asks for the tree is a 422 naming the work
    before anything is reserved; wider pair tables count as more work."""
    from app.mechanisms import marginal_tree

    dataset_id, _ = _dataset(client, curator)  # 500 rows, 3 columns: 1500 pair-rows
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "delta": 1e-6}

    def preview(json: dict[str, Any]) -> Any:
        return client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=json)

    assert preview(body).json()["resolved"]["method"] == "tree"
    monkeypatch.setattr(marginal_tree, "MAX_PAIR_COUNT_WORK", 1000)
    assert preview(body).json()["resolved"]["method"] == "marginals"
    narrow = {**body, "columns": ["x", "y"]}  # 500 pair-rows
    assert preview(narrow).json()["resolved"]["method"] == "tree"
    for asked, fragment in (
        ({**body, "params": {"method": "tree"}}, "of 500 rows and 3 columns (1.5e+03 pair-rows"),
        ({**narrow, "params": {"pair_bins": 8}}, "(2e+03 pair-rows at pair_bins 8)"),
    ):
        for response in (preview(asked), request_release(client, curator, dataset_id, asked)):
            assert response.status_code == 422, response.text
            message = response.json()["error"]["message"]
            assert fragment in message, message
            assert "more than the tree's 1e+03" in message, message
    assert budget(client, curator, dataset_id)["entries"] == []


def test_a_retry_after_the_default_method_changed_finds_its_release(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that names no method and was recorded with the tree, retried with its
    key once the work bound makes the same body default to marginals (an upgrade past
    0e66f97), gets its release again (200, charged once: it got 409 idempotency_key_reused:
    review); a body that sets another method with that key is still 409."""
    from app.mechanisms import marginal_tree

    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "delta": 1e-6}
    first = request_release(client, curator, dataset_id, body, key="before-the-bound")
    assert first.status_code == 202, first.text
    assert first.json()["params"]["method"] == "tree"
    monkeypatch.setattr(marginal_tree, "MAX_PAIR_COUNT_WORK", 1000)
    again = request_release(client, curator, dataset_id, body, key="before-the-bound")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    other = {**body, "params": {"method": "marginals"}}
    refused = request_release(client, curator, dataset_id, other, key="before-the-bound")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "idempotency_key_reused"
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == ["reserve"]


@pytest.mark.parametrize(
    ("epsilon", "delta", "params", "fragment"),
    [
        (1.0, 0.0, {"method": "tree"}, "needs delta > 0"),
        (1.0, 1e-6, {"method": "tree", "bins": 2, "pair_bins": 8}, "cannot exceed"),
        (1.0, 1e-6, {"method": "tree", "pair_grouping": "median"}, "pair_grouping"),
        # fine edge tables beyond the tree law's limit (an audit's request took the
        # machine's memory after the budget was spent)
        (1.0, 1e-6, {"method": "tree", "bins": 4096}, "fine-table entries"),
    ],
)
def test_smooth_synthetic_tree_refusals(
    client: TestClient,
    curator: Caller,
    epsilon: float,
    delta: float,
    params: dict[str, Any],
    fragment: str,
) -> None:
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": epsilon, "delta": delta, "params": params}
    for response in (
        client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body),
        request_release(client, curator, dataset_id, body),
    ):
        assert response.status_code == 422, response.text
        assert fragment in response.json()["error"]["message"]
    assert budget(client, curator, dataset_id)["entries"] == []


def test_smooth_synthetic_synthesis_follows_the_payload(tmp_path: Path) -> None:
    """The stored measurement's format picks the synthesis, whatever params.method says
    (a release measured before marginals became the default keeps its moments)."""
    from app.mechanisms import marginals
    from app.mechanisms import smooth_synthetic as ss
    from app.mechanisms.errors import MechanismError
    from app.releases.adapters.smooth_synthetic import SmoothSynthetic, SyntheticParams
    from app.releases.payloads import pack
    from app.releases.registry import ColumnInfo, DatasetInfo

    X = np.random.default_rng(0).uniform(-1, 1, size=(300, 2))
    info = DatasetInfo(
        300, (ColumnInfo("a", "continuous", 0, 1), ColumnInfo("b", "continuous", 0, 1))
    )
    adapter = SmoothSynthetic()
    moments = pack(ss.measure(X, 1.0, rng=np.random.default_rng(1)).to_dict())
    histograms = pack(marginals.measure(X, 1.0).to_dict())
    for payload, params, method in (
        (moments, SyntheticParams(grid_size=200, sample_size=20), "moments"),
        (histograms, SyntheticParams(method="moments", grid_size=200, sample_size=20), "marginals"),
    ):
        workdir = tmp_path / method
        workdir.mkdir()
        out = adapter.synthesize(
            payload, info, params, np.random.default_rng(2), workdir, lambda _: None
        )
        assert out.summary["parameters"]["method"] == method
        assert out.summary["rows"] == 20
        loaded = adapter.load(payload, info, workdir)
        if method == "marginals":  # answers come from the measured product law itself
            assert isinstance(loaded, marginals.MarginalMeasurements)
        else:
            assert loaded.points.shape == (loaded.weights.size, 2)
            assert loaded.weights.sum() == pytest.approx(1.0)
            assert loaded.replicates is not None
        query = {"type": "gaussian_mixture", "centers": [[0.0, 0.0]], "weights": [1.0], "sigma": 1}
        (answer,) = adapter.answer(loaded, info, [query])
        assert 0.0 < answer["value"] <= 1.0
        assert ("one-column marginals" in answer["note"]) == (method == "marginals")
    with pytest.raises(MechanismError, match="unknown smooth_synthetic measurement format"):
        adapter.synthesize(
            {"format": "other"}, info, SyntheticParams(), np.random.default_rng(), tmp_path, print
        )


def test_tree_synthesis_progress_moves_with_the_bootstrap_refits(tmp_path: Path) -> None:
    """The tree's 20 bootstrap refits are most of its synthesis: the release's progress
    moves past 0.6 with each of them (it sat at 0.6 until they were all done), increasing,
    and reaches 0.8 with the last."""
    from app.mechanisms import bootstrap, marginal_tree
    from app.releases.adapters.smooth_synthetic import SmoothSynthetic, SyntheticParams
    from app.releases.payloads import pack
    from app.releases.registry import ColumnInfo, DatasetInfo

    rng = np.random.default_rng(0)
    z = rng.normal(size=2000)
    X = np.clip(np.column_stack([z, z + 0.3 * rng.normal(size=2000)]) / 3, -1, 1)
    info = DatasetInfo(
        2000, (ColumnInfo("a", "continuous", 0, 1), ColumnInfo("b", "continuous", 0, 1))
    )
    payload = pack(marginal_tree.measure(X, 2.0, 1e-6, bins=6, pair_bins=3).to_dict())
    seen: list[float] = []
    SmoothSynthetic().synthesize(
        payload,
        info,
        SyntheticParams(method="tree", grid_size=200, sample_size=20),
        np.random.default_rng(2),
        tmp_path,
        seen.append,
    )
    assert all(a <= b for a, b in itertools.pairwise(seen)), seen
    during = [f for f in seen if 0.6 < f < 0.8]
    assert len(during) == bootstrap.REPLICATES - 1, seen
    assert all(a < b for a, b in itertools.pairwise(during)), seen
    assert during[0] == pytest.approx(0.6 + 0.2 / bootstrap.REPLICATES)
    assert seen[-1] == pytest.approx(0.8)


def test_moments_synthesis_stores_the_answers_bootstrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A moments synthesis stores its bootstrap supports and answers carry their standard
    errors; a version without them (synthesised before, or a file that is corrupt or of
    another shape) answers with ``stderr`` None and says to re-synthesise; a refit the LP
    solver fails leaves the release intact, without the file."""
    from app.mechanisms import smooth_synthetic as ss
    from app.mechanisms.errors import SolverError
    from app.releases.adapters import smooth_synthetic as adapter_module
    from app.releases.adapters.smooth_synthetic import (
        REPLICATES_FILE,
        SmoothSynthetic,
        SyntheticParams,
    )
    from app.releases.payloads import pack
    from app.releases.registry import ColumnInfo, DatasetInfo

    rng = np.random.default_rng(0)
    X = np.clip(rng.normal(0.2, 0.3, size=(600, 3)), -1, 1)
    info = DatasetInfo(600, tuple(ColumnInfo(c, "continuous", -1, 1) for c in "abc"))
    payload = pack(ss.measure(X, 1.0, 1e-6, rng=np.random.default_rng(1)).to_dict())
    adapter = SmoothSynthetic()
    params = SyntheticParams(grid_size=500, sample_size=50)
    seen: list[float] = []
    out = adapter.synthesize(payload, info, params, rng, tmp_path, seen.append)
    assert REPLICATES_FILE in out.artifacts
    assert seen == sorted(seen)
    assert seen[-1] <= 1.0
    assert out.summary["seconds"]["noise_replicates"] >= 0
    loaded = adapter.load(payload, info, tmp_path)
    assert loaded.replicates is not None
    query = {"type": "gaussian_mixture", "centers": [[0.2, 0.1, 0.3]], "weights": [1.0]}
    (answer,) = adapter.answer(loaded, info, [{**query, "sigma": 1.0}])
    assert answer["stderr"] > 0
    assert "parametric bootstrap" in answer["note"]

    for content in (None, b"not a zip file", "misfit"):
        stale = tmp_path / "stale"
        stale.mkdir(exist_ok=True)
        for name in ("support_normalized.npy", "weights.npy"):
            (stale / name).write_bytes((tmp_path / name).read_bytes())
        if content == "misfit":  # another release's supports, of 2 columns
            np.savez(
                stale / REPLICATES_FILE,
                points=np.zeros((2, 2)),
                weights=np.ones(2),
                sizes=np.ones(2, dtype=np.int64),
            )
        elif content is not None:
            (stale / REPLICATES_FILE).write_bytes(content)
        old = adapter.load(payload, info, stale)
        assert old.replicates is None
        (without,) = adapter.answer(old, info, [{**query, "sigma": 1.0}])
        assert without["value"] == answer["value"]
        assert without["stderr"] is None
        assert "re-synthesise" in without["note"]

    def failing(*_args: object, **_kwargs: object) -> None:
        raise SolverError("HiGHS stopped: no progress")

    # an LP too large to refit 20 times in reasonable time is not refitted
    monkeypatch.setattr(adapter_module.ss, "MAX_REPLICATE_WORK", 0)
    large = tmp_path / "large"
    large.mkdir()
    out = adapter.synthesize(payload, info, params, rng, large, lambda _: None)
    assert REPLICATES_FILE not in out.artifacts
    assert "with a smaller grid_size" in out.summary["noise_replicates"]
    monkeypatch.setattr(adapter_module.ss, "MAX_REPLICATE_WORK", 10**9)

    monkeypatch.setattr(adapter_module.ss, "noise_replicates", failing)
    failed = tmp_path / "failed"
    failed.mkdir()
    out = adapter.synthesize(payload, info, params, rng, failed, lambda _: None)
    assert REPLICATES_FILE not in out.artifacts
    assert not (failed / REPLICATES_FILE).exists()
    assert out.summary["noise_replicates"].startswith("not computed")
    assert adapter.load(payload, info, failed).replicates is None


@pytest.mark.parametrize("method", ["marginals", "tree"])
def test_synthesis_stores_the_answers_bootstrap(tmp_path: Path, method: str) -> None:
    """The synthesis stage computes the bootstrap replicates and stores them (a tree
    release its fitted law too); a load of that version takes them (no refit on the first
    answer) and answers with the standard errors the lazily computed replicates give. A
    version without the file, or with one that does not fit, computes them on the first
    answer."""
    from app.mechanisms import marginal_tree, marginals
    from app.releases.adapters.smooth_synthetic import (
        REPLICATES_FILE,
        TREE_LAW_FILE,
        SmoothSynthetic,
        SyntheticParams,
    )
    from app.releases.payloads import pack
    from app.releases.registry import ColumnInfo, DatasetInfo

    rng = np.random.default_rng(0)
    z = rng.normal(size=800)
    X = np.clip(np.column_stack([z, z + rng.normal(size=800), rng.normal(size=800)]) / 3, -1, 1)
    info = DatasetInfo(800, tuple(ColumnInfo(c, "continuous", -1, 1) for c in "abc"))
    measured = (
        marginal_tree.measure(X, 2.0, 1e-6) if method == "tree" else marginals.measure(X, 2.0)
    )
    payload = pack(measured.to_dict())
    adapter = SmoothSynthetic()
    params = SyntheticParams(grid_size=500, sample_size=50)
    out = adapter.synthesize(payload, info, params, rng, tmp_path, lambda _: None)
    assert REPLICATES_FILE in out.artifacts
    assert (tmp_path / REPLICATES_FILE).is_file()
    assert out.summary["seconds"]["noise_replicates"] >= 0
    stored = adapter.load(payload, info, tmp_path)
    assert "noise_replicates" in stored.__dict__  # taken from the file, not refitted
    fresh = adapter.load(payload, info, tmp_path / "elsewhere")
    assert "noise_replicates" not in fresh.__dict__
    assert ("model" in stored.__dict__) == (method == "tree")
    assert "model" not in fresh.__dict__
    queries = [
        {"type": "gaussian_mixture", "centers": [c], "weights": [1.0], "sigma": 0.5}
        for c in ([0.0, 0.0, 0.0], [0.3, 0.3, -0.2])
    ]
    for a, b in zip(
        adapter.answer(stored, info, queries), adapter.answer(fresh, info, queries), strict=True
    ):
        assert a["value"] == b["value"]
        assert a["stderr"] == pytest.approx(b["stderr"], rel=1e-12)
        assert a["stderr"] > 0
    # a tree release also stores its fitted law: the first answer does not fit it again
    assert (TREE_LAW_FILE in out.artifacts) == (method == "tree")
    assert (tmp_path / TREE_LAW_FILE).is_file() == (method == "tree")
    if method == "tree":
        for name in ("p", "P", "group"):
            assert np.array_equal(getattr(stored.model, name), getattr(fresh.model, name))
        assert np.array_equal(np.stack(stored.model.joint), np.stack(fresh.model.joint))
        # the answers come from the stored law: a changed table changes them
        changed = dict(np.load(tmp_path / TREE_LAW_FILE))
        changed["joint"] = np.ones_like(changed["joint"]) / changed["joint"][0, 0].size
        np.savez(tmp_path / TREE_LAW_FILE, **changed)
        independent = adapter.load(payload, info, tmp_path)
        assert "model" in independent.__dict__
        (a, _), (b, _) = (adapter.answer(law, info, queries) for law in (independent, fresh))
        assert a["value"] != pytest.approx(b["value"], rel=1e-6)
        coarse = marginal_tree._model_arrays((fresh.coarse_model,))  # the block layout
        assert coarse["P"].shape[2] < changed["P"].shape[2]
        negative = {**changed, "p": -changed["p"]}
        for misfit in (
            {"p": np.zeros((1, 3, 2))},  # another release's shapes
            {**changed, "joint": changed["joint"][:, :1]},
            coarse,  # the block law on a copula release: wrong answers if taken
            {**coarse, "joint": changed["joint"]},  # coarse margins, fine tables: a 500
            negative,
            {**changed, "joint": np.full_like(changed["joint"], np.nan)},
        ):
            np.savez(tmp_path / TREE_LAW_FILE, **misfit)
            assert "model" not in adapter.load(payload, info, tmp_path).__dict__
        (tmp_path / TREE_LAW_FILE).write_bytes(b"not a zip file")
        assert "model" not in adapter.load(payload, info, tmp_path).__dict__
    np.savez(tmp_path / REPLICATES_FILE, p=np.zeros((3, 2, 2)))  # another release's shape
    assert "noise_replicates" not in adapter.load(payload, info, tmp_path).__dict__
    (tmp_path / REPLICATES_FILE).write_bytes(b"not a zip file")
    assert "noise_replicates" not in adapter.load(payload, info, tmp_path).__dict__


def test_a_stored_tree_law_is_taken_without_the_replicates(tmp_path: Path) -> None:
    """A tree release's stored law and its bootstrap laws are taken independently: a
    version whose replicates file is missing or unreadable still takes its fitted law
    (the replicates are then computed on the first answer, the law is not fitted)."""
    from app.mechanisms import marginal_tree
    from app.releases.adapters import smooth_synthetic as adapter

    X = np.random.default_rng(1).uniform(-1, 1, size=(400, 3))
    law = marginal_tree.measure(X, 2.0, 1e-6)
    adapter._save_arrays(tmp_path / adapter.TREE_LAW_FILE, law.model_arrays())
    for replicates in (None, b"not a zip file"):
        if replicates is not None:
            (tmp_path / adapter.REPLICATES_FILE).write_bytes(replicates)
        fresh = marginal_tree.TreeMeasurements.from_dict(law.to_dict())
        adapter._restore_replicates(fresh, tmp_path)
        assert "model" in fresh.__dict__
        assert "noise_replicates" not in fresh.__dict__


def test_smooth_synopsis_end_to_end(client: TestClient, curator: Caller, analyst: Caller) -> None:
    dataset_id, data = _dataset(client, curator, n=2000)
    body = {"mechanism": "smooth_synopsis", "epsilon": 1.0, "params": {"smoothness": 4}}
    preview = client.post(
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body
    ).json()
    assert preview["accuracy"]["predicted_stderr"] > 0
    assert preview["resolved"]["co_spread_epsilon"] == pytest.approx(0.05)
    without = client.post(
        f"/v1/datasets/{dataset_id}/preview",
        headers=curator.headers,
        json=body | {"params": {"smoothness": 4, "co_spread": False}},
    ).json()
    assert without["resolved"]["co_spread_epsilon"] == 0.0
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "succeeded", release
    document = client.get(f"/v1/releases/{release_id}/synopsis", headers=curator.headers)
    assert document.status_code == 200
    parsed = json.loads(document.content)
    assert [c["name"] for c in parsed["columns"]] == ["x", "y", "z"]
    from app.mechanisms.smooth_synopsis import Synopsis

    offline = Synopsis.from_dict(parsed["synopsis"])
    # the co-spread is part of the one measurement, and of its cost
    assert offline.co_spread is not None
    cost = parsed["synopsis"]["privacy_cost"]
    assert [part["step"] for part in cost["parts"]] == ["moments", "co_spread"]
    assert cost["epsilon"] == pytest.approx(1.0, rel=1e-9)
    assert release["resolved"]["co_spread"] is True

    client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    center, sigma = [5.0, 0.0, 150.0], 8.0
    query = {
        "type": "gaussian_mixture",
        "centers": [center],
        "weights": [1.0],
        "sigma": sigma,
        "space": "original",
    }
    (a, b) = _answers(
        client, analyst, release_id, [query, _original_to_normalised_query(center, sigma)]
    )
    assert a["value"] == pytest.approx(b["value"], rel=1e-9)
    assert a["dependence_log_factor"] == pytest.approx(b["dependence_log_factor"], rel=1e-9)
    assert a["stderr"] > 0
    low, high = a["interval"]
    lower = np.array([v[0] for v in BOUNDS.values()])
    upper = np.array([v[1] for v in BOUNDS.values()])
    s = 2 * sigma / (upper - lower)
    c = 2 * (np.asarray(center) - lower) / (upper - lower) - 1
    truth = float(
        np.mean(
            np.exp(
                -np.sum(((2 * (data - lower) / (upper - lower) - 1) - c) ** 2 / (2 * s**2), axis=1)
            )
        )
    )
    assert low - 3 * a["stderr"] <= truth <= high + 3 * a["stderr"]
    # the interval alone would pass a wide-but-wrong answer: over 6000 simulated releases
    # of this one the error's sd was 0.010 and its largest 0.062
    assert abs(a["value"] - truth) <= 0.1
    from app.mechanisms.queries import AnisotropicGaussianMixture

    offline_value = offline.answer(
        AnisotropicGaussianMixture(centers=c[None, :], weights=np.ones(1), sigma=s)
    )
    assert offline_value == pytest.approx(a["value"], rel=1e-9)

    # product queries with Gaussian factors answer as the former closure path did
    from app.mechanisms.queries import ProductQuery

    product = {
        "type": "product",
        "factors": {
            "x": {"type": "gaussian", "center": 6.0, "sigma": 1.5},
            "z": {"type": "gaussian", "center": 150.0, "sigma": 20.0},
        },
        "weight": 0.5,
        "space": "original",
    }
    (p,) = _answers(client, analyst, release_id, [product])

    def closure(center: float, width: float) -> Any:
        return lambda t: np.exp(-((t - center) ** 2) / (2 * width * width))

    former = offline.answer_many(
        [ProductQuery((closure(0.2, 0.3), None, closure(0.0, 0.4)), weight=0.5)]
    )
    assert p["value"] == pytest.approx(former.values[0], rel=1e-9, abs=1e-12)
    assert p["stderr"] == pytest.approx(former.stderr[0], rel=1e-9)
    # widths 0.3 and 0.4 on the normalised scale are narrower than the declared smoothness
    # (s^2 < 4): the interval is the worst case (plus the extrapolation), which holds for
    # every dataset; a closure's width is unknown, so it keeps the estimate
    assert p["within_smoothness"] is False
    assert former[0].within_smoothness is True
    low, high = p["worst_case_interval"]
    half = (high - low) / 2 + abs(p["independence_extrapolation"])
    assert p["interval"] == pytest.approx([p["value"] - half, p["value"] + half], rel=1e-9)
    assert p["interval"][0] <= former.low[0]
    assert former.high[0] <= p["interval"][1]
    assert p["value"] > 0.01
    # a width too narrow to expand (sigma' = 2 * 0.005 / 100 = 1e-4) is a clear 422
    too_narrow = {
        "type": "product",
        "factors": {"z": {"type": "gaussian", "center": 150.0, "sigma": 0.005}},
        "space": "original",
    }
    refused = client.post(
        f"/v1/releases/{release_id}/answers",
        headers=analyst.headers,
        json={"queries": [product, too_narrow]},
    )
    assert refused.status_code == 422
    assert (
        "queries.1: factor 2: a Gaussian factor with sigma 0.0001 is too narrow"
        in (refused.json()["error"]["message"])
    )

    bad = client.post(
        f"/v1/releases/{release_id}/answers",
        headers=analyst.headers,
        json={
            "queries": [
                {"type": "gaussian_mixture", "centers": [[0, 0]], "weights": [1], "sigma": 1}
            ]
        },
    )
    assert bad.status_code == 422
    assert "3 coordinates" in bad.json()["error"]["message"]
    # a polynomial with huge coefficients in normalised units (200^30 ~ 1e69) answers
    # (its error-bar factor overflowed: a 500)
    huge = {
        "type": "polynomial",
        "space": "original",
        "terms": [{"coefficient": 1, "powers": {"x": 30, "y": 30, "z": 30}}],
    }
    answered = client.post(
        f"/v1/releases/{release_id}/answers", headers=analyst.headers, json={"queries": [huge]}
    )
    assert answered.status_code == 200, answered.text
    # refused before any array is built or expanded (these were 500s or ran out of memory)
    mixture = {"type": "gaussian_mixture", "weights": [1, 1], "sigma": 1}
    for queries, fragment in (
        ([{**mixture, "centers": [[0, 0, 0], [0]]}], "3 coordinates"),  # ragged
        (
            [
                {
                    "type": "polynomial",
                    "space": "original",
                    "terms": [{"coefficient": 1, "powers": {"x": 30, "y": 30, "z": 30}}] * 4,
                }
            ],
            "expands to 119164 monomials",
        ),
        (
            [
                {
                    "type": "gaussian_mixture",
                    "centers": [[0, 0, 0]] * 2500,
                    "weights": [1] * 2500,
                    "sigma": 1,
                }
            ]
            * 2,
            "12500000 pairs of centres",
        ),
        (  # 31 * 31 = 961 monomials each, 11 * 961^2 pairs (an audit saw one polynomial
            # of 10571 monomials take 5.6 GB of error-bar tables)
            [
                {
                    "type": "polynomial",
                    "space": "original",
                    "terms": [{"coefficient": 1, "powers": {"x": 30, "z": 30}}],
                }
            ]
            * 11,
            "10158731 pairs of kernels",
        ),
    ):
        refused = client.post(
            f"/v1/releases/{release_id}/answers", headers=analyst.headers, json={"queries": queries}
        )
        assert refused.status_code == 422, refused.text
        assert fragment in refused.json()["error"]["message"]
    code = client.post(
        f"/v1/releases/{release_id}/answers",
        headers=analyst.headers,
        json={"queries": [{"type": "python", "code": "import os"}]},
    )
    assert code.status_code == 422


def test_smooth_requests_are_validated(client: TestClient, curator: Caller) -> None:
    dataset_id, _ = _dataset(client, curator)
    for body, fragment in (
        ({"mechanism": "smooth_synthetic", "epsilon": 1, "columns": ["label"]}, "not: ['label']"),
        (
            {
                "mechanism": "smooth_synthetic",
                "epsilon": 1,
                "params": {"method": "moments", "noise_mechanism": "gaussian"},
            },
            "needs delta > 0",
        ),
        (
            {"mechanism": "smooth_synthetic", "epsilon": 1, "params": {"grid": "sphere"}},
            "params.grid",
        ),
        (
            {"mechanism": "smooth_synopsis", "epsilon": 1, "params": {"basis": "magic"}},
            "params.basis",
        ),
        # an LP that cannot be built is refused before the moments are paid for (an audit
        # saw it accepted, charged, measured, and failed at synthesis)
        (
            {
                "mechanism": "smooth_synthetic",
                "epsilon": 1,
                "params": {"method": "moments", "basis_size": 100_000, "grid_size": 1_000_000},
            },
            "R = 100000 moments and C = 1000000 candidates needs about 8.7 TiB",
        ),
        (
            {
                "mechanism": "smooth_synthetic",
                "epsilon": 1,
                "params": {"method": "moments", "grid": "full", "grid_size": 1000},
            },
            "grid 'full' uses its N^d grid points as candidates",
        ),
        # its calibration composes R scalar maps: ~0.7 s an evaluation at R = 10^5
        (
            {
                "mechanism": "smooth_synthetic",
                "epsilon": 1,
                "delta": 1e-7,
                "params": {
                    "method": "moments",
                    "noise_mechanism": "laplace_approx",
                    "basis_size": 10_001,
                    "grid_size": 100,
                },
            },
            "noise_mechanism 'laplace_approx' takes at most R = 10000 moments (this request "
            "has R = 10001)",
        ),
    ):
        response = request_release(client, curator, dataset_id, body)
        assert response.status_code == 422, (body, response.text)
        assert fragment in response.json()["error"]["message"]
    assert budget(client, curator, dataset_id)["entries"] == []
    assert services_of(client).queue.pending() == 0


#: The request of the audit: accepted (202), then the worker's noise calibration failed
#: ("privacy map is not decreasing") after the moments were read, and the budget stayed spent.
TINY_EPSILON_MOMENTS = {
    "mechanism": "smooth_synthetic",
    "epsilon": 1e-12,
    "delta": 0.5,
    "params": {"method": "moments", "noise_mechanism": "laplace_approx"},
}


@pytest.mark.parametrize("noise_mechanism", ["laplace_approx", "gaussian"])
def test_moment_noise_no_scale_fits_is_refused_before_anything_is_reserved(
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
    noise_mechanism: str,
) -> None:
    """The request's check calibrates the moments' noise exactly as the worker's measure
    will, whatever the noise mechanism: a budget that no noise scale fits is a 422 that
    says so before any budget is reserved (laplace_approx skipped it: 202, then a failed
    measure that kept the budget spent). OpenDP's map is made to overspend at every scale
    (no admitted budget does that any more)."""
    from app.mechanisms import noise

    dataset_id, _ = _dataset(client, curator, delta_budget=0.9)
    before = budget(client, curator, dataset_id)

    def overspends(mechanism: str, scale: float, *args: object) -> tuple[float, float]:
        return math.inf, 0.0

    monkeypatch.setattr(noise, "cost_of_scale", overspends)
    params = {"method": "moments", "noise_mechanism": noise_mechanism, "basis_size": 3}
    body = {**TINY_EPSILON_MOMENTS, "epsilon": 0.5, "params": params}
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(
        f"the noise of the R = 3 moments (noise_mechanism {noise_mechanism!r}) cannot be "
        "calibrated: "
    ), message
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 422, preview.text
    assert preview.json()["error"]["message"] == message
    assert budget(client, curator, dataset_id) == before
    assert before["entries"] == []
    assert services_of(client).queue.pending() == 0


@pytest.mark.slow
def test_the_audited_tiny_epsilon_moments_release_is_calibrated_and_succeeds(
    client: TestClient, curator: Caller
) -> None:
    """epsilon = 1e-12 at delta = 0.5 has a noise scale (OpenDP's conversion reaches
    epsilon = 0 at a finite one); the search used to give up before it. The release is
    previewed, measured within its budget and synthesised."""
    dataset_id, _ = _dataset(client, curator, delta_budget=0.9)
    body = {**TINY_EPSILON_MOMENTS, "params": {**TINY_EPSILON_MOMENTS["params"]}}
    body["params"].update({"grid_size": 200, "sample_size": 50})  # type: ignore[attr-defined]
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    assert preview.json()["accuracy"]["noise"] == "laplace"
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "succeeded", release
    assert release["privacy_cost"]["epsilon"] <= 1e-12
    assert release["privacy_cost"]["delta"] <= 0.5


def test_a_synopsis_that_would_measure_too_long_is_refused_or_lowered(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The measure reads every row once per moment: a basis_size whose n R is over the
    work limit is refused at the request, before anything is reserved, and a default is
    lowered to fit (resource-exhaustion audit: 10^8 rows, a 4.5 MB Parquet file, with the
    default R = 8007 would have held a worker for 1.4 hours; basis_size 10^6 on 10^5 rows
    for 2)."""
    assert smooth_synopsis_adapter.largest_basis_size(10**7) == 10_000
    assert smooth_synopsis_adapter.largest_basis_size(10**5) == 100_000
    assert smooth_synopsis_adapter.largest_basis_size(10**12) == 0
    dataset_id, _ = _dataset(client, curator)  # n = 500; the default R is 12 at epsilon 1
    body: dict[str, Any] = {"mechanism": "smooth_synopsis", "epsilon": 1}

    def preview_size() -> int:
        url = f"/v1/datasets/{dataset_id}/preview"
        response = client.post(url, headers=curator.headers, json=body)
        assert response.status_code == 200, response.text
        return int(response.json()["resolved"]["basis_size"])

    assert preview_size() == 12
    monkeypatch.setattr(smooth_synopsis_adapter, "MAX_MEASURE_WORK", 500 * 8)
    assert preview_size() <= 8
    response = request_release(client, curator, dataset_id, {**body, "params": {"basis_size": 9}})
    assert response.status_code == 422, response.text
    assert "at most R = 8 for this table; lower basis_size" in response.json()["error"]["message"]
    assert budget(client, curator, dataset_id)["entries"] == []
    assert services_of(client).queue.pending() == 0


def test_a_synopsis_basis_is_built_as_asked_or_refused(client: TestClient, curator: Caller) -> None:
    """A basis_size was released as total degree whatever basis was asked ("paper" and
    "full_tensor" of a size no t^d - 1 gave R total-degree moments, recorded as the basis
    asked), and "paper" ignored max_basis_size (edge-input audit). Now the basis is
    built as asked or refused at the request, before anything is reserved."""
    dataset_id, _ = _dataset(client, curator)  # n = 500, d = 3
    body: dict[str, Any] = {"mechanism": "smooth_synopsis", "epsilon": 1}

    def preview(params: dict[str, Any]) -> Any:
        url = f"/v1/datasets/{dataset_id}/preview"
        return client.post(url, headers=curator.headers, json={**body, "params": params})

    for params, message in (
        ({"basis": "paper", "basis_size": 5}, "basis='paper' sets t itself"),
        ({"basis": "full_tensor", "basis_size": 5}, "basis_size (5) is not t^d - 1"),
        (
            {"basis": "paper", "max_basis_size": 1},
            "basis 'paper' gives R = 7 functions, more than max_basis_size (1)",
        ),
        (
            {"basis_size": 9, "max_basis_size": 8},
            "basis_size gives R = 9 functions, more than max_basis_size (8)",
        ),
    ):
        for refused in (
            preview(params),
            request_release(client, curator, dataset_id, {**body, "params": params}),
        ):
            assert refused.status_code == 422, (params, refused.text)
            assert message in refused.json()["error"]["message"], refused.text
    assert budget(client, curator, dataset_id)["entries"] == []
    full = preview({"basis": "full_tensor", "basis_size": 7}).json()["resolved"]
    assert (full["basis_size"], full["basis"]["chosen"]["kind"]) == (7, "full_tensor")
    fixed = preview({"basis": "auto", "basis_size": 5}).json()["resolved"]
    assert (fixed["basis_size"], fixed["basis"]["rule"]) == (5, "auto")
    assert preview({"basis": "paper"}).json()["resolved"]["basis_size"] == 7
    # only a lowered cap bounds a fixed size (one raised past the default bounds the rules)
    raised = preview({"basis_size": 25_000, "max_basis_size": 20_001})
    assert raised.json()["resolved"]["basis_size"] == 25_000, raised.text


def test_a_retry_of_a_request_a_new_check_refuses_replays_its_release(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry (same Idempotency-Key) of a request recorded before a check that now
    refuses it is the recorded release (200), as any retry is, not a 422 for a release
    that may have spent its budget (review); the same body under a new key is the 422."""
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synopsis", "epsilon": 1, "params": {"basis_size": 9}}
    first = request_release(client, curator, dataset_id, body, key="synopsis-9")
    assert first.status_code == 202, first.text
    monkeypatch.setattr(smooth_synopsis_adapter, "MAX_MEASURE_WORK", 500 * 8)  # a new limit
    again = request_release(client, curator, dataset_id, body, key="synopsis-9")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    fresh = request_release(client, curator, dataset_id, body, key="synopsis-9-new")
    assert fresh.status_code == 422, fresh.text
    assert "at most R = 8 for this table" in fresh.json()["error"]["message"]
    other = {**body, "params": {"basis_size": 10}}
    reused = request_release(client, curator, dataset_id, other, key="synopsis-9")
    assert reused.status_code == 422, reused.text  # not this key's request: the check's 422
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == ["reserve"]


def test_a_request_refused_only_at_measure_says_why(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request recorded before a check was added meets it when it is measured, before
    any row is read (refunded). Its message is the request's 422, not "internal error
    (InvalidRequest)" (review)."""
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synopsis", "epsilon": 1, "params": {"basis_size": 9}}
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    monkeypatch.setattr(smooth_synopsis_adapter, "MAX_MEASURE_WORK", 500 * 8)  # a new limit
    run_all(client, release_id)
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "failed", release
    assert "at most R = 8 for this table; lower basis_size" in release["message"], release
    assert [e["kind"] for e in budget(client, curator, dataset_id)["entries"]] == [
        "reserve",
        "refund",
    ]


def test_a_basis_past_the_index_set_limit_is_refused_or_lowered(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's check and preview build the index set: R x d is held to
    MAX_INDEX_SET_ENTRIES from the public numbers. A basis_size past it is a 422 naming the
    largest basis_size for this d, before anything is built or reserved; a default is
    lowered to fit; smooth_synthetic's moments get the same (audit: basis_size 10^6 on
    WDBC's 30 columns took 36 s and 1.9 GB of the API per preview and again per request;
    a 2000-column table's default preview 84.6 s)."""
    from app.mechanisms import basis

    dataset_id, _ = _dataset(client, curator)  # d = 3; the default R is 12 at epsilon 1
    body: dict[str, Any] = {"mechanism": "smooth_synopsis", "epsilon": 1}

    def preview_size(request: dict[str, Any]) -> int:
        url = f"/v1/datasets/{dataset_id}/preview"
        response = client.post(url, headers=curator.headers, json=request)
        assert response.status_code == 200, response.text
        return int(response.json()["resolved"]["basis_size"])

    assert preview_size(body) == 12
    monkeypatch.setattr(basis, "MAX_INDEX_SET_ENTRIES", 3 * 8)
    assert preview_size(body) <= 8
    built: list[int] = []
    total_degree = basis.total_degree
    monkeypatch.setattr(sy, "total_degree", lambda d, R: built.append(R) or total_degree(d, R))
    for request in (
        {**body, "params": {"basis_size": 9}},
        {
            "mechanism": "smooth_synthetic",
            "epsilon": 1,
            "params": {"method": "moments", "basis_size": 9},
        },
    ):
        url = f"/v1/datasets/{dataset_id}/preview"
        for response in (
            client.post(url, headers=curator.headers, json=request),
            request_release(client, curator, dataset_id, request),
        ):
            assert response.status_code == 422, response.text
            message = response.json()["error"]["message"]
            assert "basis_size 9 over 3 columns is an index set of R x d = 27 entries" in message
            assert "at most basis_size = 8 for 3 columns" in message
    assert built == []
    assert preview_size({**body, "params": {"basis_size": 8}}) == 8
    assert budget(client, curator, dataset_id)["entries"] == []
    assert services_of(client).queue.pending() == 0


def test_synopsis_answers_are_bounded_by_queries_times_moments(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every answer expands its query over all R moments: a batch is refused past
    MAX_ANSWER_WORK (queries x R), saying how many fit, and answered in blocks of at most
    ANSWER_BLOCK_ENTRIES coefficients (resource-exhaustion audit: 100 product queries at
    R = 10^6 took 38 s and 4.7 GB of the API process in one block)."""
    dataset_id, _ = _dataset(client, curator)  # the default R is 12 at epsilon 1
    body = {"mechanism": "smooth_synopsis", "epsilon": 1, "params": {"co_spread": False}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    query = {"type": "product", "factors": {"x": {"type": "gaussian", "center": 0.1, "sigma": 3}}}
    url = f"/v1/releases/{release_id}/answers"
    whole = client.post(url, headers=curator.headers, json={"queries": [query] * 4})
    assert whole.status_code == 200, whole.text

    blocks: list[int] = []
    answer_many = Synopsis.answer_many

    def spy(self: Synopsis, queries: Any, **options: Any) -> Any:
        blocks.append(options["block"])
        return answer_many(self, queries, **options)

    monkeypatch.setattr(Synopsis, "answer_many", spy)
    monkeypatch.setattr(smooth_synopsis_adapter, "ANSWER_BLOCK_ENTRIES", 12 * 2)
    for name in ("QUERY_WORK", "FACTOR_WORK", "LENGTH_WORK", "SADDLEPOINT_WORK"):
        monkeypatch.setattr(
            smooth_synopsis_adapter, name, 0
        )  # R a query: test_synopsis_answer_work
    monkeypatch.setattr(smooth_synopsis_adapter, "MAX_ANSWER_WORK", 12 * 4)
    blocked = client.post(url, headers=curator.headers, json={"queries": [query] * 4})
    assert blocked.status_code == 200, blocked.text
    assert blocks == [2]
    for key in ("value", "stderr", "truncation_estimate"):
        assert [a[key] for a in blocked.json()["answers"]] == pytest.approx(
            [a[key] for a in whole.json()["answers"]], rel=1e-9
        )
    refused = client.post(url, headers=curator.headers, json={"queries": [query] * 5})
    assert refused.status_code == 422, refused.text
    # the work is R a query here, which the lower bound read off the JSON already counts
    assert "48 a request; at most about 4 like these fit in one request" in refused.text


def test_synopsis_answer_work_charges_factors_and_expansion_lengths() -> None:
    """An answer's work is its R moments and, beside them, its own cost, each factor's and
    each coefficient of its expansion (and the saddlepoint quantile under Laplace noise):
    charged R alone, 100,000 products of ten narrow Gaussian factors passed at R = 60, 1.6
    hours of work (fuzz audit); the batch a request may hold shrinks by as much."""
    from app.mechanisms import chebyshev
    from app.mechanisms import smooth_synopsis as sy
    from app.mechanisms.queries import Gaussian1D, ProductQuery

    rows = np.random.default_rng(0).uniform(-1, 1, size=(500, 10))
    adapter = smooth_synopsis_adapter
    for delta, saddlepoint in ((1e-6, 0), (0.0, adapter.SADDLEPOINT_WORK)):
        synopsis = sy.measure(rows, 1.0, delta, smoothness=4, co_spread=False)
        min_length = synopsis.index_set.max_degree + 1

        def product(width: float, factors: int) -> ProductQuery:
            return ProductQuery(
                factors=tuple(
                    Gaussian1D(center=0.0, sigma=width) if j < factors else None for j in range(10)
                )
            )

        for width, factors in ((2.0, 1), (0.02, 1), (0.02, 10)):
            query = product(width, factors)
            length = chebyshev.product_length(query, min_length)
            assert length is not None
            expected = (
                synopsis.size
                + adapter.QUERY_WORK
                + saddlepoint
                + adapter.FACTOR_WORK * factors
                + adapter.LENGTH_WORK * length
            )
            assert adapter.answer_work(synopsis, [query, query]) == 2 * expected
        narrow = adapter.answer_work(synopsis, [product(0.02, 10)])
        wide = adapter.answer_work(synopsis, [product(2.0, 1)])
        assert narrow > 50 * synopsis.size  # what R alone charged
        assert narrow > 5 * wide


def test_synopsis_answer_work_charges_pairs_of_kernels_and_names_a_refused_mixture() -> None:
    """An answer's truncation estimate is O(J^2 d L) for J kernels: charged J alone, one
    mixture of 3162 centres (30 s on WDBC) or a 117-byte polynomial in original units that
    expands to 2883 monomials (35 s) fitted in one request. And a mixture too narrow to
    expand is named by its position, as before the work was counted (its refusal names no
    query of its own) (review, helper-35)."""
    from app.core.errors import InvalidRequest
    from app.releases.adapters import smooth_queries
    from app.releases.registry import ColumnInfo, DatasetInfo

    d = 30
    rows = np.random.default_rng(0).uniform(-1, 1, size=(300, d))
    synopsis = sy.measure(rows, 1.0, 1e-6, smoothness=4, co_spread=False)
    columns = tuple(ColumnInfo(f"c{j}", "continuous", 0.0, 10.0) for j in range(d))
    info = DatasetInfo(300, columns)
    adapter = smooth_synopsis_adapter
    mixture = {
        "type": "gaussian_mixture",
        "centers": [[0.0] * d] * 3162,
        "weights": [1.0] * 3162,
        "sigma": 0.5,
    }
    polynomial = {
        "type": "polynomial",
        "space": "original",
        "terms": [{"coefficient": 1.0, "powers": {"c0": 30, "c1": 30, "c2": 2}}],
    }
    for query in (mixture, polynomial):
        parsed = smooth_queries.parse([query], info)
        assert adapter.answer_work(synopsis, parsed) > adapter.MAX_ANSWER_WORK
    wide = {"type": "product", "factors": {"c0": {"type": "gaussian", "center": 5, "sigma": 1}}}
    narrow = {"type": "gaussian_mixture", "centers": [[0.0] * d], "weights": [1.0], "sigma": 1e-4}
    with pytest.raises(InvalidRequest, match=r"^queries\.2: sigma \(0\.0001\) is too small"):
        adapter.SmoothSynopsis().answer(synopsis, info, [wide, wide, narrow, wide])


@pytest.mark.parametrize(
    "params",
    [{"method": "marginals"}, {"method": "tree"}, {"method": "moments", "grid_size": 500}],
)
def test_smooth_synthetic_answers_are_bounded_by_their_work(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch, params: dict[str, Any]
) -> None:
    """A smooth_synthetic answer is computed under the released law and its 20 bootstrap
    laws (marginals, tree) or at every support point (moments), at a cost that grows with
    the queries' kernels and coefficients and the release's cells or points
    (resource-exhaustion audit, on WDBC: a tree answered 10,000 one-factor products in 21 s
    and 100,000 in 224 s and 2.2 GB; 30,000 mixtures of 10 centres took 134 s). A batch
    whose work (answer_work, support_work) exceeds MAX_ANSWER_WORK is refused with a 422
    saying about how many like it fit, before any query is expanded or evaluated; a query
    too large on its own is told how to shrink."""
    from app.releases import registry
    from app.releases.adapters import smooth_synthetic as adapter

    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": 1, "delta": 1e-7, "params": params}
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    run_all(client, release_id)
    query = {"type": "product", "factors": {"x": {"type": "gaussian", "center": 0.1, "sigma": 3}}}

    works: list[int] = []
    lower: list[bool] = []
    check = registry.check_total_work

    def counted(queries: int, work: int, limit: int, **options: Any) -> None:
        works.append(work)
        lower.append(bool(options.get("at_least")))
        check(queries, work, limit, **options)

    computed: list[str] = []
    expand_block, weighted_answer = adapter.expand_block, adapter.weighted_answer

    def expanding(*args: Any, **options: Any) -> Any:
        computed.append("expand")
        return expand_block(*args, **options)

    def evaluating(*args: Any, **options: Any) -> Any:
        computed.append("evaluate")
        return weighted_answer(*args, **options)

    monkeypatch.setattr(registry, "check_total_work", counted)
    monkeypatch.setattr(adapter, "expand_block", expanding)
    monkeypatch.setattr(adapter, "weighted_answer", evaluating)

    def post(count: int) -> Any:
        return client.post(
            f"/v1/releases/{release_id}/answers",
            headers=curator.headers,
            json={"queries": [query] * count},
        )

    sizes = {}
    for count in (1, 4, 5):
        answered = post(count)
        assert answered.status_code == 200, answered.text
        sizes[count] = works[-1]
    one, four, five = sizes[1], sizes[4], sizes[5]
    assert 0 < one < four < five

    monkeypatch.setattr(adapter, "MAX_ANSWER_WORK", four)
    computed.clear()
    at_bound = post(4)
    assert at_bound.status_code == 200, at_bound.text
    assert computed
    computed.clear()
    refused = post(5)
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    # refused by the work counted after the parse, or already by its lower bound read off
    # the JSON (test_a_batch_whose_sizes_prove_it_over_the_work_bound_is_refused_before...)
    refusing, at_least = works[-1], lower[-1]
    assert refusing == five or (at_least and refusing <= five)
    assert message.startswith(
        "5 queries are more than one request may ask of this release: "
        f"{'at least ' if at_least else ''}{refusing:.3g} units of work (about 1 ns each here"
    )
    assert message.endswith(
        f"at most {four:.3g} a request; {'at most about' if at_least else 'about'} 4 like "
        "these fit in one request: split the batch"
    )
    assert computed == []

    monkeypatch.setattr(adapter, "MAX_ANSWER_WORK", one - 1)
    alone = post(1)
    assert alone.status_code == 422, alone.text
    message = alone.json()["error"]["message"]
    assert message.startswith("this query is more than one request may ask of this release")
    assert "; it does not fit on its own: use " in message
    assert computed == []


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        ("smooth_synopsis", {}),
        ("smooth_synthetic", {"method": "marginals"}),
        ("smooth_synthetic", {"method": "tree"}),
        ("smooth_synthetic", {"method": "moments", "grid_size": 500}),
    ],
)
def test_a_batch_whose_sizes_prove_it_over_the_work_bound_is_refused_before_it_is_parsed(
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
    mechanism: str,
    params: dict[str, Any],
) -> None:
    """The work of a smooth answers batch was counted once its queries were parsed, and
    parsing costs more than the count: a 64 MiB body of 30-factor products parsed for about
    20 s before it was refused. A lower bound on the work read off the JSON (queries,
    products' factors, mixtures' centres, polynomials) is checked first: never above the
    work counted after the parse, and a batch it proves over the bound is refused with the
    same 422, saying the work is at least that much, without a query parsed."""
    from app.releases import registry
    from app.releases.adapters import smooth_queries
    from app.releases.adapters import smooth_synthetic as synthetic_adapter

    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": mechanism, "epsilon": 1, "delta": 1e-7, "params": params}
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    run_all(client, release_id)
    gaussian = {"type": "gaussian", "center": 0.1, "sigma": 0.5}
    queries = [
        {"type": "product", "factors": {"x": gaussian, "y": gaussian, "z": gaussian}},
        {"type": "product", "factors": {"y": {"type": "polynomial", "coefficients": [1, 2]}}},
        {
            "type": "gaussian_mixture",
            "centers": [[0, 0, 0], [0.5, 0, 0]],
            "weights": [1, 1],
            "sigma": 0.7,
        },
        {"type": "polynomial", "terms": [{"coefficient": 1, "powers": {"x": 2, "z": 1}}]},
    ] * 3

    checked: list[tuple[int, bool]] = []
    check = registry.check_total_work

    def recorded(queries: int, work: int, limit: int, **options: Any) -> None:
        checked.append((work, bool(options.get("at_least"))))
        check(queries, work, limit, **options)

    parses: list[int] = []
    parse = smooth_queries.parse

    def parsing(batch: Any, info: Any) -> Any:
        parses.append(len(batch))
        return parse(batch, info)

    monkeypatch.setattr(registry, "check_total_work", recorded)
    monkeypatch.setattr(smooth_queries, "parse", parsing)
    url = f"/v1/releases/{release_id}/answers"
    answered = client.post(url, headers=curator.headers, json={"queries": queries})
    assert answered.status_code == 200, answered.text
    (raw, before), (exact, after) = checked
    assert (before, after) == (True, False)
    assert 0 < raw <= exact
    assert parses == [len(queries)]

    adapter = smooth_synopsis_adapter if mechanism == "smooth_synopsis" else synthetic_adapter
    monkeypatch.setattr(adapter, "MAX_ANSWER_WORK", raw - 1)
    checked.clear()
    parses.clear()
    refused = client.post(url, headers=curator.headers, json={"queries": queries})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "invalid_request"
    message = refused.json()["error"]["message"]
    assert message.startswith(
        f"12 queries are more than one request may ask of this release: at least {raw:.3g} "
        "units of work"
    ), message
    assert message.endswith("at most about 11 like these fit in one request: split the batch")
    assert checked == [(raw, True)]
    assert parses == []


def test_the_default_answer_bound_refuses_the_audited_batches() -> None:
    """On WDBC's 30 columns the default MAX_ANSWER_WORK refuses what the audit timed (10,000
    one-factor products on a tree of 93 cells a column, 21 s; 30,000 mixtures of 10
    centres on 4096 bins, 134 s) and admits 1,000 of either kind on the default 6-cell tree
    of WDBC at epsilon 1, and on 64 bins, and the paper-000 protocol's 10^4 mixtures on the
    default marginals release (the service-latency benchmark's request)."""
    from app.mechanisms.chebyshev import separable_layout
    from app.mechanisms.queries import Gaussian1D, GaussianMixture, ProductQuery
    from app.releases.adapters.smooth_synthetic import MAX_ANSWER_WORK, answer_work

    d, rng = 30, np.random.default_rng(3)

    def products(count: int) -> list[object]:
        return [
            ProductQuery(tuple(Gaussian1D(0.1, 0.3) if i == q % d else None for i in range(d)))
            for q in range(count)
        ]

    def mixtures(count: int) -> list[object]:
        return [
            GaussianMixture(rng.uniform(-1, 1, (10, d)), np.full(10, 0.1), 1.0)
            for _ in range(count)
        ]

    def work(queries: list[object], cells: int, groups: int | None) -> int:
        return answer_work(separable_layout(queries, d), d=d, cells=cells, groups=groups)

    assert work(products(10_000), 93, 93) > MAX_ANSWER_WORK
    assert work(mixtures(30_000), 4096, None) > MAX_ANSWER_WORK
    for queries in (products(1000), mixtures(1000)):
        assert work(queries, 6, 6) <= MAX_ANSWER_WORK
        assert work(queries, 64, None) <= MAX_ANSWER_WORK
    # paper 000's protocol, 10^4 mixtures of 10 centres of width 4, fits one request on
    # the default marginals release of WDBC at epsilon 0.1 (2 cells a column; 2.6 s)
    protocol = [
        GaussianMixture(rng.uniform(-1, 1, (10, d)), np.full(10, 0.1), 4.0) for _ in range(10_000)
    ]
    assert work(protocol, 2, None) <= MAX_ANSWER_WORK


def test_answer_work_is_its_documented_sum() -> None:
    """answer_work counts the cells' Chebyshev means once for the released law and its
    bootstrap replicates (``answers`` computes them once), then each law's contraction
    (marginals) or, on a tree, every coefficient's value on every cell once and each law's
    messages: a narrow query on a release of 4096 cells fits the bound, which it would not
    if the means were counted once a law."""
    from app.mechanisms import bootstrap
    from app.mechanisms.chebyshev import separable_layout
    from app.mechanisms.queries import GaussianMixture
    from app.releases.adapters import smooth_synthetic as adapter

    d, cells, groups, laws = 2, 4096, 6, 1 + bootstrap.REPLICATES
    (block,) = separable_layout([GaussianMixture(np.zeros((1, d)), np.ones(1), 0.003)], d)
    assert block.shape is not None
    rows, kernels, length = block.shape
    entries = rows * kernels * d * length
    common = adapter.QUERY_WORK + adapter.MIXTURE_EXPANSION_WORK * entries
    means = adapter.CELL_MEAN_WORK * cells * length
    marginals = adapter.answer_work([block], d=d, cells=cells, groups=None)
    assert marginals == common + means + laws * 3 * entries
    assert marginals <= adapter.MAX_ANSWER_WORK < laws * means
    messages = laws * rows * kernels * d * (cells * (groups + 48) // 4 + 50)
    assert adapter.answer_work([block], d=d, cells=cells, groups=groups) == (
        common + means + entries * (cells // 4 + 20) + messages
    )


def test_moments_that_would_measure_too_long_are_refused(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """smooth_synthetic's moment method measures as a synopsis does, every row once per
    moment (6.7 ns a row-moment at R = 10^4): its R is held to the same work limit at the
    request, before anything is reserved (resource-exhaustion audit: basis_size 10^5,
    accepted with a small grid, would have measured 10^6 rows for 1.5 hours)."""
    dataset_id, _ = _dataset(client, curator)  # n = 500
    monkeypatch.setattr(smooth_synopsis_adapter, "MAX_MEASURE_WORK", 500 * 8)
    body = {"mechanism": "smooth_synthetic", "epsilon": 1, "params": {"method": "moments"}}
    fits = {**body, "params": {"method": "moments", "basis_size": 8, "grid_size": 100}}
    assert request_release(client, curator, dataset_id, fits).status_code == 202
    response = request_release(
        client, curator, dataset_id, {**body, "params": {**fits["params"], "basis_size": 9}}
    )
    assert response.status_code == 422, response.text
    assert "R = 9 moments over 500 rows" in response.json()["error"]["message"]
    assert "at most R = 8 for this table" in response.json()["error"]["message"]
    assert len(budget(client, curator, dataset_id)["entries"]) == 1  # the first one's
    assert services_of(client).queue.pending() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"mechanism": "smooth_synthetic"},
        {"mechanism": "smooth_synthetic", "params": {"method": "moments"}},
        {"mechanism": "smooth_synopsis"},
    ],
)
@pytest.mark.parametrize("delta", [0.49, 0.9, 0.999999999])
def test_a_large_delta_is_previewed_not_a_server_error(
    client: TestClient, curator: Caller, body: dict[str, Any], delta: float
) -> None:
    """With delta near 1/2 or above, OpenDP's zCDP conversion reaches epsilon = 0 at a
    finite noise scale; the scale search once took log(0) there and answered 500."""
    dataset_id, _ = _dataset(client, curator, n=100)
    response = client.post(
        f"/v1/datasets/{dataset_id}/preview",
        headers=curator.headers,
        json={**body, "epsilon": 1.0, "delta": delta},
    )
    assert response.status_code == 200, response.text
    assert response.json()["fits_budget"] is False


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    # (1e6, delta > 0) previews without error too but takes ~25 s (the Gaussian maps cannot
    # reach such an epsilon; rho_budget's overflow is tested in tests/mechanisms/test_noise.py)
    [(1e-12, 0.0), (1e-12, 1e-18), (1e-12, 0.999), (1e6, 0.0)],
)
def test_budget_corners_preview_without_a_server_error(
    client: TestClient, curator: Caller, epsilon: float, delta: float
) -> None:
    """The corners of the accepted (epsilon, delta) range: every smooth method previews
    (200) or refuses with a message (422); none is a 500 (an audit found brentq and OpenDP
    overflow errors at such corners). Outside the range: 422 at once (a subnormal delta
    once hung the calibration while the request held its transaction)."""
    dataset_id, _ = _dataset(client, curator, n=100)
    bodies = [
        {"mechanism": "smooth_synthetic", "params": {"method": method}}
        for method in ("tree", "marginals", "moments")
    ] + [{"mechanism": "smooth_synopsis"}]
    for body in bodies:
        if delta == 0.0 and body.get("params") == {"method": "tree"}:
            continue  # the tree needs delta > 0 (its own 422, tested elsewhere)
        response = client.post(
            f"/v1/datasets/{dataset_id}/preview",
            headers=curator.headers,
            json={**body, "epsilon": epsilon, "delta": delta},
        )
        assert response.status_code in (200, 422), (body, response.text)
    for epsilon_, delta_, fragment in (
        (1e-13, 0.0, "must be at least 1e-12"),
        (1.0, 1e-310, "must be 0 or at least 1e-18"),
    ):
        refused = client.post(
            f"/v1/datasets/{dataset_id}/preview",
            headers=curator.headers,
            json={"mechanism": "smooth_synopsis", "epsilon": epsilon_, "delta": delta_},
        )
        assert refused.status_code == 422
        assert fragment in refused.json()["error"]["message"]


def test_resynthesis_gets_the_size_check_of_a_request(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-synthesis that a new request would be refused (points and rows that cannot fit
    in memory; the limit is lowered here so that 3 columns reach it) is refused at once,
    and the succeeded release stays succeeded with its artifacts (an audit saw it turn
    into a failed release whose downloads answered 409)."""
    from app.mechanisms import smooth_synthetic as ss

    dataset_id, _ = _dataset(client, curator, n=200)
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "params": {"method": "marginals"}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    monkeypatch.setattr(ss, "DEFAULT_MAX_BYTES", 8 * 3 * 3000)
    too_big = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"grid_size": 2000, "sample_size": 2000}},
    )
    assert too_big.status_code == 422, too_big.text
    assert "need more than" in too_big.json()["error"]["message"]
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded"
    assert (
        client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers).status_code
        == 200
    )


def test_moments_resynthesis_gets_the_lp_size_check(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The moments LP's memory check runs on a re-synthesis's merged parameters (the limit
    is lowered so that 3 columns reach it); the succeeded release keeps its artifacts."""
    from app.mechanisms import smooth_synthetic as ss

    dataset_id, _ = _dataset(client, curator, n=200)
    body = {
        "mechanism": "smooth_synthetic",
        "epsilon": 1.0,
        "params": {"method": "moments", "grid_size": 500, "sample_size": 200},
    }
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    monkeypatch.setattr(ss, "DEFAULT_MAX_BYTES", 2 << 20)
    too_big = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"grid_size": 5000}},
    )
    assert too_big.status_code == 422, too_big.text
    assert "C = 5000 candidates needs about" in too_big.json()["error"]["message"]
    assert "more than 2.0 MiB" in too_big.json()["error"]["message"]
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded"
    fits = client.post(
        f"/v1/releases/{release_id}/resynthesize",
        headers=curator.headers,
        json={"params": {"grid_size": 1000}},
    )
    assert fits.status_code == 202, fits.text


@pytest.mark.parametrize("method", ["marginals", "tree", "moments", "synopsis"])
def test_an_answer_that_overflows_is_refused_with_its_position(
    client: TestClient, curator: Caller, method: str
) -> None:
    """Coefficients near the float limit overflow the answer: it used to come back as
    ``"value": null`` (200) from a synthetic release and as a 422 without the query's
    position ("truncation bounds must be non-negative") from a synopsis."""
    dataset_id, _ = _dataset(client, curator)
    body: dict[str, Any] = (
        {"mechanism": "smooth_synopsis", "epsilon": 1.0, "params": {"smoothness": 4}}
        if method == "synopsis"
        else {
            "mechanism": "smooth_synthetic",
            "epsilon": 1.0,
            "delta": 1e-6 if method == "tree" else 0.0,
            "params": {"method": method},
        }
    )
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    fine = {"type": "product", "factors": {"x": {"type": "chebyshev", "coefficients": [0.5, 0.1]}}}
    # the value itself is past the float range (1e400 times 1 + E T_1): coefficients of
    # 1e308 alone gave a finite value of about 1.3e308, refused only while the bootstrap
    # standard error overflowed in squaring
    huge = {
        "type": "product",
        "factors": {"x": {"type": "chebyshev", "coefficients": [1e200, 1e200]}},
        "weight": 1e200,
    }
    response = client.post(
        f"/v1/releases/{release_id}/answers",
        headers=curator.headers,
        json={"queries": [fine, huge]},
    )
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("queries.1: "), message
    assert "finite number" in message, message
    assert len(_answers(client, curator, release_id, [fine])) == 1


def test_a_synopsis_answer_whose_interval_overflows_is_refused_with_its_position(
    client: TestClient, curator: Caller
) -> None:
    """Chebyshev coefficients of +-1e308 give a finite value and stderr but an interval
    past the float range: it came back as ``"interval": [null, null]`` (and
    ``"worst_case_interval": [null, null]``, ``"noise_halfwidth": null``) in a 200, where
    the schema promises numbers; only the value and stderr were checked."""
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synopsis", "epsilon": 1.0, "params": {"smoothness": 4}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    fine = {"type": "product", "factors": {"x": {"type": "chebyshev", "coefficients": [0.5, 0.1]}}}
    wide = {
        "type": "product",
        "factors": {"x": {"type": "chebyshev", "coefficients": [1e308, -1e308, 1e308]}},
    }
    response = client.post(
        f"/v1/releases/{release_id}/answers",
        headers=curator.headers,
        json={"queries": [fine, wide]},
    )
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("queries.1: its "), message
    assert "finite number" in message, message
    (answer,) = _answers(client, curator, release_id, [fine])
    assert all(isinstance(end, float) for end in answer["interval"]), answer


@pytest.mark.parametrize(
    "query",
    [
        {"type": "gaussian_mixture", "centers": [[1e308, 0.5]], "weights": [1.0], "sigma": 1.0},
        {"type": "product", "factors": {"b": {"type": "gaussian", "center": -1e308, "sigma": 1}}},
    ],
)
def test_a_centre_whose_rescaling_overflows_is_named_as_such(query: dict[str, Any]) -> None:
    """A finite centre in original units far outside the bounds (1e308 on [0, 1])
    rescales to an infinite normalised coordinate: the refusal said "center (inf) must be
    finite" (a value the client never sent), or the mixture answered from it."""
    from app.core.errors import InvalidRequest
    from app.releases.adapters.smooth_queries import parse
    from app.releases.registry import ColumnInfo, DatasetInfo

    info = DatasetInfo(
        n_rows=10,
        columns=(
            ColumnInfo("a", "continuous", 0.0, 1.0),
            ColumnInfo("b", "continuous", 0.0, 1.0),
        ),
    )
    with pytest.raises(InvalidRequest) as refused:
        parse([{**query, "space": "original"}], info)
    assert refused.value.message == (
        "queries.0: a centre lies too far outside the declared bounds to be rescaled to "
        "[-1, 1] (its normalised coordinate overflows a float)"
    )
    assert len(parse([{**query, "space": "normalized"}], info)) == 1  # far, but finite


def test_a_polynomial_whose_rescaling_overflows_is_named_as_such() -> None:
    """``x^2`` on bounds of +-1e307 is ``(1e307 x')^2`` in normalised units: its finite
    coefficient overflows when rescaled. The refusal said "polynomial coefficients must be
    finite", of coefficients the client sent finite."""
    from app.core.errors import InvalidRequest
    from app.releases.adapters.smooth_queries import parse
    from app.releases.registry import ColumnInfo, DatasetInfo

    info = DatasetInfo(
        n_rows=10,
        columns=(
            ColumnInfo("x", "continuous", -1e307, 1e307),
            ColumnInfo("y", "continuous", 0.0, 1.0),
        ),
    )
    square = {"type": "polynomial", "terms": [{"coefficient": 1.0, "powers": {"x": 2}}]}
    with pytest.raises(InvalidRequest) as refused:
        parse([{**square, "space": "original"}], info)
    assert refused.value.message == (
        "queries.0: this polynomial's coefficients overflow a float when rescaled to [-1, 1] "
        "(powers of its columns' half-widths); scale it down or write it in space "
        "'normalized'"
    )
    assert len(parse([{**square, "space": "normalized"}], info)) == 1
    linear = {"type": "polynomial", "terms": [{"coefficient": 1.0, "powers": {"x": 1}}]}
    assert len(parse([{**linear, "space": "original"}], info)) == 1  # 1e307 x' is finite
    # in normalised units only a monomial named twice can overflow: no advice to use them
    twice = [{"coefficient": 1e308, "powers": {"y": 1}}] * 2
    with pytest.raises(InvalidRequest) as summed:
        parse([{"type": "polynomial", "terms": twice}], info)
    assert summed.value.message == (
        "queries.0: this polynomial's coefficients overflow a float; scale it down"
    )


@pytest.mark.parametrize(
    ("refused", "expected"), [({5}, "queries.5: no"), ({0, 7}, "queries.0: no")]
)
def test_a_refused_batch_names_its_first_refused_query(refused: set[int], expected: str) -> None:
    from app.mechanisms.errors import MechanismError
    from app.releases.adapters.smooth_queries import refusal

    calls: list[int] = []

    def answer(batch: Sequence[int]) -> None:
        calls.append(len(batch))
        if refused & set(batch):
            raise MechanismError("no")

    error = refusal(MechanismError("no"), list(range(9)), answer)
    assert error.message == expected
    assert sum(calls) <= 2 * 9  # bisection: about the batch's work again, not 9 batches

    def batch_level(batch: Sequence[int]) -> None:
        if len(batch) == 9:
            raise MechanismError("the batch as a whole")

    assert refusal(MechanismError("too big"), list(range(9)), batch_level).message == (
        "queries: too big"
    )


def test_largest_basis_size_is_the_largest_within_the_measure_work_limit() -> None:
    """measure_work is n R weighted by max(1, R / MEASURE_WORK_SIZE), and
    largest_basis_size(n) the largest R whose work is within MAX_MEASURE_WORK: R + 1 is
    not, on either side of R = MEASURE_WORK_SIZE."""
    work = smooth_synopsis_adapter.measure_work
    assert work(10**6, 100) == 1e8  # at most MEASURE_WORK_SIZE moments: n R
    assert work(10**6, 10_000) == 1e10
    assert work(10**5, 10**5) == 1e11  # beyond it weighted by R / 10^4
    limit = smooth_synopsis_adapter.MAX_MEASURE_WORK
    for n in (1, 7, 500, 10**4, 99_999, 10**5, 123_457, 10**6, 9_999_999, 10**7, 10**7 + 1):
        size = smooth_synopsis_adapter.largest_basis_size(n)
        assert work(n, size) <= limit < work(n, size + 1), n


def test_synopsis_work_bounds_at_their_edges(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A basis_size whose measure is exactly at the work limit is accepted; a table on
    which not even one moment fits is refused as too large; and answers are computed in
    blocks of at least one query even when R exceeds ANSWER_BLOCK_ENTRIES."""
    dataset_id, _ = _dataset(client, curator)  # n = 500
    monkeypatch.setattr(smooth_synopsis_adapter, "MAX_MEASURE_WORK", 500 * 8)
    body: dict[str, Any] = {"mechanism": "smooth_synopsis", "epsilon": 1}
    at_limit = request_release(client, curator, dataset_id, {**body, "params": {"basis_size": 8}})
    assert at_limit.status_code == 202, at_limit.text
    monkeypatch.setattr(smooth_synopsis_adapter, "MAX_MEASURE_WORK", 499)
    too_large = request_release(client, curator, dataset_id, body)
    assert too_large.status_code == 422, too_large.text
    assert "the table is too large for smooth_synopsis" in too_large.json()["error"]["message"]
    monkeypatch.undo()

    release_id = request_release(
        client, curator, dataset_id, {**body, "params": {"co_spread": False}}
    ).json()["id"]
    run_all(client, release_id)
    query = {"type": "product", "factors": {"x": {"type": "gaussian", "center": 0.1, "sigma": 3}}}
    url = f"/v1/releases/{release_id}/answers"
    whole = client.post(url, headers=curator.headers, json={"queries": [query] * 3})
    assert whole.status_code == 200, whole.text
    monkeypatch.setattr(smooth_synopsis_adapter, "ANSWER_BLOCK_ENTRIES", 5)  # R = 12
    one_by_one = client.post(url, headers=curator.headers, json={"queries": [query] * 3})
    assert one_by_one.status_code == 200, one_by_one.text
    assert [a["value"] for a in one_by_one.json()["answers"]] == pytest.approx(
        [a["value"] for a in whole.json()["answers"]], rel=1e-9
    )


def test_a_tree_measure_publishes_progress_after_reading(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The measure stage's progress was 0.99 x rows read over stored rows: the tree's first
    read took it to 0.99, where it stood through the pair counts and the selection. The
    read now fills the tree's share (TREE_READ_SHARE) and the tree's later steps report
    the rest, increasing to 0.99 (never more, never back)."""
    from app.releases import stages
    from app.releases.adapters.smooth_synthetic import TREE_READ_SHARE

    seen = published_progress(monkeypatch)
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": 2.0, "delta": 1e-6}
    body["params"] = {"method": "tree"}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    stages.run_measure(services_of(client), uuid.UUID(release_id))
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "synthesizing"
    read_top = stages.MEASURED_PROGRESS * TREE_READ_SHARE
    assert seen[0] == pytest.approx(read_top)  # the 500 rows are one batch
    assert all(a <= b for a, b in itertools.pairwise(seen)), seen
    beyond = [value for value in seen if value > read_top]
    assert len(beyond) >= 3  # the pair counts, 2 selection rounds (3 columns), the end
    assert all(a < b for a, b in itertools.pairwise(beyond)), beyond
    assert seen[-1] == stages.MEASURED_PROGRESS


def _small_moments_release(client: TestClient, curator: Caller) -> str:
    """A succeeded moments release of :func:`_dataset` (its answers load support files)."""
    dataset_id, _ = _dataset(client, curator)
    body = {
        "mechanism": "smooth_synthetic",
        "epsilon": 1.0,
        "params": {"method": "moments", "grid_size": 200, "sample_size": 20},
    }
    release_id = str(request_release(client, curator, dataset_id, body).json()["id"])
    run_all(client, release_id)
    return release_id


def _two_publishes(client: TestClient, curator: Caller, release_id: str) -> None:
    """Re-synthesise the release twice, to the end: its version before them is pruned."""
    for sample_size in (30, 40):
        again = client.post(
            f"/v1/releases/{release_id}/resynthesize",
            headers=curator.headers,
            json={"params": {"sample_size": sample_size}},
        )
        assert again.status_code == 202, again.text
        run_all(client, release_id)


def test_an_answer_whose_version_two_publishes_pruned_reads_the_release_again(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer reads the published version, then loads its files (a moments release's
    weighted support). Two publishes in between prune that version (a publish keeps only
    the version it replaces): the load's missing file was a 422 "this release's support is
    missing; re-synthesise it" for a release whose newest version is on disk. The answer
    now reads the release again and answers from the newest version; a version whose
    files stay missing is still refused (422) once LOAD_ATTEMPTS reads found none."""
    from app.answers import service as answers_service
    from app.releases.adapters.smooth_synthetic import SmoothSynthetic

    release_id = _small_moments_release(client, curator)
    load = SmoothSynthetic.load
    versions: list[str] = []

    def two_publishes_first(self: Any, payload: Any, info: Any, artifacts: Path) -> Any:
        versions.append(artifacts.name)
        if len(versions) == 1:
            _two_publishes(client, curator, release_id)
            assert not artifacts.exists()
        return load(self, payload, info, artifacts)

    monkeypatch.setattr(SmoothSynthetic, "load", two_publishes_first)
    query = {"type": "product", "factors": {"x": {"type": "gaussian", "center": 0.1, "sigma": 3}}}
    (answer,) = _answers(client, curator, release_id, [query])
    assert math.isfinite(answer["value"])
    assert versions == ["v0", "v2"]

    monkeypatch.setattr(answers_service, "_cache", answers_service._LoadedReleases(4))

    def always_missing(self: Any, payload: Any, info: Any, artifacts: Path) -> Any:
        versions.append(artifacts.name)
        raise FileNotFoundError(artifacts / "weights.npy")

    monkeypatch.setattr(SmoothSynthetic, "load", always_missing)
    refused = client.post(
        f"/v1/releases/{release_id}/answers", headers=curator.headers, json={"queries": [query]}
    )
    assert refused.status_code == 422, refused.text
    assert "missing on disk; re-synthesise it" in refused.json()["error"]["message"]
    assert versions[2:] == ["v2"] * answers_service.LOAD_ATTEMPTS


def test_an_answer_whose_version_is_pruned_while_it_loads_reads_the_release_again(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two publishes while a moments release's support loads, after its points and weights
    were read and before its bootstrap replicates: the replicates file was taken as absent
    (no standard error on the answers), with nothing to say so. The load now finds its
    version gone, and the answer reads the release again: answered from the newest
    version, with its standard error."""
    from app.releases.adapters import smooth_synthetic as adapter

    release_id = _small_moments_release(client, curator)
    replicates = adapter._load_support_replicates
    versions: list[str] = []

    def two_publishes_meanwhile(artifacts: Path, d: int) -> Any:
        versions.append(artifacts.name)
        if len(versions) == 1:
            _two_publishes(client, curator, release_id)
            assert not artifacts.exists()
        return replicates(artifacts, d)

    monkeypatch.setattr(adapter, "_load_support_replicates", two_publishes_meanwhile)
    query = {"type": "product", "factors": {"x": {"type": "gaussian", "center": 0.1, "sigma": 3}}}
    (answer,) = _answers(client, curator, release_id, [query])
    assert versions == ["v0", "v2"]
    assert answer["stderr"] is not None, answer
    assert math.isfinite(answer["stderr"]), answer


def test_a_cached_release_is_measured_again_after_each_answer(
    client: TestClient, curator: Caller
) -> None:
    """The answer cache measured a decoded release once, after its first answer. A later
    answer of another kind fills tables the first did not (a Gaussian query's parent chain
    over the synopsis's index set: 6.4 MB at R = 2 10^5, d = 30, after a polynomial query),
    which then stayed uncounted against CURATOR_ANSWER_CACHE_BYTES (review). Every answer
    now measures it again."""
    from app.answers.service import _cache

    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synopsis", "epsilon": 1.0, "params": {"basis_size": 2000}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    key = (uuid.UUID(release_id), 0)
    polynomial = {
        "type": "polynomial",
        "terms": [{"coefficient": 1.0, "powers": {"x": 1, "y": 1}}],
    }
    gaussian = {
        "type": "gaussian_mixture",
        "centers": [[0.1, 0.2, -0.1]],
        "weights": [1.0],
        "sigma": 2.0,
    }
    _cache.clear()
    _answers(client, curator, release_id, [polynomial])
    synopsis = _cache.get(key)
    assert "_parent_chain" not in vars(synopsis.index_set)
    before = _cache.nbytes
    _answers(client, curator, release_id, [gaussian])
    assert _cache.get(key) is synopsis
    assert "_parent_chain" in vars(synopsis.index_set)
    chain = sum(a.nbytes for level in synopsis.index_set.parent_chain for a in level)
    assert _cache.nbytes >= before + chain
    _cache.clear()


def test_a_synopsis_measure_publishes_progress_through_its_moments(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synopsis sums its moments as it reads, a block of ``2^18 / R`` rows at a time; the
    read of a table of one batch took the published progress to 0.99 before any of that
    work (25 s at R = 10^5 in the concurrency audit, with no cancel noticed). The blocks
    now report it: here R = 2000 over 500 rows is 4 blocks of 131 rows, then the
    co-spread if it applies, up to 0.99."""
    from app.releases import stages

    seen = published_progress(monkeypatch)
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synopsis", "epsilon": 1.0, "params": {"basis_size": 2000}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    stages.run_measure(services_of(client), uuid.UUID(release_id))
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "synthesizing", release
    co_spread = release["resolved"]["co_spread"]
    top = stages.MEASURED_PROGRESS * (sy.MOMENTS_PROGRESS if co_spread else 1.0)
    blocks = [top * rows / 500 for rows in (131, 262, 393, 500)]
    # the read of the one batch adds nothing (the synopsis's read share is 0)
    assert seen[0] == 0.0
    assert seen[1:5] == pytest.approx(blocks), seen
    assert seen[5:] == [stages.MEASURED_PROGRESS] * len(seen[5:]), seen


def test_a_cancel_during_the_tree_selection_stops_it(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel seen after the rows were read, while the tree selects its edges, stops the
    selection at its next round (the progress call after it raises): the release is
    cancelled with its budget spent (the rows were read) and nothing stored. Before, the
    selection, and the rest of the measure, ran to the end (minutes at d in the hundreds)
    and the cancel was found only when the measurement was stored."""
    from app.mechanisms import noise
    from app.releases import stages

    services = services_of(client)
    monkeypatch.setattr(services.settings, "lease_seconds", 0.4)  # a beat every 0.1 s
    seen = heartbeat_sees_the_cancel(monkeypatch)
    dataset_id, _ = _dataset(client, curator)
    body = {"mechanism": "smooth_synthetic", "epsilon": 2.0, "delta": 1e-6}
    body["params"] = {"method": "tree"}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    rounds = {"n": 0}
    noisy_max = noise.noisy_max

    def cancelled_in_the_first_round(scores: Any, scale: float) -> int:
        rounds["n"] += 1
        if rounds["n"] == 1:
            response = client.delete(f"/v1/releases/{release_id}", headers=curator.headers)
            assert response.json()["status"] == "measuring"
            assert seen.wait(timeout=30), "the heartbeat did not see the cancel"
        return noisy_max(scores, scale)

    monkeypatch.setattr(noise, "noisy_max", cancelled_in_the_first_round)
    stages.run_measure(services, uuid.UUID(release_id))
    assert rounds["n"] == 1  # of the 2 rounds over 3 columns
    final = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert final["status"] == "cancelled"
    assert final["message"] == (
        "cancelled while measuring; the data may have been read, so the budget stays spent"
    )
    assert final["measured_at"] is None
    entries = budget(client, curator, dataset_id)["entries"]
    assert [e["kind"] for e in entries if e["release_id"] == release_id] == ["reserve", "commit"]


@pytest.mark.parametrize(
    ("body", "planner"),
    [
        ({"mechanism": "smooth_synopsis", "epsilon": 1.0}, "synopsis"),
        (
            {
                "mechanism": "smooth_synthetic",
                "epsilon": 1.0,
                "delta": 1e-7,
                "params": {"method": "tree"},
            },
            "tree",
        ),
    ],
)
def test_a_smooth_request_plans_its_mechanism_once(
    client: TestClient,
    curator: Caller,
    monkeypatch: pytest.MonkeyPatch,
    body: dict[str, Any],
    planner: str,
) -> None:
    """A smooth preview or release request made its plan (the synopsis's basis choice,
    the tree's OpenDP searches) in the check and again in the preview; the check's plan is
    now the preview's, passed along: one plan a request."""
    from app.mechanisms import marginal_tree
    from app.releases.adapters import smooth_synthetic as smooth_synthetic_adapter

    dataset_id, _ = _dataset(client, curator)
    calls: list[str] = []
    if planner == "synopsis":
        module: Any = smooth_synopsis_adapter.sy
        real = module.plan
    else:
        module = smooth_synthetic_adapter.marginal_tree
        real = marginal_tree.plan

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(planner)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "plan", counted)
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    assert calls == [planner]
    calls.clear()
    created = client.post(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers, json=body)
    assert created.status_code == 202, created.text
    assert calls == [planner]
