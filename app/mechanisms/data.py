"""Row sources: how a mechanism reads a dataset that may not fit in memory.

A mechanism measures data through a :class:`RowSource`: the public shape
``(n_rows, n_cols)`` and a method that returns a *fresh* iterator of row batches on
every call (a mechanism that needs several passes, like private subspace iteration,
calls it several times). Batches are float64 arrays of shape ``(b, n_cols)`` with
values in ``[-1, 1]`` (the service normalises with the curator's declared bounds).

``as_source(X)`` wraps an in-memory array; the service passes its own source that
decrypts and streams Parquet row groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms.errors import MechanismError

#: Default number of rows per batch for in-memory sources.
DEFAULT_BATCH_ROWS = 65_536


@runtime_checkable
class RowSource(Protocol):
    """A dataset normalised to ``[-1, 1]^d``, read in row batches."""

    @property
    def n_rows(self) -> int: ...

    @property
    def n_cols(self) -> int: ...

    def batches(self) -> Iterator[NDArray[np.float64]]:
        """A fresh iterator over ``(b, n_cols)`` float64 batches covering every row once."""
        ...


@dataclass(frozen=True)
class ArraySource:
    """A :class:`RowSource` over an in-memory ``(n, d)`` array."""

    array: NDArray[np.float64]
    batch_rows: int = DEFAULT_BATCH_ROWS

    @property
    def n_rows(self) -> int:
        return int(self.array.shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.array.shape[1])

    def batches(self) -> Iterator[NDArray[np.float64]]:
        for start in range(0, self.n_rows, self.batch_rows):
            yield self.array[start : start + self.batch_rows]


def check_batch(batch: NDArray[np.float64], n_cols: int) -> NDArray[np.float64]:
    """Check one batch: 2-D, ``n_cols`` columns, finite, inside ``[-1, 1]``.

    Raises :class:`MechanismError` with the kind of problem only: no values, no count
    of offending cells and no row count (the message reaches the release's status, and a
    count of cells past a threshold is an exact, un-noised statistic of the data; a
    graph's batch sizes would tell its private edge count).
    """
    if batch.ndim != 2 or batch.shape[1] != n_cols:
        raise MechanismError(f"a batch does not have {n_cols} columns")
    if not np.all(np.isfinite(batch)):
        raise MechanismError("data contains non-finite cells (NaN or infinite)")
    if np.any((batch < -1.0) | (batch > 1.0)):
        raise MechanismError(
            "data contains cells outside [-1, 1]; normalise with the declared bounds"
        )
    return batch


def as_source(X: ArrayLike | RowSource, batch_rows: int = DEFAULT_BATCH_ROWS) -> RowSource:
    """Wrap ``X`` as a :class:`RowSource`, validating an in-memory array up front.

    A ``RowSource`` passes through unchanged (its batches are validated as they are
    read, see :func:`check_batch`).
    """
    if isinstance(X, RowSource):
        if X.n_rows <= 0:
            raise MechanismError("the dataset is empty (n_rows = 0)")
        if X.n_cols <= 0:
            raise MechanismError("the dataset has no columns")
        return X
    array = np.asarray(X, dtype=np.float64)
    if array.ndim != 2:
        raise MechanismError(f"X must be a 2-D array (rows, columns); got {array.ndim} dimensions")
    if array.shape[0] == 0:
        raise MechanismError("the dataset is empty (n_rows = 0)")
    if array.shape[1] == 0:
        raise MechanismError("the dataset has no columns")
    check_batch(array, array.shape[1])
    return ArraySource(np.ascontiguousarray(array), batch_rows=batch_rows)


def iter_checked(source: RowSource) -> Iterator[NDArray[np.float64]]:
    """Iterate over a source's batches, validating each and the total row count."""
    seen = 0
    for batch in source.batches():
        batch = check_batch(np.asarray(batch, dtype=np.float64), source.n_cols)
        seen += batch.shape[0]
        yield batch
    if seen != source.n_rows:
        # Neither count in the message: a graph's stored row count is private.
        raise MechanismError("the source yielded a different number of rows than it declares")
