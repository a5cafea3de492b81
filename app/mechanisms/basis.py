"""Tensor Chebyshev basis of papers 000 and 001: index sets, evaluation, moments.

The basis functions are ``T_r(x) = prod_i T_{r_i}(x_i)`` for a multi-index
``r = (r_1, ..., r_d)`` of non-negative integers, where ``T_j(x) = cos(j arccos x)`` is
the Chebyshev polynomial of the first kind (the "trigonometric basis" of paper 000,
Algorithm 1 step 8, after the change of variables ``theta_i = arccos x_i``). Every
``|T_r(x)| <= 1`` on ``[-1, 1]^d``.

The *moments* of a dataset ``D`` of ``n`` rows are ``b_r = (1/n) sum_{x in D} T_r(x)``
(Algorithm 1 step 8). The constant function ``r = 0`` is always 1 and carries no
information, so no index set here contains it.

Index sets
----------
* :func:`full_tensor` -- ``{0, ..., t-1}^d`` minus the constant (Theorem 3.1 of paper
  000; ``t^d - 1`` functions), in mixed-radix order (``itertools.product``, last column
  fastest).
* :func:`total_degree` -- the ``R`` non-constant multi-indices of lowest total degree
  ``|r| = r_1 + ... + r_d`` (paper 000 §3.4, "a subset of size R ... preferred to lower
  degrees"). Order: total degree first, then *graded lexicographic* order with
  ``x_1 > x_2 > ... > x_d`` (a larger exponent on an earlier column comes first). For
  ``R = d`` this is exactly the ``d`` first-degree terms ``T_1(x_i) = x_i``, i.e. the
  column means; degree 2 starts ``T_2(x_1), T_1(x_1) T_1(x_2), ...``. When ``R`` stops
  inside a degree, the earlier columns get that degree's terms first.

The builders write the ``(R, d)`` array once, a degree (or a column) at a time with numpy:
``O(R d)`` time and memory. (A Python step per index and ``np.unique(axis=0)`` took 5.3 s
and 4x the set's memory for ``R = 666,666`` on 30 columns, now 0.3 s; ``np.eye`` per
one-column term made :func:`axis_total_degree` ``O(d^3)``: 18 s at ``d = 2000``.)
* :meth:`IndexSet.from_terms` -- any other set (e.g. chosen by a research variant).

Evaluation
----------
For a block of rows, a per-column table ``T_j(x_i)`` for ``j <= max degree`` (of the
columns the set uses, so a small set in many columns reads few) is built by
:func:`chebyshev_table` in one of two forms, chosen from the index set alone
(:attr:`IndexSet.table_form`):

* the three-term recurrence ``T_0 = 1, T_1 = x, T_{j+1} = 2 x T_j - T_{j-1}`` (stable on
  ``[-1, 1]``: the error after ``j`` steps stays below ``~j^2`` ulps), one vectorised step
  per degree over the table's width (used columns ``u`` x rows of a block). It is used when
  that width, at the default block size (``DEFAULT_BLOCK_ELEMENTS // R`` rows), exceeds
  :data:`NARROW_TABLE_WIDTH`: in one column for ``R <= 4,032``, in 30 columns for
  ``R <= 87,381``.
* the trigonometric form ``T_j(x) = cos(j arccos x)`` (``x`` clipped to ``[-1, 1]``;
  ``T_0 = 1`` and ``T_1 = x`` exactly as in the recurrence), every degree in one
  vectorised call, when the table is that narrow. A Python step per degree costs 3-6 us
  however narrow the table, while ``cos`` costs ~25 ns a value, so a narrow table of a high
  degree is where the recurrence was slow: ``d = 1, R = 10^6`` has one-row blocks of
  degree ``10^6``, 10^6 Python steps a row (about an hour for 569 rows, now ~25 s).

Accuracy, measured against a 50-digit reference for all degrees ``j <= 10^6`` at 16
points (``+-1``, 0, points within ``2^-52``, ``1e-9`` and ``1e-6`` of ``+-1``, random ones):
the recurrence errs by at most ``8.2e-9`` (at ``x = 1 - 2^-52``; below ``5e-13`` for
``|x| < 0.999``), the trigonometric form by at most ``4.9e-10`` (the rounding of
``j arccos x``, ``~ j u``); over the degrees ``<= 100`` both err by at most ``3e-14``,
``<= 1000`` by ``1e-12``. So the two forms differ by at most ``8.2e-9`` up to degree
``10^6`` (by at most ``5.8e-10`` at 96 random points and 32 within ``1e-6`` of ``+-1``).
The form depends on the set only, not on the block size, the batches or the other rows,
and both forms are elementwise (``np.arccos`` and ``np.cos`` give the same value for an
element wherever it sits in an array; a test checks this), so a row's computed ``T_r(x)``
is the same in every block it may be read in.

Each basis function is then the product of table rows over the *nonzero* entries of its
multi-index only (a degree-``k`` index in ``d = 100`` dimensions multiplies at most ``k``
rows, not 100). The table is clipped to ``[-1, 1]`` first, whichever form built it: the
computed recurrence can overshoot (``T_200`` reached ``1 + 1.3e-14``), clipping moves no
exact value, and a rounded product of numbers in ``[-1, 1]`` stays in ``[-1, 1]``, so
every computed ``T_r(x)`` obeys the ``|T_r| <= 1`` that the moments' sensitivity rests on
(:func:`app.mechanisms.noise.moment_sensitivity` adds the rounding of the sums).
Indices are grouped by their number of nonzero entries so each group is one vectorised
gather-and-multiply. Rows are processed in blocks of at most ``block_elements / R`` rows,
so memory stays bounded whatever ``n`` is (either form's table has the same size).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms.data import RowSource, StreamSum, as_source, iter_checked, pairwise_total
from app.mechanisms.errors import MechanismError

#: Default float64 elements in one evaluation block (``R x rows``): 2 MiB; cache-sized
#: blocks measured fastest.
DEFAULT_BLOCK_ELEMENTS = 1 << 18

#: Largest index set built by :func:`full_tensor` or :func:`total_degree`.
MAX_INDEX_SET_SIZE = 1_000_000

#: Most entries ``R x d`` of an index set that a mechanism builds from public parameters
#: (:func:`check_index_set_size`: a larger ``basis_size`` is refused, a larger default
#: lowered; a stored set is rebuilt whatever its size). The service builds and plans with
#: the set in a release request's check and preview, so the cost is the API's. Measured
#: at the limit (2 shared cores, load ~3): check and preview 1.1-1.9 s and +210 MB at
#: d = 2000, R = 10^4 (and at d = 200, R = 10^5); 1.7-2.3 s and +255 MB at d = 30,
#: R = 666,666 (the builder alone 0.1-0.75 s); loading such a synopsis 0.1-0.4 s and its
#: first answer 0.8-1.9 s. Beyond it the cost grows in proportion (R = 10^6 on 30 columns:
#: 3.1 s, +354 MB; 36 s and 1.9 GB before the builder was vectorised). 2000 columns, the
#: schema's most, keep R <= 10^4, five times the complete first-degree set.
MAX_INDEX_SET_ENTRIES = 20_000_000

#: Widest table (values per degree: used columns x rows of a default-sized block) that
#: :attr:`IndexSet.table_form` builds by the trigonometric form; wider ones use the
#: recurrence. Measured (2 shared cores): ``cos(j arccos x)`` is 2-10x faster a degree up
#: to width 64, about as fast at 96-128 and slower beyond (0.5x at 192).
NARROW_TABLE_WIDTH = 64

#: The forms of :func:`chebyshev_table`.
TABLE_FORMS = ("recurrence", "trigonometric")

_KINDS = ("full_tensor", "total_degree", "custom")


_NOT_COMPUTED = object()


@dataclass(frozen=True, eq=False)
class IndexSet:
    """Multi-indices ``r`` of the non-constant basis functions ``T_r``, one per row.

    ``degrees`` is an ``(R, d)`` integer array; row ``j`` is the multi-index of the
    ``j``-th basis function, and that order is the order of the moment vector. ``kind``
    and ``parameter`` say how the set was generated (``full_tensor`` with ``t``,
    ``total_degree`` with ``R``, or ``custom``) so that it serialises compactly.
    """

    degrees: NDArray[np.int64]
    kind: str = "custom"
    parameter: int = 0
    _sparse: tuple[tuple[NDArray[np.int64], NDArray[np.int64]], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        degrees = np.array(self.degrees, dtype=np.int64, copy=True)
        if degrees.ndim != 2 or degrees.shape[1] == 0:
            raise MechanismError(f"index set degrees must be a (R, d) array; got {degrees.shape}")
        if degrees.shape[0] == 0:
            raise MechanismError("index set is empty (R = 0); it needs at least one function")
        if np.any(degrees < 0):
            raise MechanismError("index set degrees must be non-negative integers")
        if np.any(degrees.sum(axis=1) == 0):
            raise MechanismError(
                "index set contains the constant function r = 0; it carries no information"
            )
        if _has_repeats(degrees):
            raise MechanismError("index set contains repeated multi-indices")
        if self.kind not in _KINDS:
            raise MechanismError(f"index set kind ({self.kind!r}) must be one of {_KINDS}")
        degrees.setflags(write=False)
        object.__setattr__(self, "degrees", degrees)
        object.__setattr__(self, "_sparse", _group_by_support(degrees))

    @classmethod
    def _built(cls, degrees: NDArray[np.int64], *, kind: str, parameter: int) -> IndexSet:
        """A set made by this module's builders, valid by construction (they are tested
        against a direct enumeration): ``degrees`` is taken as it is, without the copy and
        the checks of ``__post_init__``."""
        out = object.__new__(cls)
        degrees.setflags(write=False)
        object.__setattr__(out, "degrees", degrees)
        object.__setattr__(out, "kind", kind)
        object.__setattr__(out, "parameter", parameter)
        object.__setattr__(out, "_sparse", _group_by_support(degrees))
        return out

    @property
    def size(self) -> int:
        """``R``, the number of basis functions."""
        return int(self.degrees.shape[0])

    @property
    def dim(self) -> int:
        """``d``, the number of columns."""
        return int(self.degrees.shape[1])

    @cached_property
    def max_degree(self) -> int:
        """Largest single-column degree ``max_{r, i} r_i``."""
        return int(self.degrees.max())

    @cached_property
    def total_degrees(self) -> NDArray[np.int64]:
        """``|r|`` for every index."""
        out: NDArray[np.int64] = self.degrees.sum(axis=1)
        out.setflags(write=False)
        return out

    @property
    def parent_chain(
        self,
    ) -> tuple[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]], ...] | None:
        """Levels ``(rows, parents, last)``: ``T_r = T_parent(r) * T_{r_j}(x_j)`` on each
        level (how :mod:`~app.mechanisms.chebyshev` expands a product query over the set).

        ``j`` is the last nonzero column of ``r`` and ``parent(r)`` is ``r`` with
        ``r_j = 0`` (``-1``: the constant), as ``last = r_j d + j``. Levels follow the
        support size, so parents come first. ``None`` when some parent is missing (a set
        that is not closed under dropping a column; full tensors and total-degree sets
        always are).

        Kept on the set (in its ``__dict__``, as ``_parent_chain``), so it lives as long as
        the set and a cached release's footprint counts it: a module-level cache keyed by
        the set (sets compare by identity) held the last 8 sets decoded and their chains,
        58 MB each at R = 2 10^5 and d = 30 (the degrees 48 MB, the chain 6.4 MB), outside
        the answer cache's byte limit. Not a ``cached_property``: on Python 3.11 its lock
        is one for every set, so one large set's first chain held up every other set's in
        other request threads. Two threads may both compute it the first time; the chains
        are equal.
        """
        cached = self.__dict__.get("_parent_chain", _NOT_COMPUTED)
        if cached is not _NOT_COMPUTED:
            return cached  # type: ignore[no-any-return]
        chain = self._compute_parent_chain()
        self.__dict__["_parent_chain"] = chain
        return chain

    def _compute_parent_chain(
        self,
    ) -> tuple[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]], ...] | None:
        deg = self.degrees
        R, d = deg.shape
        support = np.count_nonzero(deg, axis=1)
        last_col = d - 1 - np.argmax(deg[:, ::-1] > 0, axis=1)
        rows_all = np.arange(R)
        last = deg[rows_all, last_col] * d + last_col
        parent_rows = deg.copy()
        parent_rows[rows_all, last_col] = 0
        lookup = {row.tobytes(): i for i, row in enumerate(deg)}
        parents = np.full(R, -1, dtype=np.int64)
        for i in np.flatnonzero(support > 1):
            found = lookup.get(parent_rows[i].tobytes())
            if found is None:
                return None
            parents[i] = found
        levels = []
        for s in np.unique(support):
            rows = np.flatnonzero(support == s)
            levels.append((rows, parents[rows], last[rows]))
        return tuple(levels)

    def first_degree_positions(self) -> NDArray[np.int64]:
        """Position in this set of ``T_1(x_i) = x_i`` for each column ``i``, or -1 if absent.

        The moments at these positions are the column means (used as the PCA-grid centre).
        """
        positions = np.full(self.dim, -1, dtype=np.int64)
        rows, columns, degrees = self.one_column_terms()
        first = degrees == 1
        positions[columns[first]] = rows[first]
        return positions

    @cached_property
    def support(self) -> NDArray[np.int64]:
        """Number of nonzero entries (columns) of every index."""
        out = np.empty(self.size, dtype=np.int64)
        for positions, flat in self._sparse:
            out[positions] = flat.shape[1]
        out.setflags(write=False)
        return out

    @cached_property
    def _table_plan(
        self,
    ) -> tuple[NDArray[np.int64] | None, tuple[tuple[NDArray[np.int64], NDArray[np.int64]], ...]]:
        """``(columns, groups)`` for :func:`_evaluate_block`: the columns the set uses
        (``None``: all of them) and ``_sparse`` with its table rows ``deg * u + j`` in a
        table of those ``u`` columns only (``j`` a column's place among them)."""
        used = np.zeros(self.dim, dtype=bool)
        for _, flat in self._sparse:
            used[np.unique(flat % self.dim)] = True
        if used.all():
            return None, self._sparse
        columns = np.flatnonzero(used)
        place = np.cumsum(used) - 1
        groups = []
        for positions, flat in self._sparse:
            compact = flat // self.dim * columns.size + place[flat % self.dim]
            compact.setflags(write=False)
            groups.append((positions, compact))
        return columns, tuple(groups)

    @cached_property
    def table_form(self) -> str:
        """The form of :func:`chebyshev_table` that :meth:`evaluate` and :func:`moments`
        use for this set: ``"trigonometric"`` when the table of a block at the default
        block size is narrow (used columns ``u`` x ``DEFAULT_BLOCK_ELEMENTS // R`` rows
        ``<=`` :data:`NARROW_TABLE_WIDTH`), else ``"recurrence"`` (module docstring). It
        depends on the set alone, not on a call's ``block_elements`` or rows, so a row's
        computed values are the same in every block."""
        columns, _ = self._table_plan
        used = self.dim if columns is None else int(columns.size)
        width = used * _block_rows(self.size, DEFAULT_BLOCK_ELEMENTS)
        return "trigonometric" if width <= NARROW_TABLE_WIDTH else "recurrence"

    def one_column_terms(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """``(rows, columns, degrees)`` of the indices ``k e_i`` (one nonzero column):
        ``degrees[rows[j], columns[j]] = degrees_out[j] = k``, rows ascending."""
        for positions, flat in self._sparse:
            if flat.shape[1] == 1:
                return positions.copy(), flat[:, 0] % self.dim, flat[:, 0] // self.dim
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()

    def evaluate(
        self, X: ArrayLike, *, block_elements: int = DEFAULT_BLOCK_ELEMENTS
    ) -> NDArray[np.float64]:
        """``(R, m)`` matrix of ``T_r(x)`` for the ``m`` rows ``x`` of ``X`` (in ``[-1, 1]^d``).

        This is the LP matrix ``W`` of paper 000 (Algorithm 1 step 14) when ``X`` holds
        the candidate support points. The result itself has ``R m`` elements; the work
        space beyond it is bounded by ``block_elements``.
        """
        points = _as_points(X, self.dim)
        out = np.empty((self.size, points.shape[0]), dtype=np.float64)
        for start, stop in _row_blocks(points.shape[0], self.size, block_elements):
            _evaluate_block(self, points[start:stop], out[:, start:stop])
        return out

    def to_dict(self) -> dict[str, object]:
        """JSON-safe description; ``custom`` sets list each index's nonzero ``[col, deg]``."""
        data: dict[str, object] = {"kind": self.kind, "d": self.dim, "size": self.size}
        if self.kind == "full_tensor":
            data["t"] = self.parameter
        elif self.kind == "custom":
            data["terms"] = [
                [[int(i), int(row[i])] for i in np.flatnonzero(row)] for row in self.degrees
            ]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> IndexSet:
        kind = str(data["kind"])
        d = int(data["d"])  # type: ignore[call-overload]
        size = int(data["size"])  # type: ignore[call-overload]
        if kind == "full_tensor":
            out = full_tensor(d, int(data["t"]))  # type: ignore[call-overload]
        elif kind == "total_degree":
            out = total_degree(d, size)
        elif kind == "custom":
            terms = data["terms"]
            assert isinstance(terms, list)
            out = cls.from_terms(d, terms)
        else:
            raise MechanismError(f"index set kind ({kind!r}) must be one of {_KINDS}")
        if out.size != size:
            raise MechanismError(f"index set size ({out.size}) does not match its record ({size})")
        return out

    @classmethod
    def from_terms(cls, d: int, terms: list[list[list[int]]]) -> IndexSet:
        """Build a ``custom`` set from sparse terms: each index is a list of ``[col, deg]``."""
        degrees = np.zeros((len(terms), d), dtype=np.int64)
        for j, term in enumerate(terms):
            for col, deg in term:
                if not 0 <= col < d:
                    raise MechanismError(f"index set column ({col}) must lie in [0, {d})")
                degrees[j, col] = deg
        return cls(degrees, kind="custom")

    def same_as(self, other: IndexSet) -> bool:
        """Same multi-indices in the same order."""
        return self.degrees.shape == other.degrees.shape and bool(
            np.array_equal(self.degrees, other.degrees)
        )


def full_tensor(d: int, t: int) -> IndexSet:
    """``{0, ..., t-1}^d`` minus the constant: Theorem 3.1's ``t^d - 1`` basis functions.

    Order: mixed radix with the last column varying fastest (``itertools.product``),
    the all-zero index dropped.
    """
    _check_positive_int("d", d)
    _check_positive_int("t", t)
    if t < 2:
        raise MechanismError(f"t ({t}) must be at least 2 (t = 1 leaves only the constant)")
    size = t**d - 1
    if size > MAX_INDEX_SET_SIZE:
        raise MechanismError(
            f"the full tensor basis has t^d - 1 = {t}^{d} - 1 functions, more than "
            f"{MAX_INDEX_SET_SIZE}; use the total-degree basis (basis_size=R) instead"
        )
    # row j is j + 1 written in base t, most significant digit first (itertools.product
    # order with the all-zero index dropped)
    codes = np.arange(1, size + 1, dtype=np.int64)
    grid = np.empty((size, d), dtype=np.int64)
    for i in range(d - 1, -1, -1):
        np.remainder(codes, t, out=grid[:, i])
        codes //= t
    return IndexSet._built(grid, kind="full_tensor", parameter=t)


def total_degree(d: int, R: int) -> IndexSet:
    """The first ``R`` non-constant multi-indices in graded lexicographic order.

    Total degree ``|r|`` ascending; within a degree, lexicographically *descending*
    (``(2,0,0), (1,1,0), (1,0,1), (0,2,0), (0,1,1), (0,0,2)``). Paper 000 §3.4 and
    appendix A.5 use "R basis functions preferred to lower degrees"; this fixes the
    order the paper leaves open.
    """
    _check_positive_int("d", d)
    _check_positive_int("R", R)
    if R > MAX_INDEX_SET_SIZE:
        raise MechanismError(f"basis size R ({R}) must be at most {MAX_INDEX_SET_SIZE}")
    degrees = np.zeros((R, d), dtype=np.int64)
    _fill_total_degree(degrees)
    return IndexSet._built(degrees, kind="total_degree", parameter=R)


def axis_total_degree(d: int, max_degree: int, axis_degree: int) -> IndexSet:
    """``{r : |r| <= D} u {k e_i : k <= K}`` minus the constant (``D = max_degree``,
    ``K = axis_degree >= D``): every interaction up to total degree ``D`` plus each
    column's own Chebyshev polynomials up to degree ``K``.

    Order: the total-degree set in :func:`total_degree`'s order, then ``k e_i`` by degree
    ``k = D+1..K`` and column. ``count_total_degree(d, D) + d (K - D)`` functions. Closed
    under dropping a column, like the total-degree set. The one-column terms are where a
    smooth query's truncation error on real data concentrates (their moments, e.g. ``E
    T_2(x_i) = 2 E x_i^2 - 1``, share one sign across columns); see
    :mod:`app.mechanisms.smooth_synopsis`.
    """
    _check_positive_int("d", d)
    _check_positive_int("max_degree", max_degree)
    _check_positive_int("axis_degree", axis_degree)
    if axis_degree < max_degree:
        raise MechanismError(
            f"axis_degree ({axis_degree}) must be at least max_degree ({max_degree})"
        )
    size = count_total_degree(d, max_degree) + d * (axis_degree - max_degree)
    if size > MAX_INDEX_SET_SIZE:
        raise MechanismError(f"the index set has {size} functions, more than {MAX_INDEX_SET_SIZE}")
    base = count_total_degree(d, max_degree)
    degrees = np.zeros((size, d), dtype=np.int64)
    _fill_total_degree(degrees[:base])
    # k e_i for k = D+1..K (outer) and i = 0..d-1 (inner)
    rows = np.arange(base, size)
    extra = rows - base
    degrees[rows, extra % d] = max_degree + 1 + extra // d
    return IndexSet._built(degrees, kind="custom", parameter=0)


def largest_index_set_size(d: int) -> int:
    """The largest ``R`` of an index set in ``d`` columns that a mechanism builds: at most
    :data:`MAX_INDEX_SET_ENTRIES` entries ``R x d`` and :data:`MAX_INDEX_SET_SIZE`."""
    _check_positive_int("d", d)
    return min(MAX_INDEX_SET_SIZE, MAX_INDEX_SET_ENTRIES // d)


def check_index_set_size(d: int, size: int, what: str = "basis_size") -> None:
    """Refuse an index set of ``size`` functions in ``d`` columns beyond
    :func:`largest_index_set_size`, from these public numbers, before it is built."""
    largest = largest_index_set_size(d)
    if size <= largest:
        return
    if size > MAX_INDEX_SET_SIZE:
        reason = f"more than R = {MAX_INDEX_SET_SIZE} functions"
    else:
        reason = (
            f"an index set of R x d = {size * d} entries, past the limit of "
            f"{MAX_INDEX_SET_ENTRIES} (MAX_INDEX_SET_ENTRIES: building and planning with it "
            "take time and memory in proportion)"
        )
    raise MechanismError(
        f"{what} {size} over {d} columns is {reason}: at most basis_size = {largest} for "
        f"{d} columns"
    )


def count_total_degree(d: int, max_degree: int) -> int:
    """Number of non-constant multi-indices in ``d`` variables with ``|r| <= max_degree``."""
    return math.comb(max_degree + d, d) - 1


def chebyshev_table(x: ArrayLike, max_degree: int, form: str = "recurrence") -> NDArray[np.float64]:
    """``T_j(x)`` for ``j = 0..max_degree``, by the three-term recurrence (``form =
    "recurrence"``) or as ``cos(j arccos x)`` (``form = "trigonometric"``, ``x`` clipped to
    ``[-1, 1]``; ``T_0 = 1`` and ``T_1 = x`` in both).

    The recurrence takes a Python step per degree, the trigonometric form one vectorised
    call for all of them (slower a value, faster for a narrow ``x`` of a high degree); the
    module docstring gives their accuracy. The result has shape
    ``(max_degree + 1,) + x.shape``.
    """
    if form not in TABLE_FORMS:
        raise MechanismError(f"form ({form!r}) must be one of {TABLE_FORMS}")
    values = np.asarray(x, dtype=np.float64)
    table = np.empty((max_degree + 1, *values.shape), dtype=np.float64)
    table[0] = 1.0
    if max_degree >= 1:
        table[1] = values
    if form == "trigonometric":
        if max_degree >= 2:
            high = table[2:]  # T_j = cos(j theta), j >= 2, computed in place
            theta = np.arccos(np.clip(values, -1.0, 1.0))
            np.multiply.outer(np.arange(2, max_degree + 1, dtype=np.float64), theta, out=high)
            np.cos(high, out=high)
        return table
    for j in range(1, max_degree):
        np.multiply(values, table[j], out=table[j + 1])
        table[j + 1] *= 2.0
        table[j + 1] -= table[j - 1]
    return table


def moments(
    X: ArrayLike | RowSource,
    index_set: IndexSet,
    *,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    progress: Callable[[float], None] | None = None,
) -> NDArray[np.float64]:
    """Exact moments ``b_r = (1/n) sum_x T_r(x)`` (paper 000, Algorithm 1 step 8).

    Streams the rows of a :class:`RowSource` once, in blocks of at most
    ``block_elements / R`` rows, so memory is ``O(block_elements + R)`` whatever ``n``.
    This is the exact, *non-private* statistic: the mechanisms add calibrated noise to
    it (:mod:`app.mechanisms.noise`) before anything leaves the measure step. Each block
    is summed by :func:`~app.mechanisms.data.pairwise_total` and the blocks by a
    :class:`~app.mechanisms.data.StreamSum`, so every coordinate is within
    :func:`app.mechanisms.noise.mean_rounding` ``(n)`` of the exact mean of the computed
    ``T_r(x)`` (all in ``[-1, 1]``), whatever the batches.

    ``progress``, if given, is called after each block with the share of the ``n`` rows
    summed so far (``n`` is the table's public row count): at ``R = 10^5`` a block is a
    couple of rows, and the reader's own progress, per batch read, came before any of the
    work.
    """
    source = as_source(X)
    if source.n_cols != index_set.dim:
        raise MechanismError(
            f"the data has {source.n_cols} columns but the index set has d = {index_set.dim}"
        )
    totals = StreamSum()
    work = np.empty((_block_rows(index_set.size, block_elements), index_set.size), dtype=np.float64)
    done = 0
    for batch in iter_checked(source):
        for start, stop in _row_blocks(batch.shape[0], index_set.size, block_elements):
            block = work[: stop - start]  # (rows, R): the halving adds contiguous rows
            _evaluate_block(index_set, batch[start:stop], block.T)
            totals.add(pairwise_total(block))
            if progress is not None:
                done += stop - start
                progress(min(1.0, done / max(source.n_rows, 1)))
    out: NDArray[np.float64] = totals.total() / source.n_rows
    return out


# --- internals ---------------------------------------------------------------------------


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise MechanismError(f"{name} ({value!r}) must be a positive integer")


def _fill_total_degree(out: NDArray[np.int64]) -> None:
    """Write the first ``R`` non-constant multi-indices of :func:`total_degree`'s order into
    the zeroed ``(R, d)`` array ``out``, a whole degree at a time, in ``O(R d)``.

    A degree-``k`` index ``r`` is the non-decreasing list of ``k`` columns that holds column
    ``i`` ``r_i`` times (``(1, 0, 2)`` is ``[0, 2, 2]``), and the lexicographically
    descending order of the indices is the ascending order of these lists. So the degree-``k``
    indices are, for ``p = 0, 1, ..., d - 1`` in turn, ``e_p`` plus each degree-``(k - 1)``
    index whose first nonzero column is ``p`` or later, in their own order: a suffix of the
    previous degree's block, since that block is sorted by its first nonzero column.
    """
    R, d = out.shape
    if d == 1:
        out[:, 0] = np.arange(1, R + 1)
        return
    count = min(d, R)  # degree 1: e_0, ..., e_{d-1}
    out[np.arange(count), np.arange(count)] = 1
    first = np.arange(count)  # first nonzero column of each row of the last degree
    start, stop = 0, count
    columns = np.arange(d)
    while stop < R:  # the last degree is complete: [start, stop) holds all of it
        begin = np.searchsorted(first, columns, side="left")  # suffix of e_p's block
        sizes = (stop - start) - begin
        ends = np.cumsum(sizes)
        count = min(int(ends[-1]), R - stop)
        i = np.arange(count)
        p = np.searchsorted(ends, i, side="right")
        source = begin[p] + i - (ends[p] - sizes[p])
        block = out[stop : stop + count]
        np.take(out[start:stop], source, axis=0, out=block, mode="clip")
        block[i, p] += 1
        first = p
        start, stop = stop, stop + count


#: Entries of an index set read at once by :func:`_group_by_support`.
_GROUP_BLOCK_ENTRIES = 1 << 20

#: Multipliers of the row hash of :func:`_has_repeats` (fixed: the check is deterministic).
_HASH_SEED = 0x1DE5E7


def _has_repeats(degrees: NDArray[np.int64]) -> bool:
    """Whether two rows of ``degrees`` are equal, in ``O(R d)`` time and ``O(R)`` memory
    beyond the array (``np.unique(axis=0)`` sorted whole rows, with several copies of the
    set): rows with equal 64-bit hashes (a wrapped dot product with random multipliers)
    are the only candidates, and those are compared exactly."""
    R, d = degrees.shape
    if R < 2:
        return False
    weights = np.random.default_rng(_HASH_SEED).integers(
        -(2**62), 2**62, size=d, dtype=np.int64, endpoint=True
    )
    hashes = degrees @ weights  # integer overflow wraps: still a hash
    order = np.argsort(hashes)
    same = hashes[order[1:]] == hashes[order[:-1]]
    if not same.any():
        return False
    marked = np.zeros(R, dtype=bool)
    marked[1:] |= same
    marked[:-1] |= same
    candidates = degrees[order[marked]]
    return bool(np.unique(candidates, axis=0).shape[0] < candidates.shape[0])


def _group_by_support(
    degrees: NDArray[np.int64],
) -> tuple[tuple[NDArray[np.int64], NDArray[np.int64]], ...]:
    """Group indices by number of nonzero entries ``s``.

    Each group is ``(positions, flat)``: the group's rows in the index set, and an
    ``(R_s, s)`` array of table rows ``deg * d + col`` to multiply together. The set is
    read in consecutive blocks of about :data:`_GROUP_BLOCK_ENTRIES` entries, so the work
    space beyond the result stays small whatever the size of the set.
    """
    R, d = degrees.shape
    step = max(1, _GROUP_BLOCK_ENTRIES // d)
    support = np.empty(R, dtype=np.int64)
    for start in range(0, R, step):
        support[start : start + step] = np.count_nonzero(degrees[start : start + step], axis=1)
    positions = {int(s): np.flatnonzero(support == s) for s in np.unique(support)}
    flats = {s: np.empty((rows.size, s), dtype=np.int64) for s, rows in positions.items()}
    filled = dict.fromkeys(flats, 0)
    for start in range(0, R, step):
        block = degrees[start : start + step]
        rows, cols = np.nonzero(block)  # row by row, columns ascending
        flat = block[rows, cols] * d + cols
        block_support = support[start : start + step]
        for s in np.unique(block_support).tolist():
            values = flat[np.repeat(block_support == s, block_support)].reshape(-1, s)
            flats[s][filled[s] : filled[s] + values.shape[0]] = values
            filled[s] += values.shape[0]
    groups = []
    for s, rows in positions.items():
        rows.setflags(write=False)
        flats[s].setflags(write=False)
        groups.append((rows, flats[s]))
    return tuple(groups)


def _as_points(X: ArrayLike, d: int) -> NDArray[np.float64]:
    points = np.asarray(X, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != d:
        raise MechanismError(f"points must be a (m, {d}) array; got shape {points.shape}")
    if not np.all(np.isfinite(points)) or np.any(np.abs(points) > 1.0):
        raise MechanismError("points must be finite and lie in [-1, 1]^d")
    return points


def _block_rows(R: int, block_elements: int) -> int:
    if block_elements < 1:
        raise MechanismError(f"block_elements ({block_elements}) must be positive")
    return max(1, block_elements // max(R, 1))


def _row_blocks(m: int, R: int, block_elements: int) -> Iterator[tuple[int, int]]:
    step = _block_rows(R, block_elements)
    for start in range(0, m, step):
        yield start, min(start + step, m)


def _evaluate_block(
    index_set: IndexSet, rows: NDArray[np.float64], out: NDArray[np.float64]
) -> None:
    """Write ``T_r(x)`` for the rows of ``rows`` into ``out`` (shape ``(R, len(rows))``).

    The table holds only the columns the set uses: a small set in many columns (``R = 1``
    in ``d = 2000``) made a table of ``2 d`` values a row, twice a whole batch (2 GB for
    65,536 rows) and 130 us a row for one moment. Each value is the same as in a table of
    every column of the same form (both forms are elementwise)."""
    columns, groups = index_set._table_plan
    values = rows.T if columns is None else rows[:, columns].T
    # table[(deg * u + j), row] = T_deg(x_row, columns[j]), clipped to [-1, 1] (module doc)
    table = chebyshev_table(values, index_set.max_degree, index_set.table_form)
    table = table.reshape(-1, rows.shape[0])
    np.clip(table, -1.0, 1.0, out=table)
    for positions, flat in groups:
        values = table[flat[:, 0]]
        for p in range(1, flat.shape[1]):
            values *= table[flat[:, p]]
        out[positions] = values
