"""Cut-function release for graphs: paper 004 (Wang, Ying, Zhang), §VI-B.

Mechanism
---------
The graph ``G = (V, E)`` (vertex ids ``0..|V|-1``, ``|V|`` public) is the database of
its vertex-pair bits ``x_{ij} = [{i, j} in E]``, one row per unordered pair ``i < j``
(the undirected form of the paper's ``|V|^2`` rows: an edge is one bit, so a
neighbouring graph differs in exactly one row). Mechanism E with ``l = 1`` flips every
bit independently with probability ``p = e^-eps / (1 + e^-eps) = 1 / (1 + e^eps)`` and
releases the noisy graph: its packed pair bits (:func:`release_pair_bits`, the form the
service stores) or its edge list (:func:`release`).

Privacy (edge-level epsilon-DP)
-------------------------------
Bits are flipped independently, so for graphs differing in one pair the output
probability ratio is that of one bit: ``max((1 - p)/p, p/(1 - p)) = (1 - p)/p``, which
is ``e^eps`` at the paper's ``p`` and decreases as ``p`` grows towards 1/2. The sampler
flips when ``U < T`` (``U`` a uniform 64-bit word from OpenDP's CSPRNG, see
:mod:`app.mechanisms.secure_random`) with ``T = ceil(p 2^64) + 1`` from a 60-digit
computation of ``p``, capped at ``2^63`` (``p = 1/2``). So the flip probability is
exactly ``T / 2^64 >= p`` and :attr:`GraphRelease.epsilon_effective` ``= ln((2^64 - T)/T)``
never exceeds the requested epsilon. 8.2 million pairs (``|V| = 4039``) need 66 MB of
secure bytes, about 50 ms; OpenDP's ``make_randomized_response_bitvec`` draws the same
per-bit Bernoulli one FFI call per bit (~8 s here).

Estimator (34) and error (35)
-----------------------------
For disjoint ``S, T`` the cut ``q_{S,T}(x) = sum_{i in S, j in T} x_{ij}`` covers
``|S||T|`` distinct pairs, each released with ``E[y] = (1 - 2p) x + p``. The estimator

    q_hat = (q_{S,T}(y) - p |S||T|) / (1 - 2p)

is eq. 34 at the paper's ``p`` (``1/(1 - 2p) = (1 + e^-eps)/(1 - e^-eps)`` and
``p/(1 - 2p) = e^-eps/(1 - e^-eps)``) and exactly unbiased at the sampler's ``p``. Its
variance ``|S||T| p (1 - p) / (1 - 2p)^2`` does not depend on the graph, so
:meth:`GraphRelease.stderr` is exact; :meth:`GraphRelease.bound` is bound (35),
``E|q_hat - q| <= sqrt(|S||T|) / (1 - 2p)``, at least twice the standard error.

Confidence interval
-------------------
:meth:`GraphRelease.interval`. The noisy cut ``N = q_{S,T}(y)`` of a cut with ``e`` edges
among ``k = |S||T|`` pairs is ``Bin(e, 1 - p) + Bin(k - e, p)``, stochastically increasing
in ``e`` (``1 - p > p``). When its variance ``v = k p (1 - p)`` is below
:data:`EXACT_INTERVAL_VARIANCE`, the interval inverts that law (the Clopper-Pearson
construction): ``e`` is kept when ``P_e(N <= n) > a`` and ``P_e(N >= n) > a``,
``a = (1 - level) / 2``, so its coverage is at least ``level`` whatever the graph; it lies
in ``[0, k]``. Above it, the normal interval ``q_hat +- z sd`` (clipped to ``[0, k]``):
the skewness ``(1 - 2p) / sqrt(v)`` is then at most 0.05. The normal interval alone covered
0.90 on 6-pair cuts at ``epsilon = 4`` and 0.91 on 2000-pair cuts at ``epsilon = 8``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Context, Decimal
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import sparse, special

from app.mechanisms import secure_random
from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import CostPart, PrivacyCost, check_budget

#: The release is dense (about ``p |V|^2 / 2`` noisy edges); beyond this it stops being practical.
MAX_VERTICES = 20_000

#: Below this variance ``k p (1 - p)`` of a noisy cut, :meth:`GraphRelease.interval` is
#: exact (module docstring); above it, normal.
EXACT_INTERVAL_VARIANCE = 400.0

#: Vertex pairs perturbed per block (a multiple of 8, so a block is whole bytes of the
#: packed pair bits; its working memory is ~40 MB of random words and bits).
_BLOCK_PAIRS = 1 << 22

_DIGITS = 60

VertexSet = ArrayLike


def flip_threshold(epsilon: float) -> int:
    """``T`` of the flip coin ``U < T``: ``ceil(2^64 / (1 + e^eps)) + 1``, capped at ``2^63``."""
    check_budget(epsilon, 0.0)
    ctx = Context(prec=_DIGITS)
    p = ctx.divide(Decimal(1), ctx.add(Decimal(1), ctx.exp(Decimal(epsilon))))
    return min(secure_random.threshold(p, "up") + 1, 1 << 63)


def effective_epsilon(threshold: int) -> float:
    """Privacy loss of flipping with probability ``T / 2^64 <= 1/2``: ``ln((2^64 - T) / T)``."""
    ctx = Context(prec=_DIGITS)
    ratio = ctx.divide(Decimal(secure_random.TWO_64 - threshold), Decimal(threshold))
    return float(ctx.ln(ratio))


def _check_vertices(n_vertices: object) -> int:
    if isinstance(n_vertices, bool) or not isinstance(n_vertices, int | np.integer):
        raise MechanismError("n_vertices must be an integer")
    count = int(n_vertices)
    if not 2 <= count <= MAX_VERTICES:
        raise MechanismError(f"n_vertices ({count}) must lie in [2, {MAX_VERTICES}]")
    return count


def _row_starts(n_vertices: int) -> NDArray[np.int64]:
    """Index of pair ``(i, i + 1)`` in the upper-triangle order, for ``i = 0..|V|``."""
    i = np.arange(n_vertices + 1, dtype=np.int64)
    return i * (2 * n_vertices - i - 1) // 2


def pair_index(u: NDArray[np.int64], v: NDArray[np.int64], n_vertices: int) -> NDArray[np.int64]:
    """Upper-triangle index of pairs ``u < v``."""
    return u * (2 * n_vertices - u - 1) // 2 + (v - u - 1)


def _check_edges(edges: ArrayLike, n_vertices: int) -> NDArray[np.int64]:
    """Validate an undirected edge list; return the sorted pair indices of its edges.

    Messages give counts, never vertex ids.
    """
    array = np.asarray(edges)
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.ndim != 2 or array.shape[1] != 2:
        raise MechanismError(f"edges must have shape (k, 2); got {array.shape}")
    if array.dtype.kind not in "iu":
        raise MechanismError("edges must hold integer vertex ids")
    array = array.astype(np.int64)
    # the messages give no counts and no vertex ids: on the measure path (a stored graph
    # that no longer passes its upload's checks) they reach the release's status
    if np.any((array < 0) | (array >= n_vertices)):
        raise MechanismError(f"edges has vertex ids outside [0, {n_vertices})")
    if np.any(array[:, 0] == array[:, 1]):
        raise MechanismError("edges has self-loops; a pair needs two vertices")
    u = array.min(axis=1)
    v = array.max(axis=1)
    index = np.sort(pair_index(u, v, n_vertices))
    if np.any(np.diff(index) == 0):
        raise MechanismError(DUPLICATES_MESSAGE)
    return index


def pair_bytes(n_vertices: int) -> int:
    """Bytes of a graph's packed pair bits: ``ceil(|V| (|V| - 1) / 16)``, 25 MB at 20,000
    vertices."""
    return (n_vertices * (n_vertices - 1) // 2 + 7) // 8


def add_pairs(bits: NDArray[np.uint8], index: NDArray[np.int64]) -> None:
    """Set, in place, the bits of the pairs ``index`` (upper-triangle order,
    :func:`pair_index`) in the packed pair bits ``bits`` (``np.packbits`` order: pair
    ``k`` is bit ``7 - k mod 8`` of byte ``k // 8``); a pair listed twice is set once."""
    shifts = (index & 7).astype(np.uint8)
    np.bitwise_or.at(bits, index >> 3, np.right_shift(np.uint8(0x80), shifts))


def pair_count(bits: NDArray[np.uint8]) -> int:
    """Number of set pair bits (edges) in packed pair bits."""
    return int(np.bitwise_count(bits).sum(dtype=np.int64))


def pair_bits_of(edge_blocks: Iterable[ArrayLike], n_vertices: int) -> NDArray[np.uint8]:
    """The graph's pair bits ``x_ij`` packed (:func:`add_pairs`' order), from its edges in
    blocks of ``(k, 2)`` vertex ids in either orientation. Each block is checked as
    :func:`release` checks an edge list, and no edge may appear twice across blocks either
    (messages give neither counts nor vertex ids). Holds the bits (:func:`pair_bytes`) and one
    block, never the whole edge list."""
    count = _check_vertices(n_vertices)
    bits = np.zeros(pair_bytes(count), dtype=np.uint8)
    listed = 0
    for block in edge_blocks:
        index = _check_edges(block, count)
        add_pairs(bits, index)
        listed += index.size
    if listed != pair_count(bits):
        raise MechanismError(DUPLICATES_MESSAGE)
    return bits


DUPLICATES_MESSAGE = (
    "edges has duplicate edges (an undirected edge listed twice, in either orientation)"
)


def _perturb(
    true_bits: NDArray[np.uint8],
    n_vertices: int,
    threshold: int,
    progress: Callable[[float], None] | None = None,
) -> NDArray[np.uint8]:
    """``y = x XOR b`` on the packed pair bits: each ``b_ij`` is 1 w.p. ``threshold / 2^64``
    (:func:`secure_random.bernoulli`), :data:`_BLOCK_PAIRS` pairs (whole bytes) at a time.
    The padding bits after the last pair stay 0. A new array. ``progress``, if given, is
    called after each block with the share of the ``|V| (|V| - 1) / 2`` pairs drawn (a
    function of the public ``|V|`` only)."""
    noisy = np.array(true_bits, dtype=np.uint8, copy=True)
    pairs = n_vertices * (n_vertices - 1) // 2
    for lo in range(0, pairs, _BLOCK_PAIRS):
        hi = min(lo + _BLOCK_PAIRS, pairs)
        noisy[lo // 8 : (hi + 7) // 8] ^= np.packbits(secure_random.bernoulli(hi - lo, threshold))
        if progress is not None:
            progress(hi / pairs)
    return noisy


def _as_mask(vertices: VertexSet, n_vertices: int, name: str) -> NDArray[np.bool_]:
    if isinstance(vertices, list | tuple) and any(
        isinstance(v, int) and not 0 <= v < n_vertices for v in vertices
    ):  # before numpy: an id beyond int64 (10^23) would make an object array
        raise MechanismError(f"{name} has vertex ids outside [0, {n_vertices})")
    array = np.asarray(vertices)
    if array.dtype == np.bool_:
        if array.shape != (n_vertices,):
            raise MechanismError(f"{name} as a mask must have shape ({n_vertices},)")
        return array
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise MechanismError(f"{name} must be a 1-D array of vertex ids or a boolean mask")
    ids = array.astype(np.int64)
    if np.count_nonzero((ids < 0) | (ids >= n_vertices)):
        raise MechanismError(f"{name} has vertex ids outside [0, {n_vertices})")
    mask = np.zeros(n_vertices, dtype=np.bool_)
    mask[ids] = True
    if int(mask.sum()) != ids.size:
        raise MechanismError(f"{name} lists a vertex more than once")
    return mask


class _NoisyGraph:
    """The public parameters of a released noisy graph: ``|V|``, epsilon, the flip
    threshold ``T`` and the privacy cost they give."""

    n_vertices: int
    epsilon: float
    flip_threshold: int

    def _check_public_parameters(self) -> int:
        """Checks ``n_vertices``, ``epsilon`` and ``flip_threshold``, stores them as plain
        ints and sets ``privacy_cost`` (the subclasses are frozen dataclasses); returns
        ``|V|``."""
        count = _check_vertices(self.n_vertices)
        check_budget(self.epsilon, 0.0)
        threshold = self.flip_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | np.integer):
            raise MechanismError("flip_threshold must be an integer")
        if not 0 < int(threshold) <= 1 << 63:
            raise MechanismError("flip_threshold must lie in (0, 2^63]")
        object.__setattr__(self, "n_vertices", count)
        object.__setattr__(self, "flip_threshold", int(threshold))
        cost = PrivacyCost.compose([CostPart("graph_cuts", float(self.epsilon))])
        object.__setattr__(self, "privacy_cost", cost)
        return count

    @property
    def flip_probability(self) -> float:
        """``p``: probability that a pair's bit was flipped (exactly ``T / 2^64``)."""
        return self.flip_threshold / secure_random.TWO_64

    @property
    def epsilon_effective(self) -> float:
        """``ln((1 - p) / p)`` of the rounded sampler (<= :attr:`epsilon`)."""
        return effective_epsilon(self.flip_threshold)


class _CutEstimator(_NoisyGraph):
    """Estimator (34), its error and interval, from the noisy cut counts a subclass gives
    (:meth:`_noisy_counts`); the counts are exact integers, so every answer depends only
    on them, ``|S|``, ``|T|`` and ``p``."""

    def _masks(self, S: VertexSet, T: VertexSet) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        s = _as_mask(S, self.n_vertices, "S")
        t = _as_mask(T, self.n_vertices, "T")
        if np.any(s & t):
            raise MechanismError("S and T must be disjoint")
        return s, t

    def _noisy_counts(
        self, s: NDArray[np.bool_], t: NDArray[np.bool_]
    ) -> NDArray[np.float64]:  # pragma: no cover - abstract
        """``q_{S_k,T_k}(y)`` for the rows of the mask matrices ``s``, ``t`` (as floats)."""
        raise NotImplementedError

    def noisy_cut(self, S: VertexSet, T: VertexSet) -> int:
        """``q_{S,T}(y)``: released edges between ``S`` and ``T``."""
        s, t = self._masks(S, T)
        return round(float(self._noisy_counts(s[None, :], t[None, :])[0]))

    def cut(self, S: VertexSet, T: VertexSet) -> float:
        """Estimator (34) of the number of edges between disjoint ``S`` and ``T``.

        ``S`` and ``T`` are vertex-id arrays or boolean masks of length ``|V|``.
        """
        return float(self.cuts([S], [T])[0])

    def cuts(self, S: Sequence[VertexSet], T: Sequence[VertexSet]) -> NDArray[np.float64]:
        """Estimator (34) for many cuts at once."""
        if len(S) != len(T):
            raise MechanismError("S and T must list the same number of vertex sets")
        if not S:
            return np.empty(0, dtype=np.float64)
        masks = [self._masks(s, t) for s, t in zip(S, T, strict=True)]
        s_bool = np.stack([m[0] for m in masks])
        t_bool = np.stack([m[1] for m in masks])
        noisy = self._noisy_counts(s_bool, t_bool)
        pairs = s_bool.sum(axis=1).astype(np.float64) * t_bool.sum(axis=1).astype(np.float64)
        p = self.flip_probability
        estimates: NDArray[np.float64] = (noisy - p * pairs) / (1.0 - 2.0 * p)
        return estimates

    def stderr(self, S: VertexSet, T: VertexSet) -> float:
        """Exact standard deviation of (34): ``sqrt(|S||T| p (1 - p)) / (1 - 2p)``."""
        s, t = self._masks(S, T)
        p = self.flip_probability
        return float(np.sqrt(float(s.sum()) * float(t.sum()) * p * (1.0 - p)) / (1.0 - 2.0 * p))

    def bound(self, S: VertexSet, T: VertexSet) -> float:
        """Bound (35) on ``E|q_hat - q|``: ``(1 + e^-eps)/(1 - e^-eps) sqrt(|S||T|)``.

        Evaluated at the sampler's ``p`` as ``sqrt(|S||T|) / (1 - 2p)`` (the same at the
        paper's ``p``).
        """
        s, t = self._masks(S, T)
        p = self.flip_probability
        return float(np.sqrt(float(s.sum()) * float(t.sum())) / (1.0 - 2.0 * p))

    def interval(self, S: VertexSet, T: VertexSet, level: float = 0.95) -> tuple[float, float]:
        """Confidence interval for the cut ``q_{S,T}(x)`` with coverage ``level`` (module
        docstring): exact while ``|S||T| p (1 - p) <`` :data:`EXACT_INTERVAL_VARIANCE`,
        normal beyond."""
        if not 0.0 < level < 1.0:
            raise MechanismError(f"level ({level!r}) must lie in (0, 1)")
        s, t = self._masks(S, T)
        pairs = int(s.sum()) * int(t.sum())
        p = self.flip_probability
        if pairs * p * (1.0 - p) < EXACT_INTERVAL_VARIANCE:
            return cut_interval(self.noisy_cut(s, t), pairs, p, level)
        value = self.cut(s, t)
        half = float(special.ndtri(0.5 + level / 2)) * self.stderr(s, t)
        return max(value - half, 0.0), min(value + half, float(pairs))


@dataclass(frozen=True, eq=False)
class GraphRelease(_CutEstimator):
    """The noisy graph (edge list, ``u < v``, sorted) and the cut estimator (34).

    Holds only the release and public parameters. ``to_dict``/``from_dict`` give a form
    the service can store (scalars as JSON, ``edges`` as two Parquet columns).
    """

    edges: NDArray[np.int32]
    n_vertices: int
    epsilon: float
    flip_threshold: int
    privacy_cost: PrivacyCost = field(init=False)

    def __post_init__(self) -> None:
        count = self._check_public_parameters()
        edges = np.asarray(self.edges)
        if edges.size == 0:
            edges = np.empty((0, 2), dtype=np.int32)
        if edges.ndim != 2 or edges.shape[1] != 2 or edges.dtype.kind not in "iu":
            raise MechanismError("edges must be a (k, 2) integer array")
        edges = edges.astype(np.int32)
        u, v = edges[:, 0].astype(np.int64), edges[:, 1].astype(np.int64)
        if np.count_nonzero((u < 0) | (v >= count) | (u >= v)):
            raise MechanismError(f"released edges must satisfy 0 <= u < v < {count}")
        if np.count_nonzero(np.diff(pair_index(u, v, count)) <= 0):
            raise MechanismError("released edges must be sorted and distinct")
        edges.setflags(write=False)
        object.__setattr__(self, "edges", edges)

    @cached_property
    def _adjacency(self) -> sparse.csr_matrix:
        u = self.edges[:, 0]
        v = self.edges[:, 1]
        rows = np.concatenate([u, v])
        cols = np.concatenate([v, u])
        data = np.ones(rows.size, dtype=np.float64)
        shape = (self.n_vertices, self.n_vertices)
        return sparse.csr_matrix((data, (rows, cols)), shape=shape)

    def _noisy_counts(self, s: NDArray[np.bool_], t: NDArray[np.bool_]) -> NDArray[np.float64]:
        """One sparse product for the batch."""
        s_matrix = s.astype(np.float64)
        t_matrix = t.astype(np.float64)
        noisy: NDArray[np.float64] = np.rint(
            np.sum((self._adjacency @ t_matrix.T).T * s_matrix, axis=1)
        )
        return noisy

    def to_dict(self) -> dict[str, object]:
        """Scalars for JSON plus the ``(k, 2)`` array ``edges`` (two Parquet columns)."""
        return {
            "mechanism": "graph_cuts",
            "n_vertices": self.n_vertices,
            "epsilon": self.epsilon,
            "flip_threshold": self.flip_threshold,
            "edges": self.edges,
            "privacy_cost": self.privacy_cost.as_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> GraphRelease:
        return cls(
            edges=np.asarray(data["edges"], dtype=np.int64).reshape(-1, 2).astype(np.int32),
            n_vertices=int(data["n_vertices"]),  # type: ignore[call-overload]
            epsilon=float(data["epsilon"]),  # type: ignore[arg-type]
            flip_threshold=int(data["flip_threshold"]),  # type: ignore[call-overload]
        )


#: Bits of the dense matrix expanded to bytes per block while building it or reading the
#: released edges from the pair bits (bounds that working memory to ~16 MB a block).
_BLOCK_BITS = 1 << 24


def _row_blocks(n_vertices: int) -> list[tuple[int, int]]:
    """Row ranges ``[r0, r1)`` of about :data:`_BLOCK_BITS` matrix cells, ``r0`` a multiple of 8."""
    step = max(8, (_BLOCK_BITS // n_vertices) // 8 * 8)
    return [(r0, min(r0 + step, n_vertices)) for r0 in range(0, n_vertices, step)]


def _upper_rows(bits: NDArray[np.uint8], n_vertices: int, r0: int, r1: int) -> NDArray[np.bool_]:
    """Rows ``r0..r1-1`` of the strict upper triangle held in the packed pair bits (the
    row-major order of :func:`_row_starts`), as an ``(r1 - r0, |V|)`` boolean block."""
    starts = _row_starts(n_vertices)
    lo, hi = int(starts[r0]), int(starts[r1])
    flat = np.unpackbits(bits[lo // 8 : (hi + 7) // 8])[lo % 8 : lo % 8 + (hi - lo)]
    row = np.arange(r0, r1)[:, None]
    block = np.zeros((r1 - r0, n_vertices), dtype=np.bool_)
    block[np.arange(n_vertices)[None, :] > row] = flat.astype(np.bool_)
    return block


def _check_pair_bits(bits: NDArray[np.uint8], n_vertices: int) -> NDArray[np.uint8]:
    array = np.asarray(bits)
    expected = (n_vertices * (n_vertices - 1) // 2 + 7) // 8
    if array.dtype != np.uint8 or array.shape != (expected,):
        raise MechanismError(f"pair bits must be {expected} bytes for {n_vertices} vertices")
    return array


def pair_bits_to_rows(bits: NDArray[np.uint8], n_vertices: int) -> NDArray[np.uint8]:
    """The symmetric noisy adjacency matrix as packed rows (``|V| x ceil(|V|/8)`` bytes,
    ``np.packbits`` order) from the packed upper-triangle pair bits, in row blocks: the
    working memory is the matrix plus ~:data:`_BLOCK_BITS` bytes, never an edge list."""
    count = _check_vertices(n_vertices)
    bits = _check_pair_bits(bits, count)
    rows = np.zeros((count, (count + 7) // 8), dtype=np.uint8)
    for r0, r1 in _row_blocks(count):  # the upper triangle
        rows[r0:r1] = np.packbits(_upper_rows(bits, count, r0, r1), axis=1)
    for r0, r1 in _row_blocks(count):  # the lower triangle: row u gets column u of rows < u
        # rows before r0 already hold their lower part, but only in columns below r0
        lower = np.unpackbits(rows[:r1, r0 // 8 : (r1 + 7) // 8], axis=1, count=r1 - r0)
        block = np.unpackbits(rows[r0:r1], axis=1, count=count).astype(np.bool_)
        block[:, :r1] |= lower.T.astype(np.bool_)
        rows[r0:r1] = np.packbits(block, axis=1)
    return rows


def pair_block_count(n_vertices: int) -> int:
    """How many blocks :func:`pair_bits_to_edges` yields for ``|V|`` vertices (one per
    :data:`_BLOCK_BITS` of the ``|V| (|V| - 1) / 2`` pairs, whatever the edges)."""
    pairs = int(_row_starts(_check_vertices(n_vertices))[-1])
    return -(-pairs // _BLOCK_BITS)


def pair_bits_to_edges(bits: NDArray[np.uint8], n_vertices: int) -> Iterator[NDArray[np.int32]]:
    """The released edges ``(u, v)``, ``u < v``, in pair order, as ``(k, 2)`` int32 blocks,
    one per :data:`_BLOCK_BITS` pairs (whole bytes; for writing them out without the whole
    edge list in memory): the set bits' positions ``k``, ``u`` the last row whose
    :func:`_row_starts` is at most ``k`` and ``v = k - start(u) + u + 1``."""
    count = _check_vertices(n_vertices)
    bits = _check_pair_bits(bits, count)
    starts = _row_starts(count)
    pairs = int(starts[-1])
    for lo in range(0, pairs, _BLOCK_BITS):
        hi = min(lo + _BLOCK_BITS, pairs)
        position = np.flatnonzero(np.unpackbits(bits[lo // 8 : (hi + 7) // 8], count=hi - lo))
        position += lo
        u = np.searchsorted(starts, position, side="right") - 1
        v = position - starts[u] + u + 1
        yield np.column_stack([u, v]).astype(np.int32)


#: Matrix rows read per step of a cut (bounds its working memory to ~3 x 4 MB).
_CUT_BLOCK_BYTES = 1 << 22


@dataclass(frozen=True, eq=False)
class PackedGraphRelease(_CutEstimator):
    """The noisy graph as a dense symmetric bit matrix (``rows[u]`` = ``np.packbits`` of
    row ``u`` of the adjacency: ``|V| ceil(|V|/8)`` bytes, 50 MB at 20,000 vertices) and
    the cut estimator (34), answers identical to :class:`GraphRelease` on the same noisy
    graph. A cut reads ``min(|S|, |T|)`` rows: its memory and time do not grow with the
    number of released edges (about ``p |V|^2 / 2``, 9.5e7 at 20,000 vertices and epsilon
    0.1, which as an edge list held GBs)."""

    rows: NDArray[np.uint8]
    n_vertices: int
    epsilon: float
    flip_threshold: int
    privacy_cost: PrivacyCost = field(init=False)

    def __post_init__(self) -> None:
        count = self._check_public_parameters()
        rows = np.asarray(self.rows)
        if rows.dtype != np.uint8 or rows.shape != (count, (count + 7) // 8):
            raise MechanismError(f"rows must be a ({count}, {(count + 7) // 8}) uint8 array")
        rows.setflags(write=False)
        object.__setattr__(self, "rows", rows)

    @classmethod
    def from_pair_bits(
        cls, bits: NDArray[np.uint8], n_vertices: int, epsilon: float, flip_threshold: int
    ) -> PackedGraphRelease:
        """From the packed upper-triangle pair bits (the stored form), via
        :func:`pair_bits_to_rows`."""
        return cls(
            rows=pair_bits_to_rows(bits, n_vertices),
            n_vertices=n_vertices,
            epsilon=epsilon,
            flip_threshold=flip_threshold,
        )

    def released_edges(self) -> int:
        """Number of released (noisy) edges."""
        return int(np.bitwise_count(self.rows).sum(dtype=np.int64)) // 2

    def _noisy_counts(self, s: NDArray[np.bool_], t: NDArray[np.bool_]) -> NDArray[np.float64]:
        """``sum_{u in S} popcount(rows[u] & packbits(T))``, over the smaller of the two
        sets (the matrix is symmetric), ``_CUT_BLOCK_BYTES`` of rows at a time."""
        out = np.empty(s.shape[0], dtype=np.float64)
        step = max(1, _CUT_BLOCK_BYTES // self.rows.shape[1])
        for k in range(s.shape[0]):
            a, b = (s[k], t[k]) if s[k].sum() <= t[k].sum() else (t[k], s[k])
            mask = np.packbits(b)
            ids = np.flatnonzero(a)
            total = 0
            for i in range(0, ids.size, step):
                block = self.rows[ids[i : i + step]]
                np.bitwise_and(block, mask, out=block)
                total += int(np.bitwise_count(block).sum(dtype=np.int64))
            out[k] = float(total)
        return out


def noisy_cut_cdf(x: int, edges: int, pairs: int, p: float) -> float:
    """``P(N <= x)`` for ``N = Bin(edges, 1 - p) + Bin(pairs - edges, p)``: the noisy cut of
    a cut with ``edges`` of its ``pairs`` vertex pairs in the graph.

    ``sum_j P(Bin(edges, 1 - p) = j) P(Bin(pairs - edges, p) <= x - j)`` over the ``j``
    within 12 standard deviations of ``edges (1 - p)`` (the rest holds below 1e-30).
    """
    if x < 0:
        return 0.0
    if x >= pairs:
        return 1.0
    mean = edges * (1.0 - p)
    sd = math.sqrt(edges * p * (1.0 - p))
    lo = max(0, math.floor(mean - 12.0 * sd) - 1)
    hi = min(edges, math.ceil(mean + 12.0 * sd) + 1, x)
    if hi < lo:
        return 0.0
    j = np.arange(lo, hi + 1, dtype=np.float64)
    log_pmf = (
        special.gammaln(edges + 1.0)
        - special.gammaln(j + 1.0)
        - special.gammaln(edges - j + 1.0)
        + j * math.log1p(-p)
        + (edges - j) * math.log(p)
    )
    rest = pairs - edges
    below = np.minimum(x - j, rest)  # x - j >= 0; P(Bin(rest, p) <= rest) = 1
    full = below >= rest
    tail = np.ones_like(j)
    tail[~full] = special.bdtr(below[~full], rest, p)
    return float(min(np.sum(np.exp(log_pmf) * tail), 1.0))


def cut_interval(noisy: int, pairs: int, p: float, level: float = 0.95) -> tuple[float, float]:
    """Exact confidence interval ``[e_lo, e_hi]`` for the edges of a cut of ``pairs`` pairs
    whose noisy cut is ``noisy`` (flip probability ``p < 1/2``): ``e_hi`` is the largest
    ``e`` with ``P_e(N <= noisy) > a`` and ``e_lo`` the smallest with
    ``P_e(N >= noisy) > a``, ``a = (1 - level) / 2`` (found by bisection: both
    probabilities are monotone in ``e``). Coverage at least ``level`` for every ``e``."""
    a = (1.0 - level) / 2.0

    def first(holds: Any) -> int:
        """Smallest ``e`` in ``[0, pairs]`` where the monotone ``holds`` (false, then true)
        is true; ``pairs + 1`` if nowhere."""
        lo, hi = -1, pairs + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if holds(mid):
                hi = mid
            else:
                lo = mid
        return hi

    e_lo = min(first(lambda e: 1.0 - noisy_cut_cdf(noisy - 1, e, pairs, p) > a), pairs)
    e_hi = first(lambda e: noisy_cut_cdf(noisy, e, pairs, p) <= a) - 1
    # both sets empty only for a count unlikely (below a) under every e: a point remains
    return float(e_lo), float(max(e_hi, e_lo))


@dataclass(frozen=True, eq=False)
class PairBitsRelease(_NoisyGraph):
    """The noisy graph in its stored form: the pair bits ``y_ij`` packed
    (:func:`add_pairs`' order, :func:`pair_bytes` bytes) and the public parameters.
    :meth:`PackedGraphRelease.from_pair_bits` answers cuts from them and
    :func:`pair_bits_to_edges` lists their edges."""

    bits: NDArray[np.uint8]
    n_vertices: int
    epsilon: float
    flip_threshold: int
    privacy_cost: PrivacyCost = field(init=False)

    def __post_init__(self) -> None:
        count = self._check_public_parameters()
        object.__setattr__(self, "bits", _check_pair_bits(self.bits, count))


def release_pair_bits(
    edge_blocks: Iterable[ArrayLike],
    n_vertices: int,
    epsilon: float,
    progress: Callable[[float], None] | None = None,
) -> PairBitsRelease:
    """Mechanism E (module docstring) on the graph whose edges come in blocks
    (:func:`pair_bits_of`): every pair bit flipped w.p. ``1/(1 + e^eps)`` (rounded up to
    ``T / 2^64``). Its working memory is the true and the noisy pair bits (50 MB at 20,000
    vertices) and one block: the edges, true or released (about ``p |V|^2 / 2``, 9.5e7 at
    20,000 vertices and epsilon 0.1), are never held as a list. ``progress``, if given, is
    called with the share of the pairs flipped so far, after each block of the flips (never
    during the read: the number of edges is private)."""
    check_budget(epsilon, 0.0)
    count = _check_vertices(n_vertices)
    true_bits = pair_bits_of(edge_blocks, count)
    threshold = flip_threshold(epsilon)
    if effective_epsilon(threshold) > epsilon:  # pragma: no cover - guarded by rounding
        raise RuntimeError("the rounded flip probability would exceed epsilon")
    return PairBitsRelease(
        bits=_perturb(true_bits, count, threshold, progress),
        n_vertices=count,
        epsilon=float(epsilon),
        flip_threshold=threshold,
    )


def release(
    edges: ArrayLike,
    n_vertices: int,
    epsilon: float,
    rng: np.random.Generator | None = None,
) -> GraphRelease:
    """Release an undirected graph with every vertex-pair bit flipped w.p. ``1/(1 + e^eps)``
    (:func:`release_pair_bits`), as an edge list.

    ``edges`` is a ``(k, 2)`` integer array of vertex ids in ``[0, n_vertices)``, each
    undirected edge once, no self-loops. ``rng`` is accepted for the library's uniform
    signature and not used: the flips come from OpenDP's CSPRNG and nothing is
    post-processed.
    """
    del rng
    noisy = release_pair_bits([edges], n_vertices, epsilon)
    blocks = list(pair_bits_to_edges(noisy.bits, noisy.n_vertices))
    return GraphRelease(
        edges=np.concatenate(blocks),
        n_vertices=noisy.n_vertices,
        epsilon=noisy.epsilon,
        flip_threshold=noisy.flip_threshold,
    )
