"""randomized_response's adapter answers ``heterogeneous`` (``by_public``) queries as the
row-by-row formulas of paper 004 do (eq. 17, the exact worst-case variance, bounds (20)
and (22), eq. 21), here recomputed slowly from each released row's decoded cells and its
public value's conditions, without the mechanism's row functions or its cell counts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from app.core.errors import InvalidRequest
from app.mechanisms import randomized_response as rr
from app.releases.adapters import randomized_response as adapter
from app.releases.registry import ColumnInfo, DatasetInfo

CATEGORIES = ("A", "B", "AB", "O")
BITS = 3
COLUMNS = (
    ColumnInfo("blood", "categorical", categories=CATEGORIES),
    ColumnInfo("age", "continuous", lower=0.0, upper=80.0),
    ColumnInfo("viewer", "public"),
    ColumnInfo("smoker", "binary"),
)


def loaded_release(seed: int, n: int, public: int) -> tuple[dict[str, Any], DatasetInfo]:
    """A release as ``RandomizedResponse.load`` returns it (perturbed blood x age x smoker,
    public viewer); ``public`` viewers, each holding some row."""
    rng = np.random.default_rng(seed)
    domain = rr.Domain((len(CATEGORIES), 1 << BITS, 2))
    cells = np.column_stack(
        [rng.integers(0, 4, size=n), rng.integers(0, 1 << BITS, size=n), rng.integers(0, 2, n)]
    )
    viewer = rng.permutation(
        np.concatenate([np.arange(public), rng.integers(0, public, n - public)])
    )
    release = rr.release(domain.encode(cells), domain, 1.5, public=viewer)
    names = [f"user{k:03d}" for k in range(public)]
    return {"release": release, "bits": BITS, "public_values": names}, DatasetInfo(n, COLUMNS)


def random_where(rng: np.random.Generator) -> dict[str, Any]:
    """One to three conditions, never all values of a column, always some cell."""
    while True:
        where: dict[str, Any] = {}
        if rng.random() < 0.6:
            chosen = sorted(rng.choice(4, size=int(rng.integers(1, 4)), replace=False))
            labels = [CATEGORIES[k] for k in chosen]
            where["blood"] = labels[0] if len(labels) == 1 and rng.random() < 0.5 else labels
        if rng.random() < 0.5:
            where["smoker"] = [0, 1, True, False][int(rng.integers(4))]
        if rng.random() < 0.6:
            low = float(rng.uniform(0, 65))  # 10 years or more: some midpoint is inside
            where["age"] = {"between": [low, low + float(rng.uniform(10, 40))]}
        if where:
            return where


def midpoint_age(cell: int) -> float:
    return (cell + 0.5) * 80.0 / (1 << BITS)


def row_function(where: dict[str, Any]) -> tuple[Any, float, dict[str, list[float]]]:
    """``(phi on a decoded row, mu, answered range)`` of one ``where``, from first
    principles: blood by label, smoker by 0/1, age by the cell midpoint in years."""
    tests = []
    mu = 1.0
    answered: dict[str, list[float]] = {}
    if "blood" in where:
        labels = where["blood"] if isinstance(where["blood"], list) else [where["blood"]]
        allowed = {CATEGORIES.index(label) for label in labels}
        tests.append(lambda row, allowed=allowed: row[0] in allowed)
        mu *= len(allowed) / 4
    if "smoker" in where:
        value = int(where["smoker"])
        tests.append(lambda row, value=value: row[2] == value)
        mu *= 1 / 2
    if "age" in where:
        low, high = where["age"]["between"]
        cells = [c for c in range(1 << BITS) if low <= midpoint_age(c) <= high]
        tests.append(lambda row, cells=set(cells): row[1] in cells)
        mu *= len(cells) / (1 << BITS)
        width = 80.0 / (1 << BITS)
        answered["age"] = [min(cells) * width, (max(cells) + 1) * width]
    return (lambda row: float(all(t(row) for t in tests))), mu, answered


def expected_answer(loaded: dict[str, Any], by_public: dict[str, Any], proper: bool):
    release: rr.RRRelease = loaded["release"]
    assert release.domain is not None
    assert release.public is not None
    rho, margin, n = release.replace_probability, release.keep_margin, release.n
    functions = {name: row_function(where) for name, where in by_public.items()}
    phi, mu = [], []
    for row, p in zip(release.domain.decode(release.codes), release.public, strict=True):
        f, m, _ = functions[loaded["public_values"][p]]
        phi.append(f(row))
        mu.append(m)
    phi_sum, mu_arr = math.fsum(phi), np.array(mu)
    value = (phi_sum - rho * math.fsum(mu)) / (n * margin)
    if proper:
        value = min(max(round(value * n), 0), n) / n
    worst = math.fsum(np.maximum(mu_arr**2, (1 - mu_arr) ** 2))
    spread = math.fsum(mu_arr - mu_arr**2)
    stderr = math.sqrt(rho / (n * margin) ** 2 * (margin * worst + spread))
    bound = (2.0 if proper else 1.0) / (margin * math.sqrt(n))
    answered = {name: a for name, (_, _, a) in functions.items() if a}
    return value, stderr, bound, answered


@pytest.mark.parametrize(("seed", "n", "public"), [(0, 400, 30), (1, 250, 1), (2, 600, 120)])
def test_by_public_answers_are_the_row_by_row_formulas(seed: int, n: int, public: int) -> None:
    loaded, info = loaded_release(seed, n, public)
    rng = np.random.default_rng([seed, 1])
    mechanism = adapter.RandomizedResponse()
    for estimator in ("unbiased", "proper"):
        by_public = {name: random_where(rng) for name in loaded["public_values"]}
        query = {"type": "heterogeneous", "by_public": by_public, "estimator": estimator}
        (answer,) = mechanism.answer(loaded, info, [query])
        value, stderr, bound, answered = expected_answer(loaded, by_public, estimator == "proper")
        margin = loaded["release"].keep_margin
        assert answer["value"] == pytest.approx(value, rel=1e-12, abs=1e-15 / margin)
        assert answer["stderr"] == pytest.approx(stderr, rel=1e-12)
        assert answer["error_bound"] == pytest.approx(bound, rel=1e-15)
        z = 1.959963984540054  # conjunctions: the interval is clipped to [0, 1]
        assert answer["interval"] == pytest.approx(
            [min(max(value - z * stderr, 0.0), 1.0), max(min(value + z * stderr, 1.0), 0.0)],
            rel=1e-12,
            abs=1e-15 / margin,
        )
        assert answer["estimator"] == estimator
        got = answer.get("answered_ranges", {})
        assert set(got) == {name for name in by_public if name in answered}
        for name, ranges in got.items():
            assert ranges == {"age": pytest.approx(answered[name]["age"], rel=1e-15)}


def test_values_whose_conditions_select_the_same_cells_share_one_conjunction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Conditions written differently that select the same cells (a range with other ends
    around the same midpoints, 1 and true for a binary column) give their public values
    one conjunction, built once; every value still reports the range its cells cover, and
    the answer is still the row-by-row formulas'."""
    loaded, info = loaded_release(5, 300, 6)
    names = loaded["public_values"]
    by_public = {
        names[0]: {"age": {"between": [15.0, 35.0]}, "smoker": 1},
        names[1]: {"age": {"between": [12.5, 38.0]}, "smoker": True},  # midpoints 15-35
        names[2]: {"blood": ["A", "O"]},
        names[3]: {"age": {"between": [11.0, 39.5]}, "smoker": 1},
        names[4]: {"blood": ["A", "O"]},
        names[5]: {"age": {"between": [15.0, 35.0]}, "smoker": 0},  # other cells
    }
    seen: list[rr.Heterogeneous] = []
    answer_of = rr.RRRelease.answer

    def spy(self: rr.RRRelease, query: Any, **kwargs: Any) -> Any:
        seen.append(query)
        return answer_of(self, query, **kwargs)

    monkeypatch.setattr(rr.RRRelease, "answer", spy)
    (answer,) = adapter.RandomizedResponse().answer(
        loaded, info, [{"type": "heterogeneous", "by_public": by_public}]
    )
    (query,) = seen
    codes = {name: k for k, name in enumerate(names)}
    functions = [query.functions[codes[name]] for name in names]
    assert functions[0] is functions[1] is functions[3]
    assert functions[2] is functions[4]
    assert len({id(f) for f in functions}) == 3
    value, stderr, _, answered = expected_answer(loaded, by_public, proper=False)
    margin = loaded["release"].keep_margin
    assert answer["value"] == pytest.approx(value, rel=1e-12, abs=1e-15 / margin)
    assert answer["stderr"] == pytest.approx(stderr, rel=1e-12)
    assert answer["answered_ranges"] == {
        name: {"age": [10.0, 40.0]} for name in (names[0], names[1], names[3], names[5])
    }
    assert answered == answer["answered_ranges"]


