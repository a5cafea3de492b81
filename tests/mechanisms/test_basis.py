import itertools
import json
import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from app.mechanisms.basis import (
    IndexSet,
    axis_total_degree,
    chebyshev_table,
    count_total_degree,
    full_tensor,
    moments,
    total_degree,
)
from app.mechanisms.data import ArraySource
from app.mechanisms.errors import MechanismError


def direct(degrees: np.ndarray, X: np.ndarray) -> np.ndarray:
    """T_r(x) = prod_i cos(r_i arccos x_i), evaluated the slow, obvious way."""
    return np.prod(np.cos(degrees[:, None, :] * np.arccos(X)[None, :, :]), axis=2)


def test_chebyshev_recurrence_matches_cosine_form() -> None:
    x = np.concatenate([[-1.0, 1.0, 0.0], np.random.default_rng(1).uniform(-1, 1, 200)])
    table = chebyshev_table(x, 60)
    expected = np.cos(np.arange(61)[:, None] * np.arccos(x)[None, :])
    np.testing.assert_allclose(table, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "index_set",
    [total_degree(4, 60), full_tensor(3, 4), total_degree(7, 7)],
    ids=["total_degree", "full_tensor", "first_degree"],
)
def test_evaluate_matches_direct_product(index_set: IndexSet) -> None:
    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, size=(301, index_set.dim))
    X[0] = 1.0
    X[1] = -1.0
    expected = direct(index_set.degrees, X)
    np.testing.assert_allclose(index_set.evaluate(X), expected, atol=1e-13)
    # tiny blocks exercise the chunking
    np.testing.assert_allclose(
        index_set.evaluate(X, block_elements=index_set.size * 7), expected, atol=1e-13
    )


@pytest.mark.parametrize("d", [1, 3, 4])
def test_total_degree_is_graded_lexicographic(d: int) -> None:
    max_degree = 4
    everything = [r for r in itertools.product(range(max_degree + 1), repeat=d) if sum(r) > 0]
    # total degree ascending, then lexicographically descending within a degree
    expected = sorted(
        (r for r in everything if sum(r) <= max_degree),
        key=lambda r: (sum(r), tuple(-v for v in r)),
    )
    R = count_total_degree(d, max_degree)
    assert len(expected) == R
    got = total_degree(d, R)
    assert [tuple(row) for row in got.degrees] == expected
    # a prefix is the first R' of the same order
    assert [tuple(row) for row in total_degree(d, 3).degrees] == expected[:3]


def test_total_degree_counts_per_degree() -> None:
    d = 6
    index_set = total_degree(d, count_total_degree(d, 3))
    for k in (1, 2, 3):
        assert int(np.sum(index_set.total_degrees == k)) == math.comb(k + d - 1, d - 1)


def test_first_degree_terms_are_the_columns() -> None:
    index_set = total_degree(5, 5)
    np.testing.assert_array_equal(index_set.degrees, np.eye(5, dtype=np.int64))
    np.testing.assert_array_equal(index_set.first_degree_positions(), np.arange(5))
    partial = total_degree(5, 3)
    np.testing.assert_array_equal(partial.first_degree_positions(), [0, 1, 2, -1, -1])


def test_full_tensor_excludes_constant_and_counts() -> None:
    index_set = full_tensor(3, 3)
    assert index_set.size == 26
    assert index_set.max_degree == 2
    assert not np.any(index_set.degrees.sum(axis=1) == 0)
    with pytest.raises(MechanismError, match="more than"):
        full_tensor(30, 3)
    with pytest.raises(MechanismError, match="at least 2"):
        full_tensor(3, 1)


def test_large_total_degree_set_is_fast_and_sparse() -> None:
    index_set = total_degree(100, 10_000)
    assert index_set.size == 10_000
    assert index_set.max_degree == 3
    X = np.random.default_rng(3).uniform(-1, 1, size=(50, 100))
    sample = np.random.default_rng(4).choice(10_000, size=200, replace=False)
    np.testing.assert_allclose(
        index_set.evaluate(X)[sample], direct(index_set.degrees[sample], X), atol=1e-13
    )


