"""JSON query forms of the smooth-query releases (``smooth_synthetic``, ``smooth_synopsis``).

A closed set of forms (nothing is evaluated as code), each in normalised (``[-1, 1]`` per
column) or original units (``"space": "original"``), turned into the library's query
objects on the normalised scale, where ``x' = 2 (x - lower) / (upper - lower) - 1``:

- ``gaussian_mixture``: ``f(x) = sum_j w_j exp(-sum_i (x_i - c_ji)^2 / (2 sigma_i^2))``;
  ``sigma`` a number or one per column. In original units a centre maps to
  ``c' = 2 (c - lower) / (upper - lower) - 1`` and a width to ``sigma' = 2 sigma /
  (upper - lower)`` (an anisotropic kernel on the normalised scale, the same function).
- ``polynomial``: ``sum_j a_j prod_i x_i^(p_ji)`` with ``powers`` by column name; in
  original units each ``x_i = lower_i + (x'_i + 1)(upper_i - lower_i)/2`` is substituted
  and expanded exactly.
- ``product``: ``weight * prod_i g_i(x_i)`` with per-column factors ``gaussian`` (centre,
  width; on the normalised scale ``c' = (c - a) / b``, ``sigma' = sigma / b`` where
  ``x = a + b x'``, a :class:`~app.mechanisms.queries.Gaussian1D`), ``polynomial``
  (power-basis coefficients ``a_0 + a_1 x + ...``) or ``chebyshev`` (coefficients of
  ``T_k``; normalised units only); absent columns are the constant 1.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from numpy.polynomial import chebyshev, polynomial
from numpy.typing import NDArray
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from app.core.errors import InvalidRequest
from app.core.types import integral_number
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import (
    AnisotropicGaussianMixture,
    Gaussian1D,
    GaussianMixture,
    Polynomial,
    ProductQuery,
)
from app.releases import registry
from app.releases.registry import DatasetInfo

Space = Literal["normalized", "original"]
MAX_DEGREE = 30
MAX_CENTERS = 10_000
#: Monomials a polynomial query in original units may expand to (each term gives up to
#: ``prod_i (p_i + 1)``); beyond it the expansion alone would exhaust memory.
MAX_MONOMIALS = 100_000
#: Sum over a request's queries of (kernels)^2, a Gaussian mixture's centres or a
#: polynomial's monomials (normalised units): a synopsis's error bar costs ``O(J^2 d L)``
#: per query (:func:`app.mechanisms.chebyshev.truncation_estimate`), so this bounds one
#: request's work (1000 queries of 100 centres, or one of 3162; an audit saw a 140-byte
#: polynomial of 10571 monomials take 5.6 GB before this counted them).
MAX_CENTER_PAIRS = 10_000_000
#: Sum over a request's polynomial queries of monomials x d, the entries of their dense
#: exponent tables (int64: 320 MB at the bound). The pair budget admits 10^6 monomials
#: (10^5 queries of 10 one-column terms, about 60 MB of JSON), 8 GB of exponents on a
#: 1000-column table; the answers' work bounds refuse such a batch, but only once it is
#: parsed. ``smooth_synthetic``'s tree and marginals answers admit at most ``4 10^7``
#: (``MAX_ANSWER_WORK / EXPANSION_WORK`` over at least 2 coefficients a factor).
MAX_EXPONENT_ENTRIES = 40_000_000


class GaussianMixtureForm(BaseModel):
    """``sum_j weights_j exp(-sum_i (x_i - centers_ji)^2 / (2 sigma_i^2))``: one centre per
    kernel, with a coordinate per released column (in the release's column order; the
    example is for a release of two columns); ``sigma`` one width or one per column; in
    normalised (``[-1, 1]``) or original units (``space``). Accepted by ``smooth_synthetic``
    and ``smooth_synopsis`` releases."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "type": "gaussian_mixture",
                    "space": "original",
                    "centers": [[14, 20]],
                    "weights": [1.0],
                    "sigma": [3, 4],
                }
            ]
        },
    )

    type: Literal["gaussian_mixture"]
    centers: list[list[float]] = Field(min_length=1, max_length=MAX_CENTERS)
    weights: list[float] = Field(min_length=1, max_length=MAX_CENTERS)
    sigma: float | list[float]
    space: Space = "normalized"


