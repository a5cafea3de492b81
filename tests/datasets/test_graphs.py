"""Graph datasets: an edge list with a declared vertex count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.core.errors import InvalidUpload
from app.storage.tables import open_table
from tests.conftest import Caller
from tests.datasets.helpers import stored_table
from tests.datasets.test_upload import assert_nothing_stored

GRAPH: dict[str, Any] = {
    "name": "friends",
    "kind": "graph",
    "vertices": 6,
    "budget": {"epsilon": 2},
}


def upload_graph(
    client: TestClient, caller: Caller, content: bytes, schema: dict[str, Any] | None = None
) -> Any:
    return client.post(
        "/v1/datasets",
        headers=caller.headers,
        files={"file": ("edges.txt", content, "text/plain")},
        data={"schema": json.dumps(schema or GRAPH)},
    )


@pytest.mark.parametrize(
    "content",
    [
        b"0 1\n1 2\n5 4\n",
        b"# a comment\n# another\nsource,target\n0,1\n2,1\n4,5\n",
        b"0\t1\n1\t2\n\n4\t5\n",
        # a UTF-8 byte order mark (Excel's "CSV UTF-8"): the first edge was taken for a
        # header row and silently dropped
        b"\xef\xbb\xbf0 1\n1 2\n5 4\n",
        b"\xef\xbb\xbf# a comment\n# another\n0,1\n2,1\n4,5\n",
        # a form feed or U+2028 inside a comment is no line break for the CSV reader
        "# page\fbreak\u2028here\n0 1\n1 2\n5 4\n".encode(),
    ],
    ids=["spaces", "comments-header-commas", "tabs-blank-line", "bom", "bom-comments", "ff-ls"],
)
def test_graph_upload_normalises_edges(client: TestClient, curator: Caller, content: bytes) -> None:
    response = upload_graph(client, curator, content)
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["kind"], body["n_vertices"], body["n_rows"], body["columns"]) == (
        "graph",
        6,
        None,
        [],
    )
    assert body["validation"] is None  # the edge count is private under edge-level DP
    table = stored_table(client, body["id"])
    edges = np.column_stack([table["u"].to_numpy(), table["v"].to_numpy()]).tolist()
    assert edges == [[0, 1], [1, 2], [4, 5]]


@pytest.mark.parametrize(
    ("content", "problem", "rows"),
    [
        (b"0 1\n1 6\n7 1\n", "ids outside 0..5 (the declared vertex count)", 2),
        (b"0 1\n2 2\n", "self-loops", 1),
        (b"0 1\n1 0\n0 1\n2 3\n", "repeated edges (in either orientation)", 2),
        (b"0 1\n1 x\n-1 2\n", "ids that are not non-negative integers", 2),
        (b"0 1\n99999999999999999999 1\n", "ids outside 0..5 (the declared vertex count)", 1),
        # a bad first edge was taken for a header row and dropped: a 201 without it
        (b"0 -1\n0 1\n1 2\n", "ids that are not non-negative integers", 1),
        (b"2 1.0\n0 1\n", "ids that are not non-negative integers", 1),
        ("\uff11,\uff12\n0,1\n".encode(), "ids that are not non-negative integers", 1),
        (b"nan,inf\n0,1\n", "ids that are not non-negative integers", 1),
    ],
    ids=[
        "out-of-range",
        "self-loop",
        "duplicates",
        "not-integers",
        "huge-id",
        "first-negative",
        "first-decimal",
        "first-fullwidth-digits",
        "first-nan-inf",
    ],
)
def test_bad_edges_are_counted_not_quoted(
    client: TestClient, curator: Caller, content: bytes, problem: str, rows: int
) -> None:
    response = upload_graph(client, curator, content)
    assert response.status_code == 422, response.text
    assert {"column": "edges", "problem": problem, "rows": rows} in response.json()["error"][
        "problems"
    ]
    assert "99999" not in response.text
    assert_nothing_stored(client)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "the file is empty"),
        (b"# only a comment\n", "the file has no edges"),
        (b"0 1 2\n3 4 5\n", "some lines do not have exactly two fields"),
        (
            "0 1\n1 2\n".encode("utf-16"),
            "the file is UTF-16 or UTF-32 text (it starts with such a byte-order mark), "
            "not UTF-8 text: upload the edge list as UTF-8 text",
        ),
        (
            b"0 1\x00\n1 2\n",
            "the file is not UTF-8 text: it contains NUL bytes (UTF-16 text, or a binary "
            "file?): upload the edge list as UTF-8 text",
        ),
    ],
)
def test_unreadable_edge_lists(
    client: TestClient, curator: Caller, content: bytes, problem: str
) -> None:
    response = upload_graph(client, curator, content)
    assert response.status_code == 422
    assert response.json()["error"]["problems"] == [
        {"column": None, "problem": problem, "rows": None}
    ]
    assert_nothing_stored(client)


def test_graph_declaration_is_validated(client: TestClient, curator: Caller) -> None:
    for schema, fragment in (
        ({**GRAPH, "vertices": 1}, "schema.vertices"),
        ({**GRAPH, "vertices": 10**6}, "schema.vertices"),
        ({**GRAPH, "columns": []}, "schema.columns"),
    ):
        response = upload_graph(client, curator, b"0 1\n", schema)
        assert response.status_code == 422
        assert fragment in response.json()["error"]["message"]
    assert_nothing_stored(client)


def test_public_columns_are_stored_as_text(client: TestClient, curator: Caller) -> None:
    from tests.datasets.helpers import upload

    schema = {
        "name": "ratings",
        "columns": [{"name": "movie", "kind": "public"}, {"name": "liked", "kind": "binary"}],
        "budget": {"epsilon": 1},
    }
    response = upload(client, curator, b"movie,liked\nm1,1\n42,0\n", schema)
    assert response.status_code == 201, response.text
    table = stored_table(client, response.json()["id"])
    assert table["movie"].to_pylist() == ["m1", "42"]
    empty = upload(client, curator, b"movie,liked\n,1\n", schema)
    assert {"column": "movie", "problem": "empty cells", "rows": 1} in empty.json()["error"][
        "problems"
    ]


def test_non_dp_opt_in_is_the_curators(
    client: TestClient, curator: Caller, analyst: Caller
) -> None:
    from tests.datasets.helpers import csv_bytes, upload

    dataset_id = upload(client, curator, csv_bytes()).json()["id"]
    assert (
        client.get(f"/v1/datasets/{dataset_id}", headers=curator.headers).json()[
            "allow_non_dp_releases"
        ]
        is False
    )
    switched = client.patch(
        f"/v1/datasets/{dataset_id}", headers=curator.headers, json={"allow_non_dp_releases": True}
    )
    assert switched.status_code == 200
    assert switched.json()["allow_non_dp_releases"] is True
    client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=curator.headers,
        json={"user_id": str(analyst.id)},
    )
    assert (
        client.patch(
            f"/v1/datasets/{dataset_id}",
            headers=analyst.headers,
            json={"allow_non_dp_releases": False},
        ).status_code
        == 403
    )
    graph_id = upload_graph(client, curator, b"0 1\n").json()["id"]
    assert (
        client.patch(
            f"/v1/datasets/{graph_id}",
            headers=curator.headers,
            json={"allow_non_dp_releases": True},
        ).status_code
        == 422
    )


def test_graph_validation_memory_does_not_grow_with_the_edges(tmp_path: Path) -> None:
    """Resource audit: the upload kept an int64 code per edge, concatenated and np.unique'd
    them (about 88 bytes an edge in all: 10 GB for a 1 GiB edge list). It now sets each
    edge's bit in the packed pair bits (|V| (|V| - 1) / 16 bytes) as the file is read: the
    memory is those bits and one read block of the file, and the stored edges are the same
    (sorted, distinct, u < v), repeated edges counted as before."""
    import io
    import tracemalloc

    from cryptography.fernet import Fernet

    from app.datasets.graphs import validate_graph_and_store

    n, m = 3000, 1_500_000
    rng = np.random.default_rng(11)
    pairs = rng.choice(n * (n - 1) // 2, size=m, replace=False)
    iu = np.triu_indices(n, k=1)
    u, v = iu[0][pairs], iu[1][pairs]
    del iu
    swap = rng.random(m) < 0.5  # either orientation
    u, v = np.where(swap, v, u), np.where(swap, u, v)
    text = "\n".join(f"{a} {b}" for a, b in zip(u.tolist(), v.tolist(), strict=True))
    content = (text + "\n0 1\n1 0\n0 1\n").encode()  # three listings of one pair
    key = Fernet.generate_key()
    tracemalloc.start()
    try:
        with pytest.raises(InvalidUpload) as refused:
            validate_graph_and_store(
                io.BytesIO(content), len(content), n, tmp_path / "refused.parquet", key
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    listed = bool(np.any((np.minimum(u, v) == 0) & (np.maximum(u, v) == 1)))
    repeated = {"column": "edges", "problem": "repeated edges (in either orientation)"}
    assert refused.value.extra["problems"] == [repeated | {"rows": 3 if listed else 2}]
    assert not (tmp_path / "refused.parquet").exists()
    # a read block (4 MiB of text, about 4.4e5 edges) and the int64 arrays of its checks:
    # 25 MB measured, whatever the number of blocks; the codes, their concatenation and
    # np.unique of the 1.5e6 edges took it to 52 MB before
    assert peak <= 36 * 1024 * 1024, peak
    stored = validate_graph_and_store(
        io.BytesIO(text.encode()), len(text), n, tmp_path / "graph.parquet", key
    )
    assert stored.n_edges == m
    table = open_table(tmp_path / "graph.parquet", key).read()
    low, high = np.minimum(u, v), np.maximum(u, v)
    order = np.lexsort((high, low))
    np.testing.assert_array_equal(table["u"].to_numpy(), low[order])
    np.testing.assert_array_equal(table["v"].to_numpy(), high[order])


def test_refused_rows_are_not_counted_as_repeated_edges(
    client: TestClient, curator: Caller
) -> None:
    """Repeated edges are the *valid* rows listed less the distinct pairs: rows refused
    for another reason (out of range, self-loop, not an integer) are counted under that
    reason only, and a repeat among the valid rows still counts once per extra listing."""
    content = b"0 1\n1 2\n7 1\n3 3\nx 2\n2 1\n"
    response = upload_graph(client, curator, content)
    assert response.status_code == 422, response.text
    problems = response.json()["error"]["problems"]
    assert sorted((p["problem"], p["rows"]) for p in problems) == [
        ("ids outside 0..5 (the declared vertex count)", 1),
        ("ids that are not non-negative integers", 1),
        ("repeated edges (in either orientation)", 1),
        ("self-loops", 1),
    ]
    response = upload_graph(client, curator, b"0 1\n7 1\n3 3\n")
    assert response.status_code == 422, response.text
    assert [p["problem"] for p in response.json()["error"]["problems"]] == [
        "ids outside 0..5 (the declared vertex count)",
        "self-loops",
    ]
    assert_nothing_stored(client)


def test_a_header_without_edges_is_refused_as_no_edges(client: TestClient, curator: Caller) -> None:
    """A file whose only line is a header has rows to read but no edge: the same 422 as a
    file of comments, nothing stored."""
    response = upload_graph(client, curator, b"source,target\n")
    assert response.status_code == 422, response.text
    assert response.json()["error"]["problems"] == [
        {"column": None, "problem": "the file has no edges", "rows": None}
    ]
    assert_nothing_stored(client)


def test_a_long_first_line_is_read_in_linear_time() -> None:
    """The first line's number pattern split a run of digits every way between its
    integer and fraction parts when the field did not match (``1...1x``): quadratic, a
    64 KiB first line held the GIL for about three minutes (review, helper-35). The
    declaration's plain-number pattern was the same."""
    import io
    import time

    from app.datasets.graphs import _layout
    from app.datasets.schemas import _PLAIN_NUMBER

    field = "1" * 20_000 + "x"
    started = time.perf_counter()
    assert _layout(io.BytesIO(field.encode() + b"\n0,1\n")) == (" ", 0, True)
    assert _PLAIN_NUMBER.fullmatch("+" + field) is None
    assert time.perf_counter() - started < 2.0  # about 36 s before
