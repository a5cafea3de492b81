"""File formats a curator uploads: CSV dialects and Parquet types, read as they are meant
or refused with a message that names the problem (never a value) and stores nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.storage.tables import open_table
from tests.conftest import Caller
from tests.datasets.helpers import upload, with_columns

COLUMNS: list[dict[str, Any]] = [
    {"name": "x", "kind": "continuous", "lower": 0, "upper": 100},
    {"name": "c", "kind": "categorical", "categories": ["A", "B"]},
    {"name": "b", "kind": "binary"},
]


def stored_rows(
    client: TestClient, dataset_id: str, columns: list[dict[str, Any]] = COLUMNS
) -> dict[str, list[Any]]:
    """The stored table, decrypted by open_table (under EncryptedTableSource), its
    continuous columns mapped back to original units and categories to their labels."""
    services = client.app.state.services  # type: ignore[attr-defined]
    path = services.settings.datasets_dir / f"{dataset_id}.parquet"
    data = open_table(path, services.data_key).read().to_pydict()
    out: dict[str, list[Any]] = {}
    for column in columns:
        values = data[column["name"]]
        if column["kind"] == "continuous":
            lower, upper = column["lower"], column["upper"]
            values = [round(lower + (v + 1) * (upper - lower) / 2, 9) for v in values]
        elif column["kind"] == "categorical":
            values = [column["categories"][i] for i in values]
        out[column["name"]] = values
    return out


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
@pytest.mark.parametrize("shift", range(4))
def test_quoted_line_ends_are_read_wherever_the_reader_cuts_its_blocks(
    client: TestClient, curator: Caller, monkeypatch: pytest.MonkeyPatch, shift: int, line_end: str
) -> None:
    """A quoted cell may hold a line end (RFC 4180). The reader cuts the file into blocks
    (4 MiB) at line ends; unless told that values may hold them, it cut inside such a cell,
    and a valid file over a block long was refused as "ragged" or "could not be read",
    depending on where the cut fell (found by the file-formats audit, with small blocks).
    (A CRLF inside a quoted cell is left out: cut between its CR and LF, pyarrow drops the
    LF, apache/arrow#51368.)"""
    from app.datasets import validation

    monkeypatch.setattr(validation, "CSV_BLOCK_BYTES", 256)
    columns = [COLUMNS[0], {**COLUMNS[1], "categories": ["A", "B\nA"]}, COLUMNS[2]]
    rows = ["1,A,1"] * shift + ['2,"B\nA",0', "3,A,1"] * 100
    content = (line_end.join(["x,c,b", *rows]) + line_end).encode()
    response = upload(client, curator, content, with_columns(*columns))
    assert response.status_code == 201, response.text
    assert response.json()["n_rows"] == shift + 200
    stored = stored_rows(client, response.json()["id"], columns)
    assert stored["c"] == ["A"] * shift + ["B\nA", "A"] * 100
    assert stored["x"] == [1.0] * shift + [2.0, 3.0] * 100