class Term(BaseModel):
    """``coefficient * prod_i x_i^powers_i`` over the named columns."""

    model_config = ConfigDict(extra="forbid", strict=True)

    coefficient: float
    powers: dict[
        str, Annotated[int, Field(ge=0, le=MAX_DEGREE), BeforeValidator(integral_number)]
    ] = Field(default_factory=dict)


class PolynomialForm(BaseModel):
    """A polynomial ``sum_j coefficient_j prod_i x_i^powers_ji`` (columns by name), in
    normalised or original units (``space``). Accepted by ``smooth_synthetic`` and
    ``smooth_synopsis`` releases."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "type": "polynomial",
                    "space": "original",
                    "terms": [{"coefficient": 1, "powers": {"mean_radius": 1}}],
                }
            ]
        },
    )

    type: Literal["polynomial"]
    terms: list[Term] = Field(min_length=1, max_length=1000)
    space: Space = "normalized"


class GaussianFactor(BaseModel):
    """``exp(-(x - center)^2 / (2 sigma^2))``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["gaussian"]
    center: float
    sigma: float = Field(gt=0)


class PolynomialFactor(BaseModel):
    """``coefficients_0 + coefficients_1 x + ...`` (power basis)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["polynomial"]
    coefficients: list[float] = Field(min_length=1, max_length=MAX_DEGREE + 1)


class ChebyshevFactor(BaseModel):
    """``sum_k coefficients_k T_k(x)`` (normalised units only)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["chebyshev"]
    coefficients: list[float] = Field(min_length=1, max_length=1000)


Factor = Annotated[GaussianFactor | PolynomialFactor | ChebyshevFactor, Field(discriminator="type")]


