"""Row sources: how a mechanism reads a dataset that may not fit in memory.

A mechanism measures data through a :class:`RowSource`: the public shape
``(n_rows, n_cols)`` and a method that returns a *fresh* iterator of row batches on
every call (a mechanism that needs several passes, like private subspace iteration,
calls it several times). Batches are float64 arrays of shape ``(b, n_cols)`` with
values in ``[-1, 1]`` (the service normalises with the curator's declared bounds).

``as_source(X)`` wraps an in-memory array; the service passes its own source that
decrypts and streams Parquet row groups.

Sums over rows with a known rounding
------------------------------------
A mechanism's statistic is a sum of per-row terms, and its declared sensitivity must
bound the *computed* sum (:func:`app.mechanisms.noise.float_sensitivity`). A floating-point
sum evaluated as any binary tree in which no term passes through more than ``h``
additions is within ``gamma_h sum_i |t_i|`` of the exact sum (``gamma_h = h u / (1 - h
u)``, ``u = 2^-53``; Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2).
numpy's own reductions do not document their order (and ``total += block_sum`` over
streamed blocks is a chain as long as the number of blocks), so the mechanisms sum with
:func:`pairwise_total` (halving, depth ``ceil(log2 m)`` for ``m`` rows) inside a block and
:class:`StreamSum` (a binary counter, depth ``<= bit_length(K)`` for ``K`` blocks) across
blocks, whatever the batches are: for ``n`` rows the depth is at most
:func:`row_sum_depth` ``= 2 bit_length(n)`` (40 at ``n = 10^6``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


def pairwise_total(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Sum of ``values`` along axis 0 by halving, *in place* (``values`` is overwritten).

    Each level adds the second half onto the first (an unpaired middle row passes
    through), so every term goes through at most ``ceil(log2 m)`` additions for ``m``
    rows, and each is one correctly rounded elementwise addition (module doc).
    """
    m = values.shape[0]
    if m == 0:
        raise MechanismError("pairwise_total needs at least one row")
    while m > 1:
        half = (m + 1) // 2
        np.add(values[: m - half], values[half:m], out=values[: m - half])
        m = half
    out: NDArray[np.float64] = values[0]
    return out


class StreamSum:
    """Sum of streamed partial sums as a binary counter: ``levels[j]`` holds the sum of
    ``2^j`` partials (a perfect tree of depth ``j``), and :meth:`total` adds the levels
    from the lowest up. A partial goes through at most ``bit_length(K)`` additions for
    ``K`` calls to :meth:`add` (module doc), against ``K - 1`` for ``total += partial``.
    """

    def __init__(self) -> None:
        self._levels: list[NDArray[np.float64] | None] = []

    def add(self, partial: ArrayLike) -> None:
        carry = np.array(partial, dtype=np.float64, copy=True)
        for j, level in enumerate(self._levels):
            if level is None:
                self._levels[j] = carry
                return
            carry = level + carry
            self._levels[j] = None
        self._levels.append(carry)

    def total(self) -> NDArray[np.float64]:
        """The sum of every partial added (a copy; :meth:`add` may go on)."""
        out: NDArray[np.float64] | None = None
        for level in self._levels:
            if level is not None:
                out = level.copy() if out is None else out + level
        if out is None:
            raise MechanismError("StreamSum.total of no partial sums")
        return out


def row_sum_depth(n: int) -> int:
    """Bound on the additions any term goes through when ``n`` rows are summed in blocks
    by :func:`pairwise_total` and the blocks by :class:`StreamSum`: ``2 bit_length(n)``
    (``ceil(log2 m) <= bit_length(n)`` in a block of ``m <= n`` rows, ``bit_length(K) <=
    bit_length(n)`` for ``K <= n`` blocks)."""
    if n < 1:
        raise MechanismError(f"n ({n}) must be positive")
    return 2 * int(n).bit_length()


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


def progress_part(
    progress: Callable[[float], None] | None, start: float, stop: float
) -> Callable[[float], None] | None:
    """``progress`` of a part of the work: its fraction ``f`` as ``start + (stop - start) f``
    (``None`` if ``progress`` is)."""
    if progress is None:
        return None
    return lambda done: progress(start + (stop - start) * done)
