"""Randomized response over a finite domain: mechanism E of paper 004 (Wang, Ying, Zhang).

Mechanism (eq. 14-16)
---------------------
Every row ``x_i`` of a database over a finite domain ``D`` is released independently as
``Y_i`` with ``P[Y_i = x_i] = 1/g`` and ``P[Y_i = v] = e^-eps / g`` for every other
``v``, where ``g = 1 + (|D| - 1) e^-eps`` (eq. 16; the paper writes ``|D| = 2^l``).
Equivalently: with probability ``rho = |D| e^-eps / g`` replace the row by a uniform draw
from ``D`` (which may return ``x_i`` itself), otherwise keep it. This form never lists
the domain, so ``|D|`` may be astronomically large (the product of the chosen columns'
category counts, coded in mixed radix by :class:`Domain`).

Privacy (Lemma 1; replace-one neighbours, ``n`` public)
--------------------------------------------------------
Rows are perturbed independently (eq. 15), so neighbours that differ in row ``i`` give
output probabilities whose ratio is the ratio for that row alone:
``P[Y_i = y | x] / P[Y_i = y | x'] <= (1 - rho + rho/|D|) / (rho/|D|) = 1 + |D| (1 - rho)/rho``,
which equals ``e^eps`` at the paper's ``rho``. The bound decreases in ``rho``, so the
sampler rounds ``rho`` *up* to a multiple of ``2^-64`` (see
:mod:`app.mechanisms.secure_random`): the coin is ``U < T`` with ``U`` a uniform 64-bit
word from OpenDP's CSPRNG, ``T = ceil(rho 2^64) + 1`` computed with 60 significant digits
(the ``+ 1`` absorbs that rounding), and the replacement value is an exactly uniform
integer in ``[0, |D|)``. :attr:`RRRelease.epsilon_effective` is the epsilon of the rounded
``rho``; it never exceeds the requested epsilon (checked at release time), and the
ledger is charged the requested epsilon. ``1 - rho = (e^eps - 1)/(e^eps + |D| - 1)`` is
then a multiple of ``2^-64``: for domains near ``2^60`` this rounding is coarse (the
effective epsilon drops visibly below the requested one), and a request whose ``1 - rho``
would round to 0 (a release of pure noise) is refused.

Estimators (eq. 17-18, 21) and error (20), (22)
-----------------------------------------------
A statistical query (Definition 3) applies a row function ``phi_i`` to each row. Here
every query is answered on the mean scale ``theta(x) = (1/n) sum_i phi_i(x_i)`` (eq. 10
normalises by ``sum_i c_i`` instead; the estimators are linear, so this is a rescaling).
With ``mu_i = (1/|D|) sum_v phi_i(v)`` (so that ``C_phi`` of eq. 18 is
``sum_i |D| mu_i / sum_i c_i``), ``E[phi_i(Y_i)] = (1 - rho) phi_i(x_i) + rho mu_i``, and
the unbiased estimator (17) is

    theta_u(y) = ( (1/n) sum_i phi_i(y_i) - rho (1/n) sum_i mu_i ) / (1 - rho),

which is eq. 17 exactly when ``rho = |D| e^-eps / g`` (then ``1/(1 - rho) = g / (1 - e^-eps)``
and ``rho / (1 - rho) = |D| e^-eps / (1 - e^-eps)``). Using the sampler's exact ``rho``
keeps it exactly unbiased. The proper estimator (21) rounds ``theta_u`` to the nearest
achievable answer. Errors:

- bound (20) on the mean scale: ``E|theta_u - theta|^2 <= (b - a)^2 / ((1 - rho)^2 n)``
  (Appendix A: ``|Z_i| <= b - a``); (22) is four times that for the proper estimator;
- exact variance: ``Var theta_u = rho / (n^2 (1 - rho)^2) sum_i [(1 - rho)(phi_i(x_i) - mu_i)^2
  + s_i^2]`` with ``s_i^2`` the variance of ``phi_i`` under a uniform draw from ``D``. It
  depends on the data only through ``sum_i (phi_i(x_i) - mu_i)^2``: its supremum over all
  databases (``"worst_case"``, data-independent, attained at ``phi_i(x_i) in {a_i, b_i}``)
  and an unbiased plug-in estimate from the release (``"plug_in"``) are both available.

Continuous columns (§V-A)
-------------------------
A column normalised to ``[-1, 1]`` (with the declared bounds) is cut into ``2^k`` equal
cells (:func:`discretize`), ``2^{2k} = sqrt(n)`` by default (:func:`default_bits`); the
cell midpoint (:func:`cell_midpoints`) is within ``2^-k`` of every value of its cell.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from decimal import Context, Decimal
from functools import cached_property
from typing import Literal, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtri

from app.mechanisms import secure_random
from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import CostPart, PrivacyCost, check_budget

#: Largest domain: codes are 64-bit signed integers.
MAX_DOMAIN_SIZE = 1 << 62

#: Precision (significant digits) of the threshold computation.
_DIGITS = 60

#: The largest RMS error of a query with range 1 above which a release is useless:
#: answering 1/2 without looking at the data is never off by more. Compared with the
#: largest RMS error the estimate (17) can have, half of bound (20) (:func:`preview`).
USELESS_RMSE = 0.5

StderrKind = Literal["worst_case", "plug_in", "bound", "bound_proper"]


# --------------------------------------------------------------------------- domain


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise MechanismError(f"{name} must be an integer")
    return int(value)


@dataclass(frozen=True)
class Domain:
    """The product of finite attributes, coded in mixed radix (last attribute fastest).

    ``cardinalities[j]`` is the number of declared categories of attribute ``j`` (``2`` for
    a binary column, ``2^k`` for a continuous column discretised to ``k`` bits). A row
    ``(v_1, ..., v_d)`` has code ``sum_j v_j * prod_{i > j} cardinalities[i]``, the order of
    :func:`numpy.ravel_multi_index`. The domain is never materialised.
    """

    cardinalities: tuple[int, ...]

    def __post_init__(self) -> None:
        cards = tuple(_as_int(k, "every cardinality") for k in self.cardinalities)
        if not cards:
            raise MechanismError("a domain needs at least one attribute")
        if any(k < 1 for k in cards):
            raise MechanismError("every cardinality must be >= 1")
        if math.prod(cards) > MAX_DOMAIN_SIZE:
            raise MechanismError(
                "the domain has more than 2^62 cells (product of the cardinalities); "
                "use fewer columns, categories or bits"
            )
        object.__setattr__(self, "cardinalities", cards)

    @property
    def size(self) -> int:
        """``|D| = prod_j cardinalities[j]``."""
        return math.prod(self.cardinalities)

    @property
    def strides(self) -> tuple[int, ...]:
        """``stride_j = prod_{i > j} cardinalities[i]``: code = sum_j v_j stride_j."""
        out = []
        acc = 1
        for k in reversed(self.cardinalities):
            out.append(acc)
            acc *= k
        return tuple(reversed(out))

    def encode(self, values: ArrayLike) -> NDArray[np.int64]:
        """Codes of the rows of ``values`` (shape ``(n, d)``, integer category indices)."""
        array = np.asarray(values)
        d = len(self.cardinalities)
        if array.ndim != 2 or array.shape[1] != d:
            raise MechanismError(f"values must have shape (rows, {d}); got {array.shape}")
        if array.dtype.kind not in "iu":
            raise MechanismError("values must be integer category indices")
        codes = np.zeros(array.shape[0], dtype=np.int64)
        for j, k in enumerate(self.cardinalities):
            column = array[:, j].astype(np.int64)
            if np.any((column < 0) | (column >= k)):  # no count: a statistic of the data
                raise MechanismError(
                    f"attribute {j} has values outside its {k} declared categories"
                )
            codes = codes * k + column
        return codes

    def decode(self, codes: ArrayLike) -> NDArray[np.int64]:
        """Inverse of :meth:`encode`: ``(n,)`` codes to ``(n, d)`` category indices."""
        array = _check_codes(codes, self.size, "codes")
        out = np.empty((array.shape[0], len(self.cardinalities)), dtype=np.int64)
        rest = array.copy()
        for j in range(len(self.cardinalities) - 1, -1, -1):
            k = self.cardinalities[j]
            out[:, j] = rest % k
            rest //= k
        return out

    def attribute(self, codes: NDArray[np.int64], j: int) -> NDArray[np.int64]:
        """Attribute ``j`` of each code (no range check)."""
        return (codes // self.strides[j]) % self.cardinalities[j]


def default_bits(n: int) -> int:
    """Bits per continuous column (§V-A): ``2^{2k} = sqrt(n)``, ``k = round(log2(n)/4) >= 1``."""
    n = _as_int(n, "n")
    if n < 1:
        raise MechanismError(f"n ({n}) must be >= 1")
    return max(1, round(math.log2(n) / 4))


def _check_bits(bits: int) -> int:
    bits = _as_int(bits, "bits")
    if not 1 <= bits <= 30:
        raise MechanismError(f"bits ({bits}) must lie in [1, 30]")
    return bits


def discretize(x: ArrayLike, bits: int) -> NDArray[np.int64]:
    """Cell index in ``[0, 2^bits)`` of values in ``[-1, 1]`` (§V-A), cells of width ``2^{1-bits}``.

    Cell ``j`` is ``[-1 + j 2^{1-k}, -1 + (j + 1) 2^{1-k})``; the value ``1`` joins the
    last cell. Values must already be normalised with the declared bounds.
    """
    bits = _check_bits(bits)
    array = np.asarray(x, dtype=np.float64)
    # No counts in these messages: they can reach a release's status (see check_batch).
    if not np.all(np.isfinite(array)):
        raise MechanismError("x contains non-finite values")
    if np.any((array < -1.0) | (array > 1.0)):
        raise MechanismError(
            "x contains values outside [-1, 1]; normalise with the declared bounds"
        )
    cells = 1 << bits
    index = np.floor((array + 1.0) * (cells / 2)).astype(np.int64)
    return np.minimum(index, cells - 1)


def cell_midpoints(index: ArrayLike, bits: int) -> NDArray[np.float64]:
    """Midpoint ``-1 + (2 j + 1) / 2^bits`` of cell ``j``: within ``2^-bits`` of its values."""
    bits = _check_bits(bits)
    array = _check_codes(index, 1 << bits, "index")
    return np.asarray(-1.0 + (2.0 * array + 1.0) / float(1 << bits), dtype=np.float64)


# --------------------------------------------------------------------------- row functions


class RowFunction(ABC):
    """A bounded function ``phi: D -> R`` of one row (Definition 3), evaluated on codes."""

    @property
    @abstractmethod
    def domain_size(self) -> int:
        """``|D|`` of the domain the function is defined on."""

    @abstractmethod
    def evaluate(self, codes: NDArray[np.int64]) -> NDArray[np.float64]:
        """``phi(v)`` for each code ``v``."""

    @property
    @abstractmethod
    def mean(self) -> float:
        """``mu = (1/|D|) sum_v phi(v)``; ``|D| mu`` is ``C_phi`` of eq. 18 when ``c_i = 1``."""

    @property
    @abstractmethod
    def mean_square(self) -> float:
        """``(1/|D|) sum_v phi(v)^2``."""

    @property
    @abstractmethod
    def low(self) -> float:
        """``a_i = min_v phi(v)``."""

    @property
    @abstractmethod
    def high(self) -> float:
        """``b_i = max_v phi(v)``."""

    @property
    @abstractmethod
    def two_valued(self) -> bool:
        """True when ``phi`` takes exactly the two values ``low`` and ``high``."""

    @property
    def total(self) -> float:
        """``sum_v phi(v) = |D| mu`` (the paper's ``C_phi`` for one row function with ``c = 1``)."""
        return self.domain_size * self.mean

    @property
    def spread(self) -> float:
        """Variance of ``phi(V)`` for ``V`` uniform on ``D``: ``mean_square - mean^2``."""
        return max(self.mean_square - self.mean**2, 0.0)


@dataclass(frozen=True, eq=False)
class Table(RowFunction):
    """A row function given by its values on every cell of the domain (small ``|D|``)."""

    values: NDArray[np.float64]

    def __post_init__(self) -> None:
        values = np.array(self.values, dtype=np.float64)  # a private, read-only copy
        if values.ndim != 1 or values.shape[0] < 2:
            raise MechanismError(
                "a table row function must be a 1-D array with one value per domain cell"
            )
        if not np.all(np.isfinite(values)):
            raise MechanismError("a table row function must have finite values")
        if values.max() <= values.min():
            raise MechanismError(
                "the row function is constant (b = a); Definition 3 needs c = b - a > 0"
            )
        values.setflags(write=False)
        object.__setattr__(self, "values", values)

    @property
    def domain_size(self) -> int:
        return int(self.values.shape[0])

    def evaluate(self, codes: NDArray[np.int64]) -> NDArray[np.float64]:
        return self.values[codes]

    @cached_property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @cached_property
    def mean_square(self) -> float:
        return float(np.mean(self.values**2))

    @property
    def low(self) -> float:
        return float(self.values.min())

    @property
    def high(self) -> float:
        return float(self.values.max())

    @cached_property
    def two_valued(self) -> bool:
        return bool(np.unique(self.values).size == 2)


@dataclass(frozen=True)
class Conjunction(RowFunction):
    """Indicator that every listed attribute takes one of its listed values.

    ``terms`` maps an attribute index to a category index or a collection of them:
    ``phi(v) = prod_j [v_j in terms[j]]``. For ``k`` binary attributes each fixed to 1 in
    a domain of ``l`` binary attributes this is the predicate after eq. 22, with
    ``sum_v phi(v) = 2^{l - k}`` (:attr:`total`). No table over the domain is built.
    """

    domain: Domain
    terms: Mapping[int, int | Collection[int]]

    def __post_init__(self) -> None:
        if not isinstance(self.domain, Domain):
            raise MechanismError("a conjunction needs the release's Domain")
        if not self.terms:
            raise MechanismError("a conjunction needs at least one term")
        cards = self.domain.cardinalities
        normalised: dict[int, frozenset[int]] = {}
        for raw_attribute, raw_values in self.terms.items():
            attribute = _as_int(raw_attribute, "a conjunction's attribute index")
            if not 0 <= attribute < len(cards):
                raise MechanismError(
                    f"conjunction attribute {attribute} is outside the domain's "
                    f"{len(cards)} attributes"
                )
            if isinstance(raw_values, int | np.integer):
                chosen = frozenset({_as_int(raw_values, "a conjunction value")})
            elif isinstance(raw_values, range):  # a run of cells: plain ints already
                chosen = frozenset(raw_values)
            else:
                values = list(raw_values)
                if all(type(v) is int for v in values):  # what _as_int accepts as it is
                    chosen = frozenset(values)
                else:
                    chosen = frozenset(_as_int(v, "a conjunction value") for v in values)
            if not chosen:
                raise MechanismError(f"conjunction attribute {attribute} has no allowed value")
            if min(chosen) < 0 or max(chosen) >= cards[attribute]:
                raise MechanismError(
                    f"a value of conjunction attribute {attribute} is outside its "
                    f"{cards[attribute]} categories"
                )
            normalised[attribute] = chosen
        if all(len(normalised[a]) == cards[a] for a in normalised):
            raise MechanismError(
                "the conjunction allows every value (a constant row function); "
                "Definition 3 needs c = b - a > 0"
            )
        object.__setattr__(self, "terms", dict(sorted(normalised.items())))

    @property
    def term_sets(self) -> Mapping[int, frozenset[int]]:
        """The terms as allowed-value sets (normalised in ``__post_init__``)."""
        return cast(Mapping[int, frozenset[int]], self.terms)

    @property
    def domain_size(self) -> int:
        return self.domain.size

    def evaluate(self, codes: NDArray[np.int64]) -> NDArray[np.float64]:
        result = np.ones(codes.shape[0], dtype=np.bool_)
        for attribute, chosen in self.term_sets.items():
            digits = self.domain.attribute(codes, attribute)
            result &= np.isin(digits, np.fromiter(chosen, dtype=np.int64))
        return result.astype(np.float64)

    @property
    def mean(self) -> float:
        cards = self.domain.cardinalities
        share = 1.0
        for attribute, chosen in self.term_sets.items():
            share *= len(chosen) / cards[attribute]
        return share

    @property
    def mean_square(self) -> float:
        return self.mean

    @property
    def low(self) -> float:
        return 0.0

    @property
    def high(self) -> float:
        return 1.0

    @property
    def two_valued(self) -> bool:
        return True


@dataclass(frozen=True)
class Heterogeneous:
    """A statistical query whose row function depends on a public column (Definition 3).

    Row ``i`` uses ``by_public[public_i]``, where ``public`` is the column the curator
    declared public (kind ``public``), released unperturbed beside the codes. Values may
    be :class:`RowFunction` objects or tables (arrays over the domain).
    """

    by_public: Mapping[int, RowFunction | ArrayLike]

    def __post_init__(self) -> None:
        if not self.by_public:
            raise MechanismError("a heterogeneous query needs at least one row function")
        functions: dict[int, RowFunction] = {}
        for raw_key, raw_function in self.by_public.items():
            key = _as_int(raw_key, "a public value")
            functions[key] = _as_row_function(raw_function)
        object.__setattr__(self, "by_public", functions)

    @property
    def functions(self) -> Mapping[int, RowFunction]:
        """The row functions by public value (tables converted in ``__post_init__``)."""
        return cast(Mapping[int, RowFunction], self.by_public)


Query = RowFunction | Heterogeneous | ArrayLike


def _as_row_function(query: RowFunction | ArrayLike) -> RowFunction:
    if isinstance(query, RowFunction):
        return query
    return Table(np.asarray(query, dtype=np.float64))


# --------------------------------------------------------------------------- privacy maths


def _check_codes(codes: ArrayLike, size: int, name: str) -> NDArray[np.int64]:
    array = np.asarray(codes)
    if array.ndim != 1:
        raise MechanismError(f"{name} must be a 1-D array; got {array.ndim} dimensions")
    if array.dtype.kind not in "iu":
        raise MechanismError(f"{name} must be integers")
    array = array.astype(np.int64)
    if np.any((array < 0) | (array >= size)):  # no count: a statistic of the data
        raise MechanismError(f"{name} has entries outside [0, {size})")
    return array


def _replace_probability(domain_size: int, epsilon: float) -> Decimal:
    """``rho = |D| e^-eps / g = |D| / (e^eps + |D| - 1)`` to 60 significant digits."""
    ctx = Context(prec=_DIGITS)
    exp_eps = ctx.exp(Decimal(epsilon))
    return ctx.divide(Decimal(domain_size), ctx.add(exp_eps, Decimal(domain_size - 1)))


def replace_threshold(domain_size: int, epsilon: float) -> int:
    """The integer ``T`` of the replace coin ``U < T``: ``ceil(rho 2^64) + 1``, at most ``2^64``.

    Rounding up only increases ``rho`` and so lowers the privacy loss; the extra unit
    covers the error of the 60-digit computation of ``rho``.
    """
    rho = _replace_probability(domain_size, epsilon)
    return min(secure_random.threshold(rho, "up") + 1, secure_random.TWO_64)


def effective_epsilon(domain_size: int, threshold: int) -> float:
    """Privacy loss of the sampler: ``ln(1 + |D| (1 - rho) / rho)`` with ``rho = T / 2^64``."""
    if threshold >= secure_random.TWO_64:
        return 0.0
    ctx = Context(prec=_DIGITS)
    ratio = ctx.divide(
        Decimal(domain_size * (secure_random.TWO_64 - threshold)), Decimal(threshold)
    )
    return float(ctx.ln(ctx.add(Decimal(1), ratio)))


# --------------------------------------------------------------------------- release


@dataclass(frozen=True, eq=False)
class RRRelease:
    """The perturbed database of mechanism E and its companion estimators.

    Holds only released values (``codes``, the unperturbed ``public`` column) and public
    parameters; estimates need no raw data. ``to_dict``/``from_dict`` give a form the
    service can store (scalars as JSON, the two arrays as Parquet columns).
    """

    codes: NDArray[np.int64]
    domain_size: int
    epsilon: float
    replace_threshold: int
    cardinalities: tuple[int, ...] | None = None
    public: NDArray[np.int64] | None = None
    privacy_cost: PrivacyCost = field(init=False)

    def __post_init__(self) -> None:
        size = _as_int(self.domain_size, "domain_size")
        if not 2 <= size <= MAX_DOMAIN_SIZE:
            raise MechanismError(f"domain_size ({size}) must lie in [2, 2^62]")
        if self.cardinalities is not None:
            domain = Domain(tuple(self.cardinalities))
            if domain.size != size:
                raise MechanismError("the product of the cardinalities must equal domain_size")
            object.__setattr__(self, "cardinalities", domain.cardinalities)
        check_budget(self.epsilon, 0.0)
        threshold = _as_int(self.replace_threshold, "replace_threshold")
        if not 0 < threshold < secure_random.TWO_64:
            raise MechanismError("replace_threshold must lie in (0, 2^64)")
        codes = _check_codes(self.codes, size, "codes")
        if codes.shape[0] == 0:
            raise MechanismError("codes is empty (n = 0)")
        codes.setflags(write=False)
        object.__setattr__(self, "codes", codes)
        object.__setattr__(self, "domain_size", size)
        object.__setattr__(self, "replace_threshold", threshold)
        if self.public is not None:
            public = _check_public(self.public, codes.shape[0])
            public.setflags(write=False)
            object.__setattr__(self, "public", public)
        cost = PrivacyCost.compose([CostPart("randomized_response", float(self.epsilon))])
        object.__setattr__(self, "privacy_cost", cost)

    # -- parameters

    @property
    def n(self) -> int:
        return int(self.codes.shape[0])

    @property
    def domain(self) -> Domain | None:
        """The attribute structure, when the release was made from a :class:`Domain`."""
        return None if self.cardinalities is None else Domain(self.cardinalities)

    @property
    def replace_probability(self) -> float:
        """``rho``: probability that a row is replaced by a uniform draw (exactly ``T / 2^64``)."""
        return self.replace_threshold / secure_random.TWO_64

    @property
    def keep_margin(self) -> float:
        """``1 - rho``, computed from the integer threshold (no cancellation when ``rho ~ 1``)."""
        return (secure_random.TWO_64 - self.replace_threshold) / secure_random.TWO_64

    @property
    def keep_probability(self) -> float:
        """``P[Y_i = x_i] = 1 - rho + rho / |D|`` (the paper's ``1/g``)."""
        return self.keep_margin + self.replace_probability / self.domain_size

    @property
    def epsilon_effective(self) -> float:
        """The privacy loss of the rounded sampler (<= :attr:`epsilon`)."""
        return effective_epsilon(self.domain_size, self.replace_threshold)

    # -- estimators

    def estimate(self, query: Query) -> float:
        """Unbiased estimate (eq. 17-18) of ``(1/n) sum_i phi_i(x_i)``.

        ``query`` is a table over the domain (``(|D|,)`` values), a
        :class:`RowFunction` (e.g. :class:`Conjunction`) for a linear query, or a
        :class:`Heterogeneous` query keyed by the public column.
        """
        return self._estimate(self._sums(query))

    def estimate_proper(self, query: Query) -> float:
        """Proper estimate (eq. 21): the achievable answer nearest to :meth:`estimate`.

        Implemented for row functions that all take the same two values ``a < b``
        (predicates, conjunctions, indicator tables, binary row functions): the
        achievable answers are then ``a + (b - a) k / n``, ``k = 0..n``. For other row
        functions the nearest achievable answer is a knapsack-type search; use
        :meth:`estimate`.
        """
        return self._estimate_proper(self._sums(query))

    def stderr(self, query: Query, kind: StderrKind = "worst_case") -> float:
        """Standard error (root mean squared error) of :meth:`estimate`.

        - ``"worst_case"`` (default): the exact standard deviation maximised over all
          databases; data-independent and never below the truth.
        - ``"plug_in"``: the exact variance at the released database, with its one
          data-dependent term ``sum_i (phi_i(x_i) - mu_i)^2`` replaced by its unbiased
          estimate (clipped at 0).
        - ``"bound"``: square root of bound (20) on the mean scale,
          ``(b - a) / ((1 - rho) sqrt(n))``; ``"bound_proper"``: of (22), twice that,
          for :meth:`estimate_proper`.
        """
        return self._stderr(self._sums(query), kind)

    def answer(
        self, query: Query, *, proper: bool, level: float = 0.95
    ) -> tuple[float, float, float, tuple[float, float]]:
        """``(value, worst-case stderr, bound, interval)`` from one pass over
        :attr:`cell_counts`: the value of :meth:`estimate_proper` (``proper``) or
        :meth:`estimate`, :meth:`stderr` of kind ``"worst_case"``, of kind
        ``"bound_proper"`` or ``"bound"``, and :meth:`interval` at ``level``. Each of those
        methods makes that pass; a batch of answers calls this once per query."""
        sums = self._sums(query)
        value = self._estimate_proper(sums) if proper else self._estimate(sums)
        bound = self._stderr(sums, "bound_proper" if proper else "bound")
        stderr = self._stderr(sums, "worst_case")
        return value, stderr, bound, self._interval(sums, value, stderr, level)

    def interval(
        self, query: Query, *, proper: bool = False, level: float = 0.95
    ) -> tuple[float, float]:
        """Normal interval ``value +- z stderr`` (``z`` the two-sided ``level`` quantile,
        worst-case :meth:`stderr`) around :meth:`estimate_proper` (``proper``) or
        :meth:`estimate`, clipped to ``[a, b]``, the least and greatest value of the row
        functions: every exact answer ``(1/n) sum_i phi_i(x_i)`` lies there, so clipping
        never loses coverage. At small epsilon the unclipped interval of a proportion
        reached [-31, 32] (Adult, epsilon 0.1, ``bench/results/interval_coverage.md``)."""
        sums = self._sums(query)
        value = self._estimate_proper(sums) if proper else self._estimate(sums)
        return self._interval(sums, value, self._stderr(sums, "worst_case"), level)

    @staticmethod
    def _interval(sums: _Sums, value: float, stderr: float, level: float) -> tuple[float, float]:
        if not 0.0 < level < 1.0:
            raise MechanismError(f"level ({level!r}) must lie in (0, 1)")
        half = float(ndtri(0.5 + level / 2.0)) * stderr
        low, high = sums.low, sums.high
        # both ends inside [a, b]: a value far outside gives the nearest end, a point
        return min(max(value - half, low), high), max(min(value + half, high), low)

    def _estimate(self, sums: _Sums) -> float:
        rho = self.replace_probability
        return (sums.phi_y - rho * sums.mu) / (self.n * self.keep_margin)

    def _estimate_proper(self, sums: _Sums) -> float:
        if len(sums.pairs) != 1 or not sums.two_valued:
            raise MechanismError(
                "estimate_proper (eq. 21) needs row functions that all take the same two "
                "values; use estimate for this query"
            )
        ((a, b),) = sums.pairs
        unbiased = self._estimate(sums)
        k = min(max(round((unbiased - a) * self.n / (b - a)), 0), self.n)
        return a + (b - a) * k / self.n

    def _stderr(self, sums: _Sums, kind: StderrKind) -> float:
        rho = self.replace_probability
        margin = self.keep_margin  # 1 - rho
        scale = rho / (self.n * margin) ** 2
        if kind == "worst_case":
            return math.sqrt(scale * (margin * sums.worst_dev2 + sums.spread))
        if kind == "plug_in":
            dev2 = max((sums.dev2_y - rho * sums.spread) / margin, 0.0)
            return math.sqrt(scale * (margin * dev2 + sums.spread))
        if kind in ("bound", "bound_proper"):
            factor = 2.0 if kind == "bound_proper" else 1.0
            return factor * (sums.high - sums.low) / (margin * math.sqrt(self.n))
        raise MechanismError(
            f"kind ({kind!r}) must be 'worst_case', 'plug_in', 'bound' or 'bound_proper'"
        )

    @cached_property
    def cell_counts(self) -> CellCounts:
        """The released rows counted by (public value, code): every estimator is a sum
        over rows of a function of the row's code (and public value), so it is the same
        sum over these counts, read once instead of once per query (post-processing of
        the released values only)."""
        codes = self.codes
        if self.public is None:
            cells, counts = np.unique(codes, return_counts=True)
            return CellCounts(
                values=None,
                starts=np.array([0, cells.size], dtype=np.int64),
                cells=cells,
                counts=counts.astype(np.int64),
            )
        values, group = np.unique(self.public, return_inverse=True)
        order = np.lexsort((codes, group))
        group, codes = group[order], codes[order]
        first = np.ones(codes.size, dtype=bool)
        first[1:] = (group[1:] != group[:-1]) | (codes[1:] != codes[:-1])
        at = np.flatnonzero(first)
        counts = np.diff(np.append(at, codes.size))
        starts = np.searchsorted(group[at], np.arange(values.size + 1))
        return CellCounts(
            values=values, starts=starts.astype(np.int64), cells=codes[at], counts=counts
        )

    def _group_functions(self, query: Query) -> tuple[NDArray[np.int64], list[RowFunction]]:
        """``(starts, functions)``: the groups of :attr:`cell_counts` entries that share a
        row function, entries ``starts[g]:starts[g + 1]`` with ``functions[g]``: one group
        of every entry, or one per public value (``by_public[values[g]]``)."""
        table = self.cell_counts
        if not isinstance(query, Heterogeneous):
            return np.array([0, table.size], dtype=np.int64), [_as_row_function(query)]
        if table.values is None:
            raise MechanismError(
                "a heterogeneous query needs the public column; this release has none"
            )
        by_public = query.functions
        functions = [by_public.get(value) for value in table.values.tolist()]
        missing = functions.count(None)
        if missing:
            raise MechanismError(
                f"the heterogeneous query has no row function for {missing} of the "
                f"public column's {table.values.size} values"
            )
        return table.starts, cast(list[RowFunction], functions)

    def _check_function(self, function: RowFunction) -> None:
        if function.domain_size != self.domain_size:
            raise MechanismError(
                f"the row function is defined on {function.domain_size} cells; "
                f"the release's domain has {self.domain_size}"
            )
        if isinstance(function, Conjunction) and function.domain.cardinalities != (
            self.cardinalities
        ):
            raise MechanismError("the conjunction's domain is not the release's domain")

    def _sums(self, query: Query) -> _Sums:
        """The sums of :class:`_Sums` from :attr:`cell_counts`, one numpy pass over its
        entries for every group at once (:func:`_group_sums`)."""
        starts, functions = self._group_functions(query)
        seen: set[int] = set()
        for function in functions:
            if id(function) not in seen:
                seen.add(id(function))
                self._check_function(function)
        table = self.cell_counts
        return _group_sums(table.cells, table.counts, starts, functions, self.domain)

    # -- storage

    def to_dict(self) -> dict[str, object]:
        """Scalars for JSON plus the arrays ``codes`` and ``public`` (Parquet columns)."""
        return {
            "mechanism": "randomized_response",
            "epsilon": self.epsilon,
            "domain_size": self.domain_size,
            "cardinalities": None if self.cardinalities is None else list(self.cardinalities),
            "replace_threshold": self.replace_threshold,
            "codes": self.codes,
            "public": self.public,
            "privacy_cost": self.privacy_cost.as_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RRRelease:
        cards = data.get("cardinalities")
        public = data.get("public")
        return cls(
            codes=np.asarray(data["codes"], dtype=np.int64),
            domain_size=int(data["domain_size"]),  # type: ignore[call-overload]
            epsilon=float(data["epsilon"]),  # type: ignore[arg-type]
            replace_threshold=int(data["replace_threshold"]),  # type: ignore[call-overload]
            cardinalities=None if cards is None else tuple(cards),  # type: ignore[arg-type]
            public=None if public is None else np.asarray(public, dtype=np.int64),
        )


@dataclass(frozen=True, eq=False)
class CellCounts:
    """The released rows counted by cell: entries ``starts[g]:starts[g + 1]`` are the
    distinct codes ``cells`` of the rows whose public value is ``values[g]`` (one group,
    ``values = None``, without a public column) and ``counts`` how many rows hold each."""

    values: NDArray[np.int64] | None
    starts: NDArray[np.int64]
    cells: NDArray[np.int64]
    counts: NDArray[np.int64]

    @property
    def size(self) -> int:
        """Distinct (public value, code) pairs: the work of one answer."""
        return int(self.cells.shape[0])


@dataclass
class _Sums:
    """Sums over rows that the estimators and their variances need."""

    phi_y: float = 0.0  # sum_i phi_i(y_i)
    mu: float = 0.0  # sum_i mu_i
    dev2_y: float = 0.0  # sum_i (phi_i(y_i) - mu_i)^2
    spread: float = 0.0  # sum_i s_i^2
    worst_dev2: float = 0.0  # sum_i max_{t in {a_i, b_i}} (t - mu_i)^2
    low: float = math.inf  # a = min_i a_i
    high: float = -math.inf  # b = max_i b_i
    pairs: set[tuple[float, float]] = field(default_factory=set)  # the (a_i, b_i) met
    two_valued: bool = True  # every phi_i takes only its a_i and b_i


def _group_sums(
    cells: NDArray[np.int64],
    counts: NDArray[np.int64],
    starts: NDArray[np.int64],
    functions: list[RowFunction],
    domain: Domain | None,
) -> _Sums:
    """The sums of :class:`_Sums` over the rows counted by ``counts`` (distinct ``cells``)
    whose row function is ``functions[g]`` for the entries ``starts[g]:starts[g + 1]``.

    With ``g(e)`` the group of entry ``e``, ``w_e`` its count and ``n_g = sum_{g(e) = g}
    w_e`` the rows of group ``g``:

    - ``sum_i phi_i(y_i) = sum_e w_e phi_{g(e)}(cell_e)``;
    - ``sum_i (phi_i(y_i) - mu_i)^2 = sum_e w_e (phi_{g(e)}(cell_e) - mu_{g(e)})^2``;
    - ``sum_i mu_i = sum_g n_g mu_g``, ``sum_i s_i^2 = sum_g n_g s_g^2`` and
      ``sum_i max_{t in {a_i, b_i}} (t - mu_i)^2 = sum_g n_g max((a_g - mu_g)^2,
      (b_g - mu_g)^2)``.

    Each is one numpy reduction over the entries or the groups. ``phi_{g(e)}(cell_e)`` is
    evaluated for every entry at once: for the conjunctions by :func:`_conjunctions_at`
    over the distinct conjunction objects (groups that share one share its terms), for
    other row functions once per distinct function on the entries of its groups. The only
    Python loops are over the query itself (the groups, a distinct conjunction's terms,
    each distinct other function), never over entries.
    """
    n_groups = len(functions)
    group = np.repeat(np.arange(n_groups, dtype=np.int64), np.diff(starts))
    cumulative = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)])
    rows = (cumulative[starts[1:]] - cumulative[starts[:-1]]).astype(np.float64)  # n_g
    mu = np.empty(n_groups)  # mu_g
    spread = np.empty(n_groups)  # s_g^2
    low = np.empty(n_groups)  # a_g
    high = np.empty(n_groups)  # b_g
    phi = np.empty(cells.shape[0])  # phi_{g(e)}(cell_e)
    two_valued = True

    is_conjunction = np.fromiter(
        (isinstance(f, Conjunction) for f in functions), dtype=np.bool_, count=n_groups
    )
    conjunctions = np.flatnonzero(is_conjunction)
    if conjunctions.size:
        assert domain is not None  # each conjunction's domain is the release's (checked)
        # each distinct conjunction object once (a by_public query often gives many
        # public values the same one)
        distinct_conjunctions, local = _distinct_functions(functions, conjunctions)
        entries = np.flatnonzero(is_conjunction[group])
        mu_distinct, phi[entries] = _conjunctions_at(
            cast(list[Conjunction], distinct_conjunctions),
            domain,
            local[group[entries]],
            cells[entries],
        )
        mu_c = mu_distinct[local[conjunctions]]
        mu[conjunctions] = mu_c
        spread[conjunctions] = np.maximum(mu_c - mu_c**2, 0.0)  # mean_square = mean
        low[conjunctions] = 0.0
        high[conjunctions] = 1.0

    others = np.flatnonzero(~is_conjunction)
    if others.size:
        distinct, which = _distinct_functions(functions, others)
        scalars = np.array([(f.mean, f.spread, f.low, f.high) for f in distinct])
        mu[others], spread[others], low[others], high[others] = scalars[which[others]].T
        two_valued = all(f.two_valued for f in distinct)
        if len(distinct) == 1 and others.size == n_groups:
            phi[:] = distinct[0].evaluate(cells)
        else:  # the entries of each distinct function, found by one stable sort
            entry_function = which[group]
            selected = np.flatnonzero(entry_function >= 0)
            order = selected[np.argsort(entry_function[selected], kind="stable")]
            bounds = np.searchsorted(entry_function[order], np.arange(len(distinct) + 1))
            for k, function in enumerate(distinct):
                at = order[bounds[k] : bounds[k + 1]]
                phi[at] = function.evaluate(cells[at])

    weights = counts.astype(np.float64)  # w_e
    return _Sums(
        phi_y=float(np.dot(weights, phi)),
        mu=float(np.dot(rows, mu)),
        dev2_y=float(np.dot(weights, (phi - mu[group]) ** 2)),
        spread=float(np.dot(rows, spread)),
        worst_dev2=float(np.dot(rows, np.maximum((low - mu) ** 2, (high - mu) ** 2))),
        low=float(low.min()),
        high=float(high.max()),
        pairs={(float(a), float(b)) for a, b in np.unique(np.column_stack([low, high]), axis=0)},
        two_valued=two_valued,
    )