class ProductForm(BaseModel):
    """``weight * prod_i factors_i(x_i)``: one factor per named column (absent columns are
    the constant 1), in normalised or original units (``space``). Accepted by
    ``smooth_synthetic`` and ``smooth_synopsis`` releases."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "type": "product",
                    "space": "original",
                    "factors": {"mean_radius": {"type": "gaussian", "center": 14, "sigma": 3}},
                }
            ]
        },
    )

    type: Literal["product"]
    factors: dict[str, Factor] = Field(min_length=1)
    weight: float = 1.0
    space: Space = "normalized"


SmoothQuery = Annotated[
    GaussianMixtureForm | PolynomialForm | ProductForm, Field(discriminator="type")
]
_QUERIES: TypeAdapter[list[SmoothQuery]] = TypeAdapter(list[SmoothQuery])
#: The forms of :data:`SmoothQuery` (``Mechanism.query_forms`` of both release types).
FORMS: tuple[type[BaseModel], ...] = (GaussianMixtureForm, PolynomialForm, ProductForm)


def _bounds(info: DatasetInfo) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    lower, upper = info.bounds()
    return lower, upper


#: The non-zero power-basis coefficients ``(k, c_k)`` of ``(a + b x')^p``, by ``k``.
_Expansion = tuple[tuple[int, float], ...]


class _Columns:
    """One request's view of the table: column indices by name, the bounds, and the
    expansions of ``(a + b x')^p`` (computed once per column, power and space), so that
    parsing a term costs nothing per column of the table (``info.names`` and
    ``info.bounds()`` build lists of ``d``)."""

    def __init__(self, info: DatasetInfo) -> None:
        self.names = info.names
        self.indices: dict[str, int] = {}
        for i, name in enumerate(self.names):
            self.indices.setdefault(name, i)  # the first, as ``list.index``
        self.lower, self.upper = _bounds(info)
        self._expansions: dict[Space, dict[tuple[str, int], tuple[int, int, _Expansion]]] = {
            "normalized": {},
            "original": {},
        }

    def index(self, name: str) -> int:
        try:
            return self.indices[name]
        except KeyError:
            raise InvalidRequest(f"column {name!r} is not in this release ({self.names})") from None

    def affine(self, i: int, space: Space) -> tuple[float, float]:
        """``x = a + b x'`` for column ``i`` (identity in normalised units)."""
        if space == "normalized":
            return 0.0, 1.0
        half = (self.upper[i] - self.lower[i]) / 2.0
        return float(self.lower[i] + half), float(half)

    def factors(self, powers: Mapping[str, int], space: Space) -> dict[int, tuple[int, _Expansion]]:
        """Column index -> (power, expansion of ``(a + b x')^power``) for a term's powers by
        name (a column named twice keeps its first place and its last power, as a dict
        does)."""
        cache = self._expansions[space]
        out: dict[int, tuple[int, _Expansion]] = {}
        for name, power in powers.items():
            found = cache.get((name, power))
            if found is None:
                i = self.index(name)
                coefficients = polynomial.polypow(self.affine(i, space), power)
                expansion = tuple((k, float(c)) for k, c in enumerate(coefficients) if c != 0.0)
                found = cache[(name, power)] = (i, power, expansion)
            out[found[0]] = found[1:]
        return out


def _gaussian_mixture(form: GaussianMixtureForm, info: DatasetInfo) -> Any:
    d = info.d
    if any(len(center) != d for center in form.centers):  # before a ragged array is built
        raise InvalidRequest(f"centers must be a list of points with {d} coordinates each")
    centers = np.asarray(form.centers, dtype=np.float64)
    if centers.ndim != 2 or centers.shape[1] != d:
        raise InvalidRequest(f"centers must be a list of points with {d} coordinates each")
    if len(form.weights) != centers.shape[0]:
        raise InvalidRequest("weights must have one entry per centre")
    sigma = np.asarray(form.sigma, dtype=np.float64)
    if sigma.ndim == 1 and sigma.shape[0] != d:
        raise InvalidRequest(f"sigma must be a number or a list of {d} widths")
    if np.any(sigma <= 0) or not np.all(np.isfinite(sigma)):
        raise InvalidRequest("sigma must be positive and finite")
    weights = np.asarray(form.weights, dtype=np.float64)
    if form.space == "original":
        lower, upper = _bounds(info)
        with np.errstate(over="ignore", invalid="ignore"):
            centers = 2.0 * (centers - lower) / (upper - lower) - 1.0
        _check_rescaled_centers(centers)
        sigma = 2.0 * np.broadcast_to(sigma, (d,)) / (upper - lower)
    _check_width(sigma)
    if sigma.ndim == 0:
        return GaussianMixture(centers=centers, weights=weights, sigma=float(sigma))
    return AnisotropicGaussianMixture(centers=centers, weights=weights, sigma=sigma)


#: Narrowest Gaussian width on the normalised scale: below it ``2 s^2`` underflows towards 0
#: and an exact answer on a support turned into a division by zero (500) or NaN.
MIN_WIDTH = 1e-12


def _check_rescaled_centers(centers: NDArray[np.float64] | float) -> None:
    """A finite centre in original units whose normalised coordinate overflows (1e308 on
    bounds [0, 1]) is named as such, not as the ``inf`` the client never sent. (A float,
    one factor's centre, is checked without numpy: a product query's factors are checked
    one at a time, and numpy's reductions over a scalar took a third of parsing them.)"""
    finite = math.isfinite(centers) if isinstance(centers, float) else np.isfinite(centers).all()
    if not finite:
        raise InvalidRequest(
            "a centre lies too far outside the declared bounds to be rescaled to [-1, 1] "
            "(its normalised coordinate overflows a float)"
        )


def _check_width(sigma: NDArray[np.float64] | float) -> None:
    narrow = sigma < MIN_WIDTH if isinstance(sigma, float) else bool(np.any(sigma < MIN_WIDTH))
    if narrow:
        raise InvalidRequest(
            f"a Gaussian width is below {MIN_WIDTH} on the normalised scale (the declared "
            "bounds map to [-1, 1]): too narrow to answer"
        )


class _OverBudget(Exception):
    """:func:`_polynomial` stopped: the monomials so far (``count``, a lower bound on its
    final number: rows are never dropped) already exceed the budget it was given."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


def _polynomial(
    form: PolynomialForm,
    info: DatasetInfo,
    columns: _Columns,
    budget: int | None = None,
) -> Polynomial:
    """Expand ``sum_j a_j prod_i (a_i + b_i x'_i)^(p_ji)`` into monomials of ``x'``
    (refused before expanding when the terms would give more than :data:`MAX_MONOMIALS`:
    a term in original units has up to ``prod_i (p_ji + 1)`` monomials).

    Monomials are keyed sparsely while expanding (their ``(column, power)`` pairs with a
    non-zero power, by column), so a monomial costs its own columns, not the table's
    ``d``; the dense ``(J, d)`` exponents are built once at the end, in the order the
    monomials first appear (the order, values and summation order of a dense expansion).
    With a ``budget``, :class:`_OverBudget` as soon as the monomials pass it (checked
    after each term, before anything dense is built)."""
    if form.space == "original":
        size = sum(math.prod(p + 1 for p in term.powers.values()) for term in form.terms)
        if size > MAX_MONOMIALS:
            raise InvalidRequest(
                f"this polynomial expands to {size} monomials in normalised units; at most "
                f"{MAX_MONOMIALS} (use lower powers or fewer columns per term)"
            )
    total: dict[tuple[tuple[int, int], ...], float] = {}
    for term in form.terms:
        # A term names each column once, so its monomials are distinct: one per choice of
        # a power k per column, in the order of its columns (the first column slowest),
        # worth ``coefficient * c_1 * ... * c_m`` in that order. (A dense expansion summed
        # each into ``0.0``, which only turns -0.0 into 0.0: as adding it to ``total`` does.)
        values = [term.coefficient]
        fixed: list[tuple[int, int]] = []  # columns of one coefficient: the same in every one
        choices: list[list[tuple[int, int]]] = []
        for i, (_, coefficients) in columns.factors(term.powers, form.space).items():
            if len(coefficients) == 1:
                k, c = coefficients[0]
                if c != 1.0:  # x * 1.0 is x
                    values = [value * c for value in values]
                if k:
                    fixed.append((i, k))
            else:
                values = [value * c for value in values for _, c in coefficients]
                choices.append([(i, k) for k, _ in coefficients])
        for combination, value in zip(itertools.product(*choices), values, strict=True):
            key = tuple(sorted([*fixed, *(entry for entry in combination if entry[1])]))
            total[key] = total.get(key, 0.0) + value
        if budget is not None and len(total) > budget:
            raise _OverBudget(len(total))
    if not total:
        total = {(): 0.0}
    if not all(math.isfinite(value) for value in total.values()):
        # the caller's coefficients are finite (the form checks them): rescaling to
        # [-1, 1] multiplies them by powers of the columns' half-widths and centres, and
        # a monomial named twice adds its coefficients
        if form.space == "normalized":  # finite terms whose sum overflows
            raise InvalidRequest("this polynomial's coefficients overflow a float; scale it down")
        raise InvalidRequest(
            "this polynomial's coefficients overflow a float when rescaled to [-1, 1] "
            "(powers of its columns' half-widths); scale it down or write it in space "
            "'normalized'"
        )
    keys = list(total)
    lengths = np.fromiter((len(key) for key in keys), dtype=np.int64, count=len(keys))
    flat = np.array([entry for key in keys for entry in key], dtype=np.int64).reshape(-1, 2)
    exponents = np.zeros((len(keys), info.d), dtype=np.int64)
    exponents[np.repeat(np.arange(len(keys)), lengths), flat[:, 0]] = flat[:, 1]
    return Polynomial(exponents=exponents, coefficients=np.array(list(total.values())))


def _monomials_at_least(form: PolynomialForm, columns: _Columns) -> int:
    """A lower bound on the monomials :func:`_polynomial` gives ``form`` (its rows are
    never dropped, zero coefficients included): the most any one term expands to (a term's
    monomials are distinct), and the number of distinct leading monomials (``prod_i
    x_i^p_i`` of each term whose leading coefficient is non-zero; distinct powers give
    distinct monomials). Exact in normalised units. 0 for a form that is refused on its
    own (an unknown column, more than :data:`MAX_MONOMIALS`), which is left to say so."""
    if form.space == "original":
        size = sum(math.prod(p + 1 for p in term.powers.values()) for term in form.terms)
        if size > MAX_MONOMIALS:
            return 0
    largest = 0
    leading: set[tuple[tuple[int, int], ...]] = set()
    for term in form.terms:
        try:
            factors = columns.factors(term.powers, form.space)
        except InvalidRequest:
            return 0
        count = 1
        top: list[tuple[int, int]] = []
        has_top = True
        for i, (power, coefficients) in factors.items():
            count *= len(coefficients)
            # the leading coefficient b^p is the last non-zero one when k == p
            has_top = has_top and bool(coefficients) and coefficients[-1][0] == power
            if power:
                top.append((i, power))
        largest = max(largest, count)
        if has_top:
            leading.add(tuple(sorted(top)))
    return max(1, largest, len(leading))


def _too_many_exponents(monomials: int, d: int) -> InvalidRequest:
    return InvalidRequest(
        f"these polynomials have at least {monomials} monomials in "
        f"normalised units over {d} columns, {monomials * d} exponents; at most "
        f"{MAX_EXPONENT_ENTRIES} per request: split the batch or use fewer terms, lower "
        "powers or fewer columns per term"
    )


def _too_many_pairs(pairs: int) -> InvalidRequest:
    return InvalidRequest(
        f"these queries have at least {pairs} pairs of kernels (sum over "
        f"queries of centres^2 or monomials^2 in normalised units); at most {MAX_CENTER_PAIRS} "
        "per request: split the batch or use fewer centres, lower powers or fewer columns per "
        "term"
    )


def _product(form: ProductForm, info: DatasetInfo, columns: _Columns) -> ProductQuery:
    factors: list[Any] = [None] * info.d
    for name, factor in form.factors.items():
        i = columns.index(name)
        a, b = columns.affine(i, form.space)
        if isinstance(factor, GaussianFactor):
            # exp(-(x - c)^2 / (2 s^2)) with x = a + b x' is exp(-(x' - c')^2 / (2 s'^2)),
            # c' = (c - a) / b, s' = s / b; the library expands it exactly (chebyshev)
            _check_width(float(factor.sigma / b))
            center = float((factor.center - a) / b)
            _check_rescaled_centers(center)
            factors[i] = Gaussian1D(center=center, sigma=factor.sigma / b)
        elif isinstance(factor, PolynomialFactor):
            # g(x) = sum_k a_k x^k with x = a + b x': compose, then to Chebyshev coefficients
            composed: Any = np.zeros(1)
            power: Any = np.ones(1)
            for coefficient in factor.coefficients:
                composed = polynomial.polyadd(composed, coefficient * power)
                power = polynomial.polymul(power, [a, b])
            factors[i] = chebyshev.poly2cheb(composed)
        else:
            if form.space != "normalized":
                raise InvalidRequest("chebyshev factors are given on the normalised scale only")
            factors[i] = np.asarray(factor.coefficients, dtype=np.float64)
    return ProductQuery(factors=tuple(factors), weight=form.weight)


@dataclass(frozen=True)
class RawSizes:
    """Sizes read off a batch of JSON queries before it is parsed, each a lower bound on
    what its parse (:func:`parse`) gives when it parses at all: the queries, and of those
    that look like forms, the products, their factors that name a column of the release
    (distinct columns: a product has a factor for each), the Gaussian mixtures and their
    centres. What a release type needs to bound a batch's work from below without parsing
    it (a 64 MiB body of 30-factor products took about 20 s to parse before its work was
    refused)."""

    queries: int
    products: int = 0
    product_factors: int = 0
    mixtures: int = 0
    mixture_centers: int = 0
    polynomials: int = 0


def raw_sizes(queries: Sequence[Any], info: DatasetInfo) -> RawSizes:
    """:class:`RawSizes` of a batch of JSON queries (dicts and lists, as decoded): a few
    dictionary lookups a query, nothing validated."""
    names = set(info.names)
    products = factors = mixtures = centers = polynomials = 0
    for query in queries:
        if not isinstance(query, Mapping):
            continue
        kind = query.get("type")
        if kind == "product":
            named = query.get("factors")
            if isinstance(named, Mapping):
                products += 1
                factors += sum(1 for name in named if name in names)
        elif kind == "gaussian_mixture":
            kernels = query.get("centers")
            if isinstance(kernels, list):
                mixtures += 1
                centers += len(kernels)
        elif kind == "polynomial":
            polynomials += 1
    return RawSizes(len(queries), products, factors, mixtures, centers, polynomials)


def parse(queries: Sequence[Mapping[str, Any]], info: DatasetInfo) -> list[Any]:
    """The library query objects (normalised scale) for a batch of JSON queries, or 422."""
    forms = registry.validate_queries(_QUERIES, queries)
    pairs = sum(len(f.centers) ** 2 for f in forms if isinstance(f, GaussianMixtureForm))
    if pairs > MAX_CENTER_PAIRS:
        raise InvalidRequest(
            f"these queries have {pairs} pairs of centres (sum of centres^2); at most "
            f"{MAX_CENTER_PAIRS} per request: split the batch or use fewer centres"
        )
    # refused before any polynomial is expanded when a lower bound on its monomials
    # already proves the batch over; then each expansion stops as soon as it passes what
    # the budgets leave it
    columns = _Columns(info)
    at_least = [
        _monomials_at_least(f, columns) if isinstance(f, PolynomialForm) else 0 for f in forms
    ]
    pairs += sum(m * m for m in at_least)
    if pairs > MAX_CENTER_PAIRS:
        raise _too_many_pairs(pairs)
    monomials = sum(at_least)
    if monomials * info.d > MAX_EXPONENT_ENTRIES:
        raise _too_many_exponents(monomials, info.d)
    out: list[Any] = []
    for position, form in enumerate(forms):
        # the most monomials a polynomial may have with the others' counts as they stand
        # (expanded, or their lower bounds): past it, refused mid-expansion
        other_pairs = pairs - at_least[position] ** 2
        other_monomials = monomials - at_least[position]
        budget = min(
            math.isqrt(MAX_CENTER_PAIRS - other_pairs),
            MAX_EXPONENT_ENTRIES // info.d - other_monomials,
        )
        try:
            if isinstance(form, GaussianMixtureForm):
                out.append(_gaussian_mixture(form, info))
            elif isinstance(form, PolynomialForm):
                out.append(_polynomial(form, info, columns, budget))
            else:
                out.append(_product(form, info, columns))
        except _OverBudget as over:  # the batch's budgets, not this query's own refusal
            if other_pairs + over.count**2 > MAX_CENTER_PAIRS:
                raise _too_many_pairs(other_pairs + over.count**2) from None
            raise _too_many_exponents(other_monomials + over.count, info.d) from None
        except InvalidRequest as exc:
            raise InvalidRequest(f"queries.{position}: {exc.message}") from None
        except MechanismError as exc:
            raise InvalidRequest(f"queries.{position}: {exc}") from None
        if isinstance(form, PolynomialForm):
            # a polynomial's monomials are its kernels: they count against the same budget
            # within both budgets (its expansion stops past them): its exact count replaces
            # its lower bound for the next ones
            count = out[-1].exponents.shape[0]
            pairs += count**2 - at_least[position] ** 2
            monomials += count - at_least[position]
    return out


def refusal(
    exc: MechanismError, parsed: Sequence[Any], answer: Callable[[Sequence[Any]], object]
) -> InvalidRequest:
    """The 422 for a batch whose answering raised ``exc``, naming the first query that is
    refused on its own. Found by bisection (``answer`` on halves of the batch, so at most
    about twice the batch's work, and only on this error path); a refusal no single query
    reproduces names the batch."""
    low, high = 0, len(parsed)  # the first refused query, if any, lies in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        try:
            answer(parsed[low:middle])
        except MechanismError:
            high = middle
        else:
            low = middle
    try:
        answer(parsed[low:high])
    except MechanismError as one:
        # the mechanism's own "query 0: " is the position in the batch of one
        return InvalidRequest(f"queries.{low}: {str(one).removeprefix('query 0: ')}")
    return InvalidRequest(f"queries: {exc}")