def test_moments_stream_batches_and_match_the_mean() -> None:
    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, size=(1003, 4))
    index_set = total_degree(4, 40)
    expected = direct(index_set.degrees, X).mean(axis=1)
    np.testing.assert_allclose(moments(X, index_set), expected, atol=1e-14)
    source = ArraySource(X, batch_rows=97)
    np.testing.assert_allclose(
        moments(source, index_set, block_elements=40 * 13), expected, atol=1e-14
    )


def test_moments_read_a_source_lazily() -> None:
    """A source that generates its batches on the fly: nothing holds all rows."""

    class Generated:
        n_rows = 10_000
        n_cols = 3

        def batches(self):  # type: ignore[no-untyped-def]
            rng = np.random.default_rng(6)
            for _ in range(10):
                yield rng.uniform(-1, 1, size=(1_000, 3))

    index_set = total_degree(3, 9)
    all_rows = np.vstack(list(Generated().batches()))
    np.testing.assert_allclose(
        moments(Generated(), index_set), direct(index_set.degrees, all_rows).mean(axis=1)
    )


@pytest.mark.parametrize(
    ("degrees", "message"),
    [
        (np.array([[0, 0], [1, 0]]), "constant"),
        (np.array([[1, 0], [1, 0]]), "repeated"),
        (np.array([[-1, 2]]), "non-negative"),
        (np.zeros((0, 2)), "empty"),
        (np.array([1, 2]), r"\(R, d\)"),
    ],
)
def test_bad_index_sets_are_rejected(degrees: np.ndarray, message: str) -> None:
    with pytest.raises(MechanismError, match=message):
        IndexSet(degrees)


def test_bad_points_and_shapes_are_rejected() -> None:
    index_set = total_degree(2, 4)
    with pytest.raises(MechanismError, match=r"\[-1, 1\]"):
        index_set.evaluate(np.array([[0.0, 1.5]]))
    with pytest.raises(MechanismError, match=r"\(m, 2\)"):
        index_set.evaluate(np.zeros((3, 3)))
    with pytest.raises(MechanismError, match="3 columns"):
        moments(np.zeros((4, 3)), index_set)
    with pytest.raises(MechanismError, match="outside"):
        moments(np.full((4, 2), 2.0), index_set)
    with pytest.raises(MechanismError, match="positive integer"):
        total_degree(2, 0)


@pytest.mark.parametrize(
    "index_set",
    [
        total_degree(5, 17),
        full_tensor(2, 3),
        IndexSet.from_terms(4, [[[0, 2]], [[1, 1], [3, 4]], [[2, 1]]]),
    ],
    ids=["total_degree", "full_tensor", "custom"],
)
def test_index_set_round_trips_through_json(index_set: IndexSet) -> None:
    data = json.loads(json.dumps(index_set.to_dict()))
    back = IndexSet.from_dict(data)
    assert back.same_as(index_set)
    assert back.kind == index_set.kind


def test_moments_memory_stays_bounded_while_streaming() -> None:
    """2*10^5 rows x R = 200: the full basis matrix would be 320 MB; the stream uses a few MB."""
    import tracemalloc

    class Generated:
        n_rows = 200_000
        n_cols = 5

        def batches(self):  # type: ignore[no-untyped-def]
            rng = np.random.default_rng(7)
            for _ in range(20):
                yield rng.uniform(-1, 1, size=(10_000, 5))

    index_set = total_degree(5, 200)
    tracemalloc.start()
    try:
        result = moments(Generated(), index_set)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.shape == (200,)
    assert np.all(np.abs(result) <= 1)
    assert peak < 16 * 2**20


def test_axis_total_degree_is_the_total_degree_set_plus_one_column_terms() -> None:
    from app.mechanisms.basis import axis_total_degree

    d, D, K = 4, 2, 5
    S = axis_total_degree(d, D, K)
    expected = {
        r
        for r in itertools.product(range(K + 1), repeat=d)
        if sum(r) > 0 and (sum(r) <= D or sum(1 for v in r if v) == 1)
    }
    assert {tuple(int(v) for v in r) for r in S.degrees} == expected
    assert S.size == count_total_degree(d, D) + d * (K - D) == len(expected)
    assert S.same_as(total_degree(d, count_total_degree(d, D))) is False
    assert axis_total_degree(d, D, D).same_as(total_degree(d, count_total_degree(d, D)))
    restored = IndexSet.from_dict(json.loads(json.dumps(S.to_dict())))
    assert restored.same_as(S)
    with pytest.raises(MechanismError, match="at least max_degree"):
        axis_total_degree(d, 3, 2)


