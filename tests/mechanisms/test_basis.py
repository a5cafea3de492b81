import itertools
import json
import math

import numpy as np
import pytest

from app.mechanisms.basis import (
    IndexSet,
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