def _distinct_functions(
    functions: list[RowFunction], groups: NDArray[np.int64]
) -> tuple[list[RowFunction], NDArray[np.int64]]:
    """``(distinct, which)``: the distinct row-function objects (by identity) of
    ``functions[g]`` for ``g`` in ``groups``, in order of first use, and ``which[g]`` the
    index of group ``g``'s among them (``-1`` for a group not in ``groups``)."""
    index: dict[int, int] = {}
    distinct: list[RowFunction] = []
    which = np.full(len(functions), -1, dtype=np.int64)
    for g in groups.tolist():
        function = functions[g]
        k = index.setdefault(id(function), len(distinct))
        if k == len(distinct):
            distinct.append(function)
        which[g] = k
    return distinct, which


def _conjunctions_at(
    conjunctions: list[Conjunction],
    domain: Domain,
    owner: NDArray[np.int64],
    cells: NDArray[np.int64],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(mu, phi)``: ``mu[k]`` the mean over the domain of ``conjunctions[k]`` and
    ``phi[e]`` the value of ``conjunctions[owner[e]]`` at ``cells[e]``, all at once.

    Conjunction ``k`` with allowed sets ``A_kj`` on its attributes ``j`` is
    ``phi_k(v) = prod_j [v_j in A_kj]`` with ``mu_k = prod_j |A_kj| / |D_j|``
    (:class:`Conjunction`). The terms are flattened into arrays; then for each attribute
    ``j`` some conjunction constrains, an entry whose conjunction has a term on ``j``
    keeps ``phi = 1`` only if the pair ``(k, v_j)`` is allowed: a binary search among the
    sorted keys ``k m_j + rank_j(v)`` of the allowed pairs, ``rank_j`` the position among
    the ``m_j`` distinct values allowed on ``j`` by any conjunction (so keys stay below
    ``len(conjunctions) m_j``, whatever ``|D_j|``). Attributes are taken in increasing
    order, as :attr:`Conjunction.mean` multiplies them: the same ``mu`` to the bit.
    """
    term_owner: list[int] = []
    term_attribute: list[int] = []
    term_size: list[int] = []
    allowed: list[int] = []
    for k, conjunction in enumerate(conjunctions):
        for attribute, chosen in conjunction.term_sets.items():
            term_owner.append(k)
            term_attribute.append(attribute)
            term_size.append(len(chosen))
            allowed.extend(chosen)
    owners = np.array(term_owner, dtype=np.int64)
    attributes = np.array(term_attribute, dtype=np.int64)
    sizes = np.array(term_size, dtype=np.int64)
    values = np.array(allowed, dtype=np.int64)
    value_term = np.repeat(np.arange(owners.size), sizes)
    mu = np.ones(len(conjunctions))
    phi = np.ones(cells.shape[0], dtype=np.bool_)
    for attribute in np.unique(attributes).tolist():
        on = attributes == attribute
        mu[owners[on]] *= sizes[on] / domain.cardinalities[attribute]
        constrained = np.zeros(len(conjunctions), dtype=np.bool_)
        constrained[owners[on]] = True
        entries = np.flatnonzero(constrained[owner])
        pair = on[value_term]
        distinct = np.unique(values[pair])
        keys = np.sort(
            owners[value_term[pair]] * distinct.size + np.searchsorted(distinct, values[pair])
        )
        digit = domain.attribute(cells[entries], attribute)
        rank = np.minimum(np.searchsorted(distinct, digit), distinct.size - 1)
        key = owner[entries] * distinct.size + rank
        found = np.minimum(np.searchsorted(keys, key), keys.size - 1)
        phi[entries] &= (distinct[rank] == digit) & (keys[found] == key)
    return mu, phi.astype(np.float64)


def _check_public(public: ArrayLike, n: int) -> NDArray[np.int64]:
    array = np.asarray(public)
    if array.ndim != 1 or array.shape[0] != n:
        raise MechanismError(f"public must be a 1-D array with one entry per row ({n})")
    if array.dtype.kind not in "iu":
        raise MechanismError("public must hold integer codes of the public column")
    array = array.astype(np.int64)
    if np.any(array < 0):  # no count: a statistic of the data
        raise MechanismError("public has negative entries; codes must be >= 0")
    return array


def release(
    codes: ArrayLike,
    domain_size: int | Domain,
    epsilon: float,
    rng: np.random.Generator | None = None,
    *,
    public: ArrayLike | None = None,
) -> RRRelease:
    """Release ``codes`` (``(n,)`` integers in ``[0, |D|)``) through mechanism E (eq. 14-16).

    ``domain_size`` is ``|D|`` or a :class:`Domain` (needed for :class:`Conjunction`
    queries). ``public`` is an optional column declared public (e.g. a movie id),
    released unchanged for heterogeneous queries. ``rng`` is accepted for the library's
    uniform signature and not used: the only randomness is the privacy randomisation,
    drawn from OpenDP's CSPRNG (module docstring), and there is no post-processing.
    """
    del rng
    check_budget(epsilon, 0.0)
    if isinstance(domain_size, Domain):
        cardinalities: tuple[int, ...] | None = domain_size.cardinalities
        size = domain_size.size
    else:
        cardinalities = None
        size = _as_int(domain_size, "domain_size")
    if not 2 <= size <= MAX_DOMAIN_SIZE:
        raise MechanismError(f"domain_size ({size}) must lie in [2, 2^62]")
    x = _check_codes(codes, size, "codes")
    if x.shape[0] == 0:
        raise MechanismError("codes is empty (n = 0)")
    public_array = None if public is None else _check_public(public, x.shape[0])

    threshold = replace_threshold(size, epsilon)
    if threshold >= secure_random.TWO_64:
        raise MechanismError(
            f"with domain_size = {size} and epsilon = {epsilon:g} a row would be kept with "
            "probability below 2^-64: the release would be pure noise; use a smaller domain "
            "or a larger epsilon"
        )
    if effective_epsilon(size, threshold) > epsilon:  # pragma: no cover - guarded by rounding
        raise RuntimeError("the rounded replace probability would exceed epsilon")
    replace = secure_random.bernoulli(x.shape[0], threshold)
    fresh = secure_random.uniform_below(x.shape[0], size)
    y = np.where(replace, fresh, x)
    return RRRelease(
        codes=y,
        domain_size=size,
        epsilon=float(epsilon),
        replace_threshold=threshold,
        cardinalities=cardinalities,
        public=public_array,
    )


# --------------------------------------------------------------------------- preview


@dataclass(frozen=True)
class RRPreview:
    """Predicted accuracy of a release, from public parameters only (no budget spent).

    ``rmse_bound`` is the square root of bound (20) on the mean scale for a row function
    with range ``b - a = 1``: ``g / ((1 - e^-eps) sqrt(n))``. It bounds each row's term
    of the exact variance (module docstring), ``rho [(1 - rho) (phi_i(x_i) - mu_i)^2 +
    s_i^2]``, by ``(b - a)^2``. With ``u = |phi_i(x_i) - mu_i| / (b - a)``, the uniform
    draw's variance is ``s_i^2 <= u (1 - u) (b - a)^2`` (Bhatia-Davis: its mean ``mu_i``
    lies ``u`` from one end of ``[a, b]``), so the term is at most
    ``rho u (1 - rho u) (b - a)^2 <= (b - a)^2 / 4``: the RMS error of the estimate (17)
    is at most ``rmse_worst_case = rmse_bound / 2`` for every database and query.
    ``warning`` says when the release is useless (``rmse_worst_case >= 0.5``: answering
    1/2 without data is never worse) or the bound is weak (``rmse_bound >= 0.1``).
    """

    n: int
    domain_size: int
    epsilon: float
    keep_probability: float
    replace_probability: float
    rmse_bound: float
    rmse_bound_proper: float
    rows_for_rmse_0_1: int
    warning: str | None

    def __post_init__(self) -> None:
        if self.n < 1 or self.domain_size < 2:
            raise MechanismError("n must be >= 1 and domain_size >= 2")

    @property
    def rmse_worst_case(self) -> float:
        """The largest RMS error of the estimate (17) of a query with range 1, over every
        database: half of bound (20) (class docstring)."""
        return self.rmse_bound / 2.0

    @property
    def useful(self) -> bool:
        return self.rmse_worst_case < USELESS_RMSE


def preview(n: int, domain_size: int, epsilon: float) -> RRPreview:
    """Bound (20) for the requested ``epsilon`` and ``|D|``, with a warning when useless."""
    n = _as_int(n, "n")
    size = _as_int(domain_size, "domain_size")
    if n < 1:
        raise MechanismError(f"n ({n}) must be >= 1")
    if not 2 <= size <= MAX_DOMAIN_SIZE:
        raise MechanismError(f"domain_size ({size}) must lie in [2, 2^62]")
    check_budget(epsilon, 0.0)
    e = math.exp(-epsilon)
    g = 1.0 + (size - 1) * e
    per_row = g / (1.0 - e)  # 1 / (1 - rho)
    rmse = per_row / math.sqrt(n)
    rows_needed = math.ceil((per_row / 0.1) ** 2)
    warning = None
    if rmse / 2.0 >= USELESS_RMSE:
        warning = (
            f"useless: the RMS error of a query with range 1 can reach {rmse / 2.0:.3g} "
            f"(>= {USELESS_RMSE}; half of bound (20), {rmse:.3g}), worse than answering 1/2 "
            f"without data. |D| = {size} is too large for n = {n} at epsilon = {epsilon:g}; "
            f"about {rows_needed} rows would bring bound (20) to 0.1. Use fewer columns, "
            "categories or bits, or a larger epsilon."
        )
    elif rmse >= 0.1:
        warning = (
            f"weak: bound (20) on the RMS error of a query with range 1 is {rmse:.3g}; "
            f"about {rows_needed} rows would reach 0.1."
        )
    return RRPreview(
        n=n,
        domain_size=size,
        epsilon=float(epsilon),
        keep_probability=1.0 / g,
        replace_probability=size * e / g,
        rmse_bound=rmse,
        rmse_bound_proper=2.0 * rmse,
        rows_for_rmse_0_1=rows_needed,
        warning=warning,
    )