# --- the vectorised builders against the element-by-element ones they replaced -----------


def _reference_compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """The builders' former enumeration: compositions of ``total``, lexicographically
    descending, by the successor rule (rightmost nonzero part before the last, moved on)."""
    a = [0] * parts
    a[0] = total
    while True:
        yield tuple(a)
        i = parts - 2
        while i >= 0 and a[i] == 0:
            i -= 1
        if i < 0:
            return
        tail = a[parts - 1]
        a[i] -= 1
        a[parts - 1] = 0
        a[i + 1] = tail + 1


def _reference_total_degree(d: int, R: int) -> np.ndarray:
    degrees = np.zeros((R, d), dtype=np.int64)
    row = 0
    for degree in itertools.count(1):
        for composition in _reference_compositions(degree, d):
            degrees[row] = composition
            row += 1
            if row == R:
                return degrees
    raise AssertionError("unreachable")


def _reference_axis_total_degree(d: int, D: int, K: int) -> np.ndarray:
    base = _reference_total_degree(d, count_total_degree(d, D))
    extra = [k * np.eye(d, dtype=np.int64)[i] for k in range(D + 1, K + 1) for i in range(d)]
    return np.vstack([base, *([np.array(extra, dtype=np.int64)] if extra else [])])


def _reference_groups(degrees: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The former grouping by support (the evaluation's gather order)."""
    d = degrees.shape[1]
    support = np.count_nonzero(degrees, axis=1)
    groups = []
    for s in np.unique(support):
        positions = np.flatnonzero(support == s)
        sub = degrees[positions]
        cols = np.nonzero(sub)[1].reshape(positions.size, int(s))
        groups.append((positions, np.take_along_axis(sub, cols, axis=1) * d + cols))
    return groups


def _assert_same_set(built: IndexSet, expected: np.ndarray) -> None:
    assert built.degrees.dtype == np.int64
    np.testing.assert_array_equal(built.degrees, expected)  # the same indices, same order
    reference = _reference_groups(expected)
    assert len(built._sparse) == len(reference)
    for (positions, flat), (ref_positions, ref_flat) in zip(built._sparse, reference, strict=True):
        np.testing.assert_array_equal(positions, ref_positions)
        np.testing.assert_array_equal(flat, ref_flat)
    rows, cols, ks = built.one_column_terms()
    one = np.flatnonzero(np.count_nonzero(expected, axis=1) == 1)
    np.testing.assert_array_equal(rows, one)
    np.testing.assert_array_equal(cols, np.argmax(expected[one] > 0, axis=1))
    np.testing.assert_array_equal(ks, expected[one, cols])
    IndexSet(expected)  # a valid set: no constant, no repeats


TOTAL_DEGREE_CASES = [
    (1, 1),
    (1, 500),
    (2, 1),
    (2, 2),
    (2, 300),
    (3, 3),
    (3, 4),
    (3, 100),
    (5, 6),
    (5, 251),
    (7, 120),  # one index into degree 4 (count_total_degree(7, 3) = 119)
    (13, 12),  # fewer than the first degree
    (13, 600),
    (30, 496),
    (30, 6000),
    (300, 1000),  # a partial second degree in many columns
]


@pytest.mark.parametrize(("d", "R"), TOTAL_DEGREE_CASES)
def test_total_degree_equals_the_former_enumeration(d: int, R: int) -> None:
    """The vectorised builder gives the very set and order of the enumeration it replaced
    (the order is part of stored releases and their answers), and the same evaluation
    groups."""
    built = total_degree(d, R)
    _assert_same_set(built, _reference_total_degree(d, R))
    assert (built.kind, built.parameter) == ("total_degree", R)


@pytest.mark.parametrize(
    ("d", "D", "K"), [(1, 1, 4), (2, 3, 5), (4, 2, 5), (4, 2, 2), (30, 1, 13), (7, 3, 9)]
)
def test_axis_total_degree_equals_the_former_construction(d: int, D: int, K: int) -> None:
    built = axis_total_degree(d, D, K)
    _assert_same_set(built, _reference_axis_total_degree(d, D, K))
    assert built.kind == "custom"


@pytest.mark.parametrize(("d", "t"), [(1, 7), (2, 3), (3, 4), (6, 2), (4, 5)])
def test_full_tensor_equals_the_former_product(d: int, t: int) -> None:
    built = full_tensor(d, t)
    expected = np.array(list(itertools.product(range(t), repeat=d)), dtype=np.int64)[1:]
    _assert_same_set(built, expected)
    assert (built.kind, built.parameter) == ("full_tensor", t)


@pytest.mark.parametrize(
    "build",
    [
        lambda: total_degree(500, 8_000),
        lambda: total_degree(40, 30_000),
        lambda: axis_total_degree(500, 1, 13),
    ],
    ids=["total_degree_wide", "total_degree", "axis_total_degree"],
)
def test_building_an_index_set_takes_about_its_own_memory(build: Callable[[], IndexSet]) -> None:
    """The builders write the (R, d) array once and keep only sparse work space: a set
    costs little more than its own bytes (the former ones took 4-5 times them: a Python row
    at a time, np.eye per extra term, then np.unique(axis=0) with its copies; 36 s and
    1.9 GB for basis_size 10^6 on 30 columns)."""
    import tracemalloc

    tracemalloc.start()
    try:
        built = build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.4 * built.degrees.nbytes + (4 << 20), (peak, built.degrees.nbytes)


def test_repeated_indices_are_found_without_sorting_whole_rows() -> None:
    """The check of a custom set (row hashes, colliding rows compared exactly) agrees with
    sorting whole rows, also for repeats far apart in a large set."""
    from app.mechanisms.basis import _has_repeats

    rng = np.random.default_rng(8)
    for _ in range(300):
        degrees = rng.integers(0, 3, size=(int(rng.integers(1, 40)), int(rng.integers(1, 6))))
        assert _has_repeats(degrees) == (np.unique(degrees, axis=0).shape[0] < len(degrees))
    large = np.array(total_degree(50, 20_000).degrees)
    assert not _has_repeats(large)
    large[-1] = large[3]
    with pytest.raises(MechanismError, match="repeated"):
        IndexSet(large)


@pytest.mark.parametrize(
    "index_set",
    [
        total_degree(400, 1),
        total_degree(400, 7),
        IndexSet.from_terms(400, [[[5, 3]], [[7, 1], [399, 2]], [[5, 1], [7, 1]], [[0, 4]]]),
        total_degree(400, 401),  # every column: the table as before
    ],
    ids=["one_moment", "seven_columns", "custom_gaps", "all_columns"],
)
def test_moments_table_holds_only_the_columns_the_set_uses(index_set: IndexSet) -> None:
    """The measure's Chebyshev table covers the columns the set uses, not all d: one
    moment in 2000 columns made a table of twice the batch (2 GB for a 65,536-row batch)
    and cost 130 us a row. The values are bit for bit those of a table of every column."""
    import tracemalloc

    X = np.random.default_rng(9).uniform(-1, 1, size=(20_000, 400))
    tracemalloc.start()
    try:
        result = moments(X, index_set)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    every = IndexSet(index_set.degrees)  # the same set, evaluated over a table of all columns
    every.__dict__["_table_plan"] = (None, every._sparse)
    np.testing.assert_array_equal(result, moments(X, every))
    np.testing.assert_array_equal(index_set.evaluate(X[:50]), every.evaluate(X[:50]))
    if index_set.size < 400:
        assert peak < 1.3 * X.nbytes, (peak, X.nbytes)  # the batch's check, then little


# --- the two forms of the Chebyshev table -------------------------------------------------


def test_trigonometric_table_matches_the_recurrence_at_low_degree() -> None:
    """Both forms agree to 1e-13 up to degree 100 (module doc: each errs by <= 3e-14),
    and T_0 = 1, T_1 = x exactly in both."""
    x = np.concatenate([[-1.0, 1.0, 0.0, 1 - 2**-52], np.random.default_rng(1).uniform(-1, 1, 200)])
    recurrence = np.clip(chebyshev_table(x, 100), -1.0, 1.0)
    trigonometric = chebyshev_table(x, 100, "trigonometric")
    np.testing.assert_allclose(trigonometric, recurrence, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(trigonometric[:2], recurrence[:2])
    assert np.abs(trigonometric).max() <= 1.0
    grid = x[:200].reshape(20, 10).T  # a transposed block, as in the evaluation
    np.testing.assert_array_equal(
        chebyshev_table(grid, 30, "trigonometric"),
        chebyshev_table(x[:200], 30, "trigonometric").reshape(31, 20, 10).transpose(0, 2, 1),
    )
    for degree in (0, 1):
        np.testing.assert_array_equal(
            chebyshev_table(x, degree, "trigonometric"), chebyshev_table(x, degree)
        )
    with pytest.raises(MechanismError, match="form"):
        chebyshev_table(x, 3, "cosine")


def test_trigonometric_table_at_low_degree_and_outside_the_interval() -> None:
    """Every degree from 2 on is computed whatever the table's degree (T_2 = 2 x^2 - 1,
    T_3 = 4 x^3 - 3 x), and x outside [-1, 1] is clipped before arccos (T_j(1.5) = T_j(1)
    = 1 and T_j(-2) = T_j(-1) = (-1)^j for j >= 2; T_1 = x as in the recurrence)."""
    x = np.array([0.3, -0.6, 0.9, 1.0, -1.0, 0.0])
    expected = np.stack([np.ones_like(x), x, 2 * x**2 - 1, 4 * x**3 - 3 * x])
    for degree in (2, 3):
        table = chebyshev_table(x, degree, "trigonometric")
        np.testing.assert_allclose(table, expected[: degree + 1], rtol=0, atol=1e-15)
    outside = chebyshev_table(np.array([1.5, -2.0]), 4, "trigonometric")
    np.testing.assert_allclose(
        outside, [[1.0, 1.0], [1.5, -2.0], [1.0, 1.0], [1.0, -1.0], [1.0, 1.0]], rtol=0, atol=1e-15
    )


def test_trigonometric_table_at_high_degree() -> None:
    """Degree 10^5: the table is cos(j arccos x) computed one value at a time, and within
    1e-9 of the recurrence (module doc: 6.2e-10 up to 10^5, 8.2e-9 up to 10^6)."""
    degree = 100_000
    x = np.concatenate(
        [
            [-1.0, 1.0, 0.0, 1 - 2**-52, -1 + 2**-53, 1 - 1e-9],
            np.random.default_rng(3).uniform(-1, 1, 6),
        ]
    )
    table = chebyshev_table(x, degree, "trigonometric")
    theta = np.arccos(x)
    for j in [
        *range(2, 40),
        *np.random.default_rng(4).integers(40, degree + 1, 300).tolist(),
        degree,
    ]:
        for i in range(x.size):
            assert table[j, i] == pytest.approx(math.cos(j * float(theta[i])), abs=1e-15)
    recurrence = np.clip(chebyshev_table(x, degree), -1.0, 1.0)
    np.testing.assert_allclose(table, recurrence, rtol=0, atol=1e-9)


def test_trigonometric_values_do_not_depend_on_the_block() -> None:
    """np.arccos / np.cos give an element the same value wherever it sits in an array, so
    a row's computed T_r(x) is the same whatever the block size (module doc)."""
    x = np.concatenate([[-1.0, 1.0, 0.0], np.random.default_rng(6).uniform(-1, 1, 58)])
    full = chebyshev_table(x, 500, "trigonometric")
    for i in range(x.size):
        np.testing.assert_array_equal(
            chebyshev_table(x[i : i + 1], 500, "trigonometric")[:, 0], full[:, i]
        )
    index_set = total_degree(2, 40_000)
    assert index_set.table_form == "trigonometric"
    X = np.random.default_rng(7).uniform(-1, 1, size=(9, 2))
    np.testing.assert_array_equal(
        index_set.evaluate(X), index_set.evaluate(X, block_elements=index_set.size * 4)
    )


@pytest.mark.parametrize(
    ("index_set", "form"),
    [
        (total_degree(1, 1_000_000), "trigonometric"),  # one-row blocks of degree 10^6
        (total_degree(1, 4033), "trigonometric"),  # 64 rows a block
        (total_degree(1, 4032), "recurrence"),  # 65 rows
        (total_degree(30, 87_382), "trigonometric"),  # 2 rows x 30 columns
        (total_degree(30, 87_381), "recurrence"),  # 3 rows x 30 columns
        (total_degree(30, 465), "recurrence"),
        (IndexSet.from_terms(2000, [[[7, 5000]]]), "recurrence"),  # one column, 2^18 rows
        # one column used of 100: 52 rows a block (the unused columns are not in the table)
        (IndexSet.from_terms(100, [[[3, k]] for k in range(1, 20_001)]), "trigonometric"),
    ],
)
def test_the_table_form_follows_the_width_of_a_default_block(
    index_set: IndexSet, form: str
) -> None:
    assert index_set.table_form == form


def test_moments_in_one_column_at_high_degree_use_the_trigonometric_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """d = 1, R = 10^5 (blocks of two rows): the measure takes the trigonometric form (the
    recurrence took 10^5 Python steps a block), and its moments agree with the recurrence's
    and with a direct mean of cos(j arccos x)."""
    import app.mechanisms.basis as basis

    R = 100_000
    X = np.concatenate(
        [[[1.0], [-1.0], [1 - 2**-52]], np.random.default_rng(8).uniform(-1, 1, (6, 1))]
    )
    forms: list[str] = []

    def spy(x: np.ndarray, max_degree: int, form: str = "recurrence") -> np.ndarray:
        forms.append(form)
        return chebyshev_table(x, max_degree, form)

    monkeypatch.setattr(basis, "chebyshev_table", spy)
    index_set = total_degree(1, R)
    fast = moments(X, index_set)
    assert set(forms) == {"trigonometric"}
    forms.clear()
    slow_set = total_degree(1, R)
    slow_set.__dict__["table_form"] = "recurrence"
    slow = moments(X, slow_set, block_elements=R * X.shape[0])  # one block: 10^5 steps
    assert set(forms) == {"recurrence"}
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-9)
    direct_mean = np.cos(np.arange(1, R + 1)[:, None] * np.arccos(X[:, 0])[None, :]).mean(axis=1)
    np.testing.assert_allclose(fast, direct_mean, rtol=0, atol=1e-15)
    forms.clear()
    index_set.evaluate(X[:3])
    assert set(forms) == {"trigonometric"}
    forms.clear()
    moments(np.repeat(X, 4, axis=1), total_degree(4, 60))
    assert set(forms) == {"recurrence"}


def test_moments_at_the_largest_one_column_basis() -> None:
    """d = 1, R = 10^6 (the largest basis_size in one column): a few rows against a direct
    mean of cos(j arccos x); the recurrence made this 10^6 Python steps a row."""
    R = 1_000_000
    X = np.array([[1.0], [-0.3], [0.77]])
    out = moments(X, total_degree(1, R))
    expected = np.cos(np.arange(1, R + 1)[:, None] * np.arccos(X[:, 0])[None, :]).mean(axis=1)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)
    assert np.abs(out).max() <= 1.0


def test_moments_report_the_rows_summed_after_each_block() -> None:
    """``progress`` is called after each block of rows (``block_elements / R`` rows, within
    a batch) with the share of the ``n`` rows summed so far, ending at 1; the moments are
    the same with and without it."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, size=(10, 2))
    index_set = total_degree(2, 5)  # R = 5: blocks of 20 // 5 = 4 rows
    seen: list[float] = []
    source = ArraySource(X, batch_rows=6)  # batches of 6 and 4 rows: blocks 4, 2, 4
    with_progress = moments(source, index_set, block_elements=20, progress=seen.append)
    assert seen == pytest.approx([0.4, 0.6, 1.0])
    np.testing.assert_array_equal(with_progress, moments(X, index_set, block_elements=20))
