import math

import numpy as np
import pytest

from app.mechanisms import noise
from app.mechanisms.data import (
    ArraySource,
    StreamSum,
    as_source,
    iter_checked,
    pairwise_total,
    row_sum_depth,
)
from app.mechanisms.errors import MechanismError


def bounded_sum(values: np.ndarray, cuts: list[int]) -> float:
    """``values`` cut into blocks at ``cuts``, each summed by pairwise_total, the blocks by
    a StreamSum: how the mechanisms sum rows."""
    total = StreamSum()
    for block in np.split(values, cuts):
        if block.size:
            total.add(pairwise_total(block.copy()))
    return float(total.total())


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 4096, 5001])
def test_bounded_sums_meet_the_depth_bound_where_naive_sums_do_not(n: int) -> None:
    """1 followed by terms of half an ulp of 1: a chain of additions drops every one of them
    (error ~ n u), a tree of depth h errs by at most gamma_h sum |t| whatever the blocks."""
    rng = np.random.default_rng(n)
    values = np.concatenate([[1.0], np.full(n - 1, 2.0**-53)])
    exact = math.fsum(values)
    bound = noise.gamma(row_sum_depth(n)) * float(np.abs(values).sum())
    for cuts in ([], sorted(rng.integers(0, n, size=7).tolist()), list(range(1, n))):
        assert abs(bounded_sum(values, cuts) - exact) <= bound
    naive = 0.0
    for value in values:
        naive += float(value)
    if n >= 1000:
        assert abs(naive - exact) > bound
    mixed = rng.uniform(-1, 1, size=n) * 10.0 ** rng.integers(-8, 1, size=n)
    cuts = sorted(rng.integers(0, n, size=20).tolist())
    assert abs(bounded_sum(mixed, cuts) - math.fsum(mixed)) <= noise.gamma(
        row_sum_depth(n)
    ) * float(np.abs(mixed).sum())


def test_pairwise_total_and_stream_sum_on_arrays() -> None:
    rng = np.random.default_rng(3)
    blocks = [rng.integers(-5, 5, size=(m, 3)).astype(float) for m in (1, 2, 7, 64, 3)]
    total = StreamSum()
    for block in blocks:
        total.add(pairwise_total(block.copy()))
    np.testing.assert_array_equal(total.total(), np.vstack(blocks).sum(axis=0))  # integers
    total.add(np.ones(3))  # total() does not end the stream
    np.testing.assert_array_equal(total.total(), np.vstack(blocks).sum(axis=0) + 1)
    with pytest.raises(MechanismError):
        pairwise_total(np.zeros((0, 3)))
    with pytest.raises(MechanismError):
        StreamSum().total()
    assert row_sum_depth(569) == 20
    assert row_sum_depth(10**6) == 40


def test_array_source_batches_cover_every_row_once() -> None:
    X = np.linspace(-1, 1, 70).reshape(35, 2)
    source = as_source(X, batch_rows=8)
    assert (source.n_rows, source.n_cols) == (35, 2)
    parts = list(iter_checked(source))
    assert [p.shape[0] for p in parts] == [8, 8, 8, 8, 3]
    np.testing.assert_array_equal(np.vstack(parts), X)
    # a second pass is a fresh iterator
    assert sum(p.shape[0] for p in source.batches()) == 35


@pytest.mark.parametrize(
    ("X", "message"),
    [
        (np.zeros((0, 3)), "empty"),
        (np.zeros((4, 0)), "no columns"),
        (np.zeros(4), "2-D"),
        (np.array([[0.0, np.nan]]), "non-finite cells"),
        (np.array([[0.0, 1.5], [-2.0, 0.0]]), "cells outside"),
    ],
)
def test_as_source_rejects_bad_arrays(X: np.ndarray, message: str) -> None:
    with pytest.raises(MechanismError, match=message):
        as_source(X)


def test_error_never_contains_values() -> None:
    with pytest.raises(MechanismError) as info:
        as_source(np.array([[0.123456, 7.654321]]))
    assert "7.65" not in str(info.value)


@pytest.mark.parametrize(
    "X",
    [
        np.array([[0.0, np.nan], [np.inf, 0.5], [np.nan, 0.0]]),
        np.array([[0.0, 1.5], [-2.0, 0.0], [3.0, 0.0]]),
    ],
)
def test_error_carries_no_count(X: np.ndarray) -> None:
    # A failed measurement's message reaches the release's status and the budget is
    # refunded: a count of offending cells would be an exact statistic of the data.
    with pytest.raises(MechanismError) as info:
        as_source(X)
    assert not any(ch.isdigit() for ch in str(info.value).replace("[-1, 1]", ""))


def test_streaming_source_checked_while_read() -> None:
    class Lying(ArraySource):
        @property
        def n_rows(self) -> int:
            return 10

    source = Lying(np.zeros((4, 2)))
    with pytest.raises(MechanismError, match="different number of rows") as info:
        list(iter_checked(source))
    assert "4" not in str(info.value)
    assert "10" not in str(info.value)
