import numpy as np
import pytest

from app.mechanisms.data import ArraySource, as_source, iter_checked
from app.mechanisms.errors import MechanismError


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