def test_by_public_refusals_name_the_query() -> None:
    loaded, info = loaded_release(3, 100, 3)
    mechanism = adapter.RandomizedResponse()
    names = loaded["public_values"]
    for by_public, fragment in (
        ({names[0]: {"smoker": 1}}, "no row function for 2 of the public column's 3 values"),
        ({key: {"smoker": 1} for key in [*names, "nobody"]}, "not in the released public column"),
        ({key: {"smoker": [0, 1]} for key in names}, "allows every value"),
        ({key: {"blood": "C"} for key in names}, "has no category"),
        ({key: {"age": {"between": [81, 90]}} for key in names}, "no cell of column 'age'"),
    ):
        query = {"type": "heterogeneous", "by_public": by_public}
        with pytest.raises(InvalidRequest, match=r"queries\.1: ") as info_:
            mechanism.answer(loaded, info, [{"type": "conjunction", "where": {"smoker": 1}}, query])
        assert fragment in info_.value.message


def test_a_request_is_charged_for_each_public_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request bound charges a query its entries plus PUBLIC_VALUE_WORK per public
    value (a by_public query parses one condition per value): at twice that, two queries
    are answered and three refused, naming the public values."""
    loaded, info = loaded_release(0, 400, 30)
    entries = loaded["release"].cell_counts.size
    per_query = entries + adapter.PUBLIC_VALUE_WORK * 30
    monkeypatch.setattr(adapter, "MAX_ANSWER_WORK", 2 * per_query)
    query = {"type": "conjunction", "where": {"smoker": 1}}
    mechanism = adapter.RandomizedResponse()
    assert len(mechanism.answer(loaded, info, [query] * 2)) == 2
    with pytest.raises(InvalidRequest) as refused:
        mechanism.answer(loaded, info, [query] * 3)
    assert refused.value.message == (
        "3 queries are more than one request may ask of this release (each reads the counts "
        f"of its {entries} distinct released cells over 30 public values): at most 2 per "
        "request; split the batch"
    )


def test_between_takes_the_cells_whose_midpoint_is_an_end() -> None:
    """``between`` is inclusive at both ends: a midpoint equal to ``low`` or ``high`` (5,
    15, ..., 75 years here) is in the range, and the answered range is those cells' outer
    edges."""
    loaded, info = loaded_release(4, 200, 5)
    mechanism = adapter.RandomizedResponse()
    for low, high, answered in (
        (15.0, 35.0, [10.0, 40.0]),
        (15.0, 15.0, [10.0, 20.0]),
        (5.0, 75.0, [0.0, 80.0]),
        (15.5, 34.5, [20.0, 30.0]),
    ):
        query = {"type": "conjunction", "where": {"age": {"between": [low, high]}}}
        if answered == [0.0, 80.0]:
            query["where"]["smoker"] = 1  # every age: a constant row function otherwise
        (answer,) = mechanism.answer(loaded, info, [query])
        assert answer["answered_ranges"] == {"age": answered}, (low, high)


def test_the_request_bound_admits_two_by_public_queries_over_ten_to_the_five_values() -> None:
    """The bound measured in ``bench/results/rr_by_public.md``: at 10^6 released rows
    (about 10^6 entries) and 10^5 public values, one request admits 2 ``by_public``
    queries (about 10 s when each value selects cells of its own); at 250 per public value
    it admitted 5 (27 s), and with the former 40, 30 (190 s)."""
    per_query = 10**6 + adapter.PUBLIC_VALUE_WORK * 10**5
    assert adapter.MAX_ANSWER_WORK // per_query == 2


def test_a_stored_declaration_with_one_text_in_two_unicode_forms_answers_each() -> None:
    """Declarations refuse two categories that are one text in two Unicode forms, but
    datasets stored before that rule may hold such a pair (each its own category, its
    cells matched exactly at upload), or a category stored in NFD alone. A condition
    naming one of the pair by its text answers for that category, as the table query of
    its cell does (it answered for the other one: the later category took the pair's
    NFC form); the NFC form, the text of neither, names no category; the category stored
    in NFD alone is also named in NFC."""
    nfd, mixed = "e\u0323\u0302", "\u00ea\u0323"  # e, dot below, circumflex; NFC: \u1ec7
    columns = (
        ColumnInfo("c", "categorical", categories=(nfd, mixed, "the\u0301")),
        ColumnInfo("smoker", "binary"),
    )
    rng = np.random.default_rng(5)
    domain = rr.Domain((3, 2))
    cells = np.column_stack([rng.choice(3, size=500, p=[0.7, 0.1, 0.2]), rng.integers(0, 2, 500)])
    loaded = {
        "release": rr.release(domain.encode(cells), domain, 2.0),
        "bits": BITS,
        "public_values": None,
    }
    info = DatasetInfo(500, columns)
    mechanism = adapter.RandomizedResponse()
    for label, category in ((nfd, 0), (mixed, 1), ("th\u00e9", 2), ("the\u0301", 2)):
        table = [1.0 if k // 2 == category else 0.0 for k in range(domain.size)]
        by_label, by_cell = mechanism.answer(
            loaded,
            info,
            [
                {"type": "conjunction", "where": {"c": label}},
                {"type": "table", "values": table},
            ],
        )
        assert by_label["value"] == pytest.approx(by_cell["value"], rel=1e-12), label
    with pytest.raises(InvalidRequest, match="has no category"):
        mechanism.answer(loaded, info, [{"type": "conjunction", "where": {"c": "\u1ec7"}}])
