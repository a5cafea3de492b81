"""Hostile or extreme inputs that an audit turned into 500s: each is now a 4xx with a
message (or, for the graph_cuts preview, an answer), and nothing is written."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

import tests.releases.fake_mechanism  # noqa: F401 - registers test_means
from app.core.types import Integer
from app.datasets.schemas import MAX_COLUMNS
from tests.conftest import Caller
from tests.datasets.helpers import SCHEMA, csv_bytes, upload
from tests.datasets.test_graphs import upload_graph
from tests.releases.helpers import budget as budget_of
from tests.releases.helpers import dataset, request_release, run_all

NAN, INF = float("nan"), float("inf")


def _smooth_release(client: TestClient, curator: Caller, dataset_id: str) -> str:
    """A finished ``smooth_synthetic`` (marginals) release of ``dataset_id`` at epsilon 0.5."""
    release_id: str = request_release(
        client,
        curator,
        dataset_id,
        {"mechanism": "smooth_synthetic", "epsilon": 0.5, "params": {"method": "marginals"}},
    ).json()["id"]
    run_all(client, release_id)
    return release_id


def test_a_deeply_nested_schema_is_a_422(client: TestClient, curator: Caller) -> None:
    deep = '{"name":' + "[" * 100_000 + "]" * 100_000 + "}"
    response = upload(client, curator, csv_bytes(), deep)
    assert response.status_code == 422, response.text
    assert "nested too deeply" in response.json()["error"]["message"]
    assert client.get("/v1/datasets", headers=curator.headers).json() == []


def test_huge_table_values_and_tiny_widths_are_422(client: TestClient, curator: Caller) -> None:
    dataset_id = dataset(client, curator, epsilon=5.0)
    rr = request_release(
        client,
        curator,
        dataset_id,
        {"mechanism": "randomized_response", "epsilon": 1.0, "columns": ["blood"]},
    ).json()["id"]
    run_all(client, rr)
    smooth = _smooth_release(client, curator, dataset_id)
    for release_id, query, message in (
        (  # squares overflowed
            rr,
            {"type": "table", "values": [1e155] + [0.0] * 3},
            "queries.0.table.values.0: must lie in [-1e+100, 1e+100]",
        ),
        (
            rr,
            {"type": "table", "values": [0.0, NAN, 0.0, 0.0]},
            "values.1: Input should be a finite",
        ),
        (
            rr,
            {"type": "table", "values": [0.0, 0.0, -INF, 0.0]},
            "values.2: Input should be a finite",
        ),
        (
            smooth,
            {"type": "gaussian_mixture", "centers": [[0, 0]], "weights": [1], "sigma": 1e-300},
            "queries.0: a Gaussian width is below 1e-12",
        ),
    ):
        response = client.post(  # json.dumps writes NaN and -Infinity (Python's json reads them)
            f"/v1/releases/{release_id}/answers",
            headers={**curator.headers, "Content-Type": "application/json"},
            content=json.dumps({"queries": [query]}),
        )
        assert response.status_code == 422, response.text
        assert message in response.json()["error"]["message"], response.text
    edge = {"type": "table", "values": [1e100, -1e100, 0.0, 0.0]}  # the range is closed
    accepted = client.post(
        f"/v1/releases/{rr}/answers", headers=curator.headers, json={"queries": [edge]}
    )
    assert accepted.status_code == 200, accepted.text


def test_graph_cuts_preview_at_a_large_epsilon(client: TestClient, curator: Caller) -> None:
    graph = upload_graph(
        client,
        curator,
        b"0 1\n1 2\n",
        {"name": "g", "kind": "graph", "vertices": 4, "budget": {"epsilon": 1000}},
    ).json()["id"]
    response = client.post(
        f"/v1/datasets/{graph}/preview",
        headers=curator.headers,
        json={"mechanism": "graph_cuts", "epsilon": 800},  # e^800 overflowed
    )
    assert response.status_code == 200, response.text
    assert response.json()["resolved"]["flip_probability"] == 0.0


def test_randomized_response_over_many_columns_is_a_422(
    client: TestClient, curator: Caller
) -> None:
    """A domain beyond a float (1100 continuous columns of 2 cells each, or 1000 of 2^16)
    is refused with its size as a power of two; formatting it with ``{:.3g}`` raised
    OverflowError, a 500."""
    names = [f"x{j}" for j in range(1100)]
    columns = [{"name": name, "kind": "continuous", "lower": 0, "upper": 1} for name in names]
    schema = {
        "name": "wide",
        "columns": [*columns, {"name": "blood", "kind": "categorical", "categories": [1, 2, 3]}],
        "budget": {"epsilon": 1, "delta": 0},
    }
    header, row = ",".join(names) + ",blood", ",".join(["0.5"] * 1100) + ",1"
    uploaded = upload(client, curator, (f"{header}\n" + f"{row}\n" * 4).encode(), schema)
    assert uploaded.status_code == 201, uploaded.text
    dataset_id = uploaded.json()["id"]
    body = {"mechanism": "randomized_response", "epsilon": 0.5, "columns": names}
    for request, size in (
        (body, "2^1100"),  # 4 rows: 1 bit, 2 cells per column
        ({**body, "columns": names[:1000], "params": {"bits": 16}}, "2^16000"),
        ({**body, "columns": None}, "about 2^1101.6"),  # with the 3 categories
    ):
        for path in ("preview", "releases"):
            refused = client.post(
                f"/v1/datasets/{dataset_id}/{path}", headers=curator.headers, json=request
            )
            assert refused.status_code == 422, refused.text
            message = refused.json()["error"]["message"]
            assert f"has {size} cells; at most 2^62" in message, message
    assert budget_of(client, curator, dataset_id)["entries"] == []


def test_audit_cursor_and_user_names_are_bounded(client: TestClient, admin: Caller) -> None:
    assert (
        client.get("/v1/audit?before_id=9223372036854775808", headers=admin.headers).status_code
        == 422
    )
    # C0 and C1 controls, a bidirectional override, a line separator (app.core.types)
    for name in ("bad\x00name", "\x1b[31mred", "a\x85b", "\u202eevil", "a\u2028b", "a\u200bb"):
        response = client.post(
            "/v1/users", headers=admin.headers, json={"name": name, "role": "analyst"}
        )
        assert response.status_code == 422, response.text
        assert "holds a control character (U+" in response.text
    # other format characters are part of ordinary text: an emoji sequence's joiner, a
    # flag's tag characters (Scotland), a right-to-left mark, a soft hyphen
    scotland = "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"
    ordinary = ("Zoë O'Neil", "Ada \U0001f469\u200d\U0001f4bb", f"ana {scotland}")
    for name in (*ordinary, "\u05d3\u05e0\u05d4\u200f (QA)", "Zimmer\u00admann"):
        response = client.post(
            "/v1/users", headers=admin.headers, json={"name": name, "role": "analyst"}
        )
        assert response.status_code == 201, response.text


def test_privacy_parameters_are_json_numbers(client: TestClient, curator: Caller) -> None:
    """``true`` and ``"1"`` are not numbers: in pydantic's lax mode both were read as 1, and
    a request sent with a stray boolean would have spent epsilon 1."""
    for budget in ({"epsilon": True}, {"epsilon": "1"}, {"epsilon": 1, "delta": False}):
        refused = upload(client, curator, csv_bytes(), {**SCHEMA, "budget": budget})
        assert refused.status_code == 422, (budget, refused.text)
        assert "budget" in refused.json()["error"]["message"]
    assert client.get("/v1/datasets", headers=curator.headers).json() == []
    dataset_id = dataset(client, curator)
    for body in (
        {"mechanism": "test_means", "epsilon": True},
        {"mechanism": "test_means", "epsilon": "0.2"},
        {"mechanism": "test_means", "epsilon": 0.2, "delta": "0"},
    ):
        refused = request_release(client, curator, dataset_id, body)
        assert refused.status_code == 422, (body, refused.text)
    assert budget_of(client, curator, dataset_id)["entries"] == []
    accepted = request_release(
        client, curator, dataset_id, {"mechanism": "test_means", "epsilon": 1}
    )
    assert accepted.status_code == 202, accepted.text


def _refused_synthetic_params(
    client: TestClient, curator: Caller, dataset_id: str, params_list: list[dict[str, object]]
) -> None:
    """Each ``smooth_synthetic`` request with these params is a 422, and none reserves."""
    for params in params_list:
        refused = request_release(
            client,
            curator,
            dataset_id,
            {"mechanism": "smooth_synthetic", "epsilon": 0.5, "params": params},
        )
        assert refused.status_code == 422, (params, refused.text)
    assert budget_of(client, curator, dataset_id)["entries"] == []


def test_integral_json_floats_are_integers(client: TestClient, curator: Caller) -> None:
    """JSON does not tell ``6`` from ``6.0`` and many clients send the second: an integral
    float is that integer in every integer field (parameters, query powers); ``6.5``
    stays a 422, as ``"6"`` and ``true`` do (the test above)."""
    dataset_id = dataset(client, curator, epsilon=5.0)

    def preview(bins: object) -> dict[str, object]:
        body = {"mechanism": "smooth_synthetic", "epsilon": 0.5, "params": {"bins": bins}}
        response = client.post(
            f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body
        )
        assert response.status_code == 200, (bins, response.text)
        shown: dict[str, object] = response.json()
        return shown

    assert preview(6.0) == preview(6) != preview(4)
    _refused_synthetic_params(
        client,
        curator,
        dataset_id,
        [{"bins": 6.5}, {"bins": 2.0**60}, {"method": "moments", "smoothness": 4.5}],
    )

    release_id = _smooth_release(client, curator, dataset_id)
    answers = []
    for power in (2, 2.0):
        query = {"type": "polynomial", "terms": [{"coefficient": 1, "powers": {"age": power}}]}
        response = client.post(
            f"/v1/releases/{release_id}/answers",
            headers=curator.headers,
            json={"queries": [query]},
        )
        assert response.status_code == 200, response.text
        answers.append(response.json()["answers"])
    assert answers[0] == answers[1]


#: Integer-typed fields that hold a category's value, not a count: a cell matches a category
#: by its text ("3" matches 3), so 3.0 is not taken for 3 there (commit f1480ae covers
#: parameters, query powers, vertex ids and the vertex count).
_CATEGORY_VALUE_FIELDS = {
    ("CategoricalColumn", "categories"),
    ("ConjunctionQuery", "where"),
    ("HeterogeneousQuery", "by_public"),
}


def _strict_integer_fields() -> list[tuple[type[BaseModel], str, dict[str, Any]]]:
    """Every integer field of a strict request model of the datasets' schemas and the
    mechanisms' adapters (found by its JSON schema, so a new plain ``int`` is found too),
    with its JSON schema."""
    import app.datasets.schemas
    import app.releases.adapters

    modules = [app.datasets.schemas] + [
        importlib.import_module(m.name)
        for m in pkgutil.iter_modules(app.releases.adapters.__path__, "app.releases.adapters.")
    ]
    found = []
    for module in modules:
        for model in vars(module).values():
            if not (
                inspect.isclass(model)
                and issubclass(model, BaseModel)
                and model.__module__ == module.__name__
                and model.model_config.get("strict")
            ):
                continue
            for name, schema in model.model_json_schema().get("properties", {}).items():
                if (
                    "'integer'" in str(schema)
                    and (model.__name__, name) not in _CATEGORY_VALUE_FIELDS
                ):
                    found.append((model, name, schema))
    return found


def test_every_integer_field_takes_integral_floats() -> None:
    """Each integer parameter (of every mechanism), query power, graph vertex id and the
    graph's vertex count reads 6.0 as 6 (f1480ae: "in every integer parameter"); a field
    left a plain strict ``int`` refuses it."""
    fields = _strict_integer_fields()
    assert len(fields) >= 15, fields
    for model, name, schema in fields:
        low = next((int(m) for m in re.findall(r"'minimum': (\d+)", str(schema))), 1)
        value = float(max(low, 2))
        text = str(schema)
        if "'array'" in text:
            given: object = [value]
        elif "additionalProperties" in text:
            given = {"x": value}
        else:
            given = value
        try:
            model.model_validate({name: given})
        except ValidationError as exc:
            at_field = [e for e in exc.errors() if e["loc"][:1] == (name,)]
            assert at_field == [], (model.__name__, name, at_field)


def test_integral_floats_are_integers_only_where_floats_are_exact() -> None:
    """Integral floats up to 2^53 (in magnitude) are integers; past it a float stands for
    several integers (2^53 + 1 reads as 2^53) and stays refused, as 6.5, true and "6" do."""
    adapter: TypeAdapter[int] = TypeAdapter(Integer, config=ConfigDict(strict=True))
    for given, expected in (
        (6.0, 6),
        (-6.0, -6),
        (0.0, 0),
        (2.0**53, 2**53),
        (-(2.0**53), -(2**53)),
    ):
        read = adapter.validate_python(given)
        assert (read, type(read)) == (expected, int), given
    for refused in (6.5, 2.0**53 + 2, -(2.0**53 + 2), 2.0**60, 1e300, INF, NAN, True, "6"):
        with pytest.raises(ValidationError):
            adapter.validate_python(refused)


def test_declarations_opt_ins_and_parameters_are_json_typed(
    client: TestClient, curator: Caller
) -> None:
    """Every request model is strict: in lax mode ``"yes"`` and ``1`` opted a dataset into
    non-DP releases, ``true`` set a budget total or a public bound to 1, and ``"4"`` was a
    parameter of 4."""
    bounds = {"name": "age", "kind": "continuous", "lower": True, "upper": 100}
    for schema in (
        {**SCHEMA, "columns": [bounds, *SCHEMA["columns"][1:]]},
        {**SCHEMA, "columns": [{**bounds, "lower": "0"}, *SCHEMA["columns"][1:]]},
        {**SCHEMA, "allow_non_dp_releases": "yes"},
        {**SCHEMA, "allow_non_dp_releases": 1},
    ):
        refused = upload(client, curator, csv_bytes(), schema)
        assert refused.status_code == 422, (schema, refused.text)
    assert client.get("/v1/datasets", headers=curator.headers).json() == []

    dataset_id = dataset(client, curator, epsilon=5.0)
    for body in ({"allow_non_dp_releases": "yes"}, {"allow_non_dp_releases": 1}):
        refused = client.patch(f"/v1/datasets/{dataset_id}", headers=curator.headers, json=body)
        assert refused.status_code == 422, (body, refused.text)
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json()
    assert shown["allow_non_dp_releases"] is False
    for body in ({"epsilon": True}, {"delta": "0.5"}):
        refused = client.patch(
            f"/v1/datasets/{dataset_id}/budget", headers=curator.headers, json=body
        )
        assert refused.status_code == 422, (body, refused.text)
    assert budget_of(client, curator, dataset_id)["epsilon_total"] == 5.0

    _refused_synthetic_params(
        client,
        curator,
        dataset_id,
        [{"method": "marginals", "bins": "4"}, {"method": "marginals", "bins": True}],
    )

    smooth = _smooth_release(client, curator, dataset_id)
    for sigma in (True, "0.5"):
        query = {"type": "gaussian_mixture", "centers": [[0, 0]], "weights": [1], "sigma": sigma}
        refused = client.post(
            f"/v1/releases/{smooth}/answers", headers=curator.headers, json={"queries": [query]}
        )
        assert refused.status_code == 422, (sigma, refused.text)


def test_a_negative_zero_delta_is_zero(client: TestClient, curator: Caller) -> None:
    """JSON's -0.0 is a valid delta (it equals 0 and passes every range check), and a
    pure-epsilon request that sent it was answered ``"delta": -0.0`` by the preview, and
    recorded and hashed with its sign (the same request as one with 0.0 under another
    idempotency hash). It is read as 0.0."""
    import math

    dataset_id = dataset(client, curator, epsilon=5.0)
    body = '{"mechanism": "smooth_synthetic", "epsilon": 0.5, "delta": -0.0}'
    headers = {**curator.headers, "Content-Type": "application/json"}
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=headers, content=body)
    assert preview.status_code == 200, preview.text
    assert '"delta":-0.0' not in preview.text
    assert math.copysign(1.0, preview.json()["delta"]) == 1.0
    zero = client.post(
        f"/v1/datasets/{dataset_id}/preview",
        headers=curator.headers,
        json={"mechanism": "smooth_synthetic", "epsilon": 0.5, "delta": 0.0},
    )
    assert preview.json() == zero.json()
    created = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers={**headers, "Idempotency-Key": "negative-zero"},
        content=body,
    )
    assert created.status_code == 202, created.text
    assert math.copysign(1.0, created.json()["delta"]) == 1.0
    replayed = request_release(
        client,
        curator,
        dataset_id,
        {"mechanism": "smooth_synthetic", "epsilon": 0.5, "delta": 0.0},
        key="negative-zero",
    )
    assert replayed.status_code in (200, 202), replayed.text
    assert replayed.json()["id"] == created.json()["id"]


def test_a_columns_list_longer_than_any_declaration_is_refused_unread(
    client: TestClient, curator: Caller
) -> None:
    """``columns`` holds distinct declared names, so never more than ``MAX_COLUMNS``: a
    longer list is a 422 naming the limit. Before, every name was checked and the unknown
    ones quoted back whole (tens of MB for a body at ``CURATOR_MAX_JSON_BYTES``)."""
    dataset_id = dataset(client, curator)
    names = [f"unknown-{j}" for j in range(MAX_COLUMNS + 1)]
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "columns": names}
    for path in ("releases", "preview"):
        response = client.post(
            f"/v1/datasets/{dataset_id}/{path}", headers=curator.headers, json=body
        )
        assert response.status_code == 422, response.text
        assert f"at most {MAX_COLUMNS} items" in response.text
        assert "unknown-1999" not in response.text  # not quoted back


def test_a_columns_list_of_overlong_names_is_refused_unquoted(
    client: TestClient, curator: Caller
) -> None:
    """No declared name is longer than 200 characters (``ColumnName``), so neither is a
    name a request may give: 2000 names of 30 000 characters (60 MB, within the body limit
    and the list's length) were checked and quoted back whole in the 422. Here 400 each
    (the tests' body limit is 1 MiB)."""
    dataset_id = dataset(client, curator)
    names = [f"unknown-{j}-" + "x" * 400 for j in range(MAX_COLUMNS)]
    body = {"mechanism": "smooth_synthetic", "epsilon": 1.0, "columns": names}
    for path in ("releases", "preview"):
        response = client.post(
            f"/v1/datasets/{dataset_id}/{path}", headers=curator.headers, json=body
        )
        assert response.status_code == 422, response.text[:300]
        assert "at most 200 characters" in response.text
        assert "xxxxxxxxxx" not in response.text  # not quoted back
        assert len(response.content) < 200_000
