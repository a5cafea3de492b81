"""``smooth_synopsis``: the noisy moment summary of paper 001 and its public evaluation.

Wang, Fan, Zhang, Wang, *Efficient Algorithm for Privately Releasing Smooth Queries*
(NIPS 2013), paper 001.

Measure (Algorithm 1)
---------------------
For an index set ``S`` of ``R`` non-constant multi-indices the summary is the vector of
moments ``b_r = (1/n) sum_{x in D} T_r(x)``, ``T_r(x) = prod_i cos(r_i arccos x_i)``
(:func:`app.mechanisms.basis.moments`), plus noise drawn by OpenDP
(:mod:`app.mechanisms.noise`):

* ``delta = 0``: vector Laplace, scale ``b = Delta_1 / epsilon`` with the L1 sensitivity
  ``Delta_1 = 2R/n`` (paper 001 writes ``Lap(t^d / (n eps))``; under replace-one
  neighbours each ``|b_r(D) - b_r(D')| <= 2/n`` because ``|T_r| <= 1``, and the constant
  ``r = 0`` is left out: it is exactly 1);
* ``delta > 0``: vector Gaussian with the L2 sensitivity ``Delta_2 = 2 sqrt(R)/n``, the
  scale found from OpenDP's zCDP map so the charged ``(epsilon, delta)`` fits the request.

**Privacy.** The moment vector is the only statistic of the data that is released; it is
protected by one Laplace (pure ``epsilon``-DP) or Gaussian (``(epsilon, delta)``-DP)
measurement calibrated to its sensitivity under replace-one neighbours. ``n`` and ``d``
are public (DESIGN §2.2), and the index set is chosen from public parameters only
(``n, d, epsilon, delta, K``; never from the data), so everything else in a
:class:`Synopsis` -- answers, standard errors, intervals -- is post-processing.

Evaluate (Algorithm 2)
----------------------
A query ``f`` has the Chebyshev expansion ``f = c_0 + sum_r c_r T_r``
(:mod:`app.mechanisms.chebyshev`); its answer from the synopsis is

    answer = c_0 + <c_S, b_hat>                                   (Algorithm 2)

(``T_0 = 1`` and its moment is exactly 1, so ``c_0`` carries no noise). With
``b_hat = b + eta`` the error is ``<c_S, eta> + e_trunc`` where
``|e_trunc| = |sum_{r not in S} c_r b_r| <= tau`` (the truncation bound) for every
dataset. The noise term has mean 0 and standard error

    stderr = s ||c_S||_2,   s = sqrt(2) b (Laplace) or sigma (Gaussian).

The ``level`` interval is ``answer +- (q_level * stderr + tau)``, where ``q_level`` is the
two-sided ``level`` quantile of ``<c_S, eta> / stderr``: the normal quantile for Gaussian
noise (exact), and for Laplace noise the Lugannani-Rice saddlepoint quantile of the
weighted Laplace sum (its cumulant generating function is
``K(u) = -sum_r log(1 - b^2 c_r^2 u^2)``). A normal approximation would under-cover when
``c_S`` sits on a few coordinates (one coordinate: the exact factor is
``log(1/(1 - level)) / sqrt 2 = 2.118`` at 95 %, not 1.96); the saddlepoint factor moves
from 2.12 to 1.96 as ``c_S`` spreads and over-covers by less than 0.1 % (tests). Hence
the interval covers ``q_f(D)`` with probability at least ``level`` (to that accuracy).
The bound ``tau`` is a worst case over all datasets, so when it is not small against the
noise the interval over-covers; :class:`Answer` reports both parts.

Choice of the index set (public parameters only)
-------------------------------------------------
``basis="paper"`` is Theorem 3.1: the full tensor ``{0..t-1}^d`` with
``t = ceil(n^(1/(2d+K)))``. For real ``n`` and ``d`` this is either far too large
(``t^d`` functions) or uninformative, so the default ``basis="auto"`` chooses from the
noise level: for each candidate -- complete total-degree sets ``|r| <= D`` (``D = 1, 2,
...``) and full tensors ``t = 2, 3, ...`` up to ``max_basis_size`` functions -- it
predicts the interval half-width ``W(S) = z * s(R) * sqrt(E ||c_S||^2) + E tau(S)`` of a
*representative K-smooth query*, one Gaussian kernel ``exp(-||x - c||^2 / (2K))`` (width
``sigma = sqrt(K)``: ``K``-smooth with norm <= 1 for ``K <= sigma^2``, paper 000
Prop. 2.1) with centre ``c ~ U[-1, 1]^d``, and keeps the smallest ``W``. ``s(R)`` is the
calibrated noise standard deviation for ``R`` moments, and since the kernel is a product
over columns with independent centre coordinates, both expectations factorise
(``E prod_i = prod_i E``) and are computed exactly from 1-D quadrature over ``c``, and for
total-degree sets by truncated polynomial powers (no enumeration). This trades noise
(growing like ``R`` or ``sqrt R``) against truncation (shrinking with the degree) for
queries of the declared smoothness; ``basis_size=R`` forces the ``R`` lowest-total-degree
functions instead (paper 000 §3.4).

``tau`` is a bound over *all* datasets (a point mass at a corner of the cube attains
``|T_r| = 1``); on real data the truncation error is typically 10-1000 times smaller, so
``"auto"`` intervals over-cover (measured: ~100 % for a nominal 95 %) while staying the
narrowest honest ones. ``basis="nominal"`` instead takes the narrowest candidate whose
predicted ``tau`` is at most 10 % of the predicted noise half-width: coverage close to 95 %
(at most ``P(|Z| <= 1.1 z) = 96.9 %`` when the actual truncation error is negligible),
bought with a larger basis and more noise (measured in ``bench/results``).

Service notes
-------------
* Store ``Synopsis.to_dict()`` (JSON, exact round trip); answer later with
  ``Synopsis.from_dict(doc).answer_many(queries)`` -- no data needed. ``Answer.as_dict()``
  gives ``value``, ``stderr``, ``interval`` and its two parts.
* A Gaussian-mixture query in original units (centre ``c``, widths ``s_i``) on a column
  normalised by ``x' = 2 (x - lo_i) / (hi_i - lo_i) - 1`` is the
  :class:`~app.mechanisms.queries.AnisotropicGaussianMixture` with centre
  ``2 (c_i - lo_i) / (hi_i - lo_i) - 1`` and ``sigma_i = 2 s_i / (hi_i - lo_i)``.
* :func:`choose_basis` needs no data: it can preview ``R``, the noise scale and the
  predicted stderr / truncation of a request before any budget is spent.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtr, ndtri

from app.mechanisms import noise
from app.mechanisms.basis import (
    MAX_INDEX_SET_SIZE,
    IndexSet,
    count_total_degree,
    full_tensor,
    moments,
    total_degree,
)
from app.mechanisms.chebyshev import (
    QueryCoefficients,
    TensorExpansion,
    expand,
    gaussian_expansion,
    gaussian_factors,
    query_coefficients,
    restrict,
    stack_expansions,
)
from app.mechanisms.data import RowSource, as_source
from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import PrivacyCost, check_budget
from app.mechanisms.queries import (
    AnisotropicGaussianMixture,
    GaussianMixture,
    GaussianMixtureBatch,
)

MECHANISM_ID = "smooth_synopsis"
FORMAT_VERSION = 1
MEASURE_STEP = "moments"

#: Default largest index set the automatic rule considers (moments cost ``O(n R)``,
#: answering ``10^4`` Gaussian-mixture queries costs ``O(10^5 R)``).
DEFAULT_MAX_BASIS_SIZE = 20_000

BASIS_RULES = ("auto", "nominal", "paper", "total_degree", "full_tensor")

#: ``basis="nominal"``: largest predicted truncation bound, as a share of the predicted
#: 95 % noise half-width, for the interval to stay close to its nominal coverage.
NOMINAL_TRUNCATION_SHARE = 0.1

#: Queries per block in :meth:`Synopsis.answer_many`.
ANSWER_BLOCK = 256

# Laplace saddlepoint: coordinates kept exactly (the rest is lumped as a Gaussian term),
# and the effective number of coordinates above which the normal quantile is used.
_SADDLEPOINT_TERMS = 64
_NORMAL_NEFF = 1e4


# --- resolved basis ----------------------------------------------------------------------


@dataclass(frozen=True)
class BasisCandidate:
    """One index set considered by the rule and its predicted accuracy (representative query)."""

    kind: str
    parameter: int
    size: int
    coordinate_stddev: float
    predicted_stderr: float
    predicted_truncation: float

    @property
    def predicted_halfwidth(self) -> float:
        """``W = z_0.95 * predicted_stderr + predicted_truncation``."""
        return float(ndtri(0.975)) * self.predicted_stderr + self.predicted_truncation

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "parameter": self.parameter,
            "size": self.size,
            "coordinate_stddev": self.coordinate_stddev,
            "predicted_stderr": self.predicted_stderr,
            "predicted_truncation": self.predicted_truncation,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BasisCandidate:
        return cls(
            kind=str(data["kind"]),
            parameter=int(data["parameter"]),
            size=int(data["size"]),
            coordinate_stddev=float(data["coordinate_stddev"]),
            predicted_stderr=float(data["predicted_stderr"]),
            predicted_truncation=float(data["predicted_truncation"]),
        )


@dataclass(frozen=True)
class BasisChoice:
    """How the index set was chosen: the rule, the chosen set and what was predicted.

    ``candidates`` lists every set the rule compared (just the chosen one for explicit
    choices). Predictions are for the representative query of smoothness ``smoothness``
    (module docstring) and depend on public parameters only.
    """

    rule: str
    smoothness: int
    chosen: BasisCandidate
    candidates: tuple[BasisCandidate, ...] = field(default=())
    paper_t: int = 0

    def __post_init__(self) -> None:
        if self.rule not in (*BASIS_RULES, "custom"):
            raise MechanismError(f"basis rule ({self.rule!r}) must be one of {BASIS_RULES}")
        if self.smoothness < 1:
            raise MechanismError(f"smoothness ({self.smoothness}) must be a positive integer")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "smoothness": self.smoothness,
            "paper_t": self.paper_t,
            "chosen": self.chosen.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BasisChoice:
        return cls(
            rule=str(data["rule"]),
            smoothness=int(data["smoothness"]),
            chosen=BasisCandidate.from_dict(data["chosen"]),
            candidates=tuple(BasisCandidate.from_dict(c) for c in data["candidates"]),
            paper_t=int(data["paper_t"]),
        )


def paper_t(n: int, d: int, smoothness: int) -> int:
    """Theorem 3.1 of paper 000 / Algorithm 1 of paper 001: ``t = ceil(n^(1/(2d+K)))``."""
    return max(2, math.ceil(math.pow(n, 1.0 / (2 * d + smoothness))))


def choose_basis(
    n: int,
    d: int,
    *,
    epsilon: float,
    delta: float = 0.0,
    smoothness: int = 4,
    basis: str | IndexSet = "auto",
    basis_size: int | None = None,
    max_basis_size: int = DEFAULT_MAX_BASIS_SIZE,
    mechanism: str | None = None,
) -> tuple[IndexSet, BasisChoice]:
    """The index set for a release, from public parameters only (module docstring).

    ``basis``: ``"auto"`` (noise-aware rule over total-degree and full-tensor sets),
    ``"nominal"`` (the same candidates, restricted to those whose predicted truncation
    bound is at most :data:`NOMINAL_TRUNCATION_SHARE` of the predicted 95 % noise
    half-width, so that intervals cover close to their nominal level; falls back to
    ``"auto"`` when no candidate qualifies),
    ``"total_degree"`` / ``"full_tensor"`` (the rule within that family), ``"paper"``
    (Theorem 3.1's ``t``), or an :class:`IndexSet`. ``basis_size=R`` fixes the size: the
    ``R`` lowest-total-degree functions, or for ``"full_tensor"`` the set with
    ``t^d - 1 = R``. Usable without data, e.g. to preview the accuracy of a request.
    """
    check_budget(epsilon, delta)
    _check_positive("n", n)
    _check_positive("d", d)
    _check_positive("smoothness", smoothness)
    _check_positive("max_basis_size", max_basis_size)
    mech = _mechanism(delta, mechanism)
    stats = _RepresentativeQuery(d, smoothness)

    def candidate(kind: str, parameter: int, index_set: IndexSet | None = None) -> BasisCandidate:
        if kind == "total_degree_complete":
            size = count_total_degree(d, parameter)
            v, kept = stats.total_degree_sums(parameter)
            kind = "total_degree"
        elif kind == "full_tensor":
            size = parameter**d - 1
            v, kept = stats.full_tensor_sums(parameter)
        else:
            assert index_set is not None
            size = index_set.size
            v, kept = stats.index_set_sums(index_set)
        s = _coordinate_stddev(mech, n, size, epsilon, delta)
        return BasisCandidate(
            kind=kind,
            parameter=parameter if kind == "full_tensor" else size,
            size=size,
            coordinate_stddev=s,
            predicted_stderr=s * math.sqrt(max(v, 0.0)),
            predicted_truncation=max(stats.total_l1 - kept, 0.0),
        )

    t_paper = paper_t(n, d, smoothness)
    if isinstance(basis, IndexSet):
        if basis.dim != d:
            raise MechanismError(f"the index set has d = {basis.dim}; the data has d = {d}")
        chosen = candidate("custom", basis.size, basis)
        return basis, BasisChoice("custom", smoothness, chosen, (chosen,), t_paper)
    if basis not in BASIS_RULES:
        raise MechanismError(f"basis ({basis!r}) must be one of {BASIS_RULES} or an IndexSet")
    if basis == "paper":
        if basis_size is not None:
            raise MechanismError("basis='paper' sets t itself; leave basis_size=None")
        index_set = full_tensor(d, t_paper)  # raises if t^d - 1 is too large
        chosen = candidate("full_tensor", t_paper)
        return index_set, BasisChoice("paper", smoothness, chosen, (chosen,), t_paper)
    if basis_size is not None:
        _check_positive("basis_size", basis_size)
        if basis == "full_tensor":
            t = round((basis_size + 1) ** (1.0 / d))
            if t**d - 1 != basis_size:
                raise MechanismError(
                    f"basis_size ({basis_size}) is not t^d - 1 for any t (d = {d}); "
                    "a full tensor basis has t^d - 1 functions"
                )
            index_set = full_tensor(d, t)
            chosen = candidate("full_tensor", t)
        else:
            index_set = total_degree(d, basis_size)
            chosen = candidate("custom", basis_size, index_set)
            chosen = BasisCandidate(
                "total_degree",
                basis_size,
                basis_size,
                chosen.coordinate_stddev,
                chosen.predicted_stderr,
                chosen.predicted_truncation,
            )
        return index_set, BasisChoice(basis, smoothness, chosen, (chosen,), t_paper)
    limit = min(max_basis_size, MAX_INDEX_SET_SIZE)
    candidates: list[BasisCandidate] = []
    if basis in ("auto", "nominal", "total_degree"):
        degrees = _thinned(lambda D: count_total_degree(d, D), 1, limit)
        candidates += [candidate("total_degree_complete", D) for D in degrees]
    if basis in ("auto", "nominal", "full_tensor"):
        ts = _thinned(lambda t: t**d - 1, 2, limit)
        candidates += [candidate("full_tensor", t) for t in ts]
    if not candidates:
        raise MechanismError(
            f"no {basis} index set in d = {d} has at most max_basis_size = {limit} functions; "
            "raise max_basis_size or pass basis_size"
        )
    best = min(candidates, key=lambda c: (c.predicted_halfwidth, c.size))
    if basis == "nominal":
        z = float(ndtri(0.975))
        small_bias = [
            c
            for c in candidates
            if c.predicted_truncation <= NOMINAL_TRUNCATION_SHARE * z * c.predicted_stderr
        ]
        if small_bias:
            best = min(small_bias, key=lambda c: (c.predicted_halfwidth, c.size))
    if best.kind == "full_tensor":
        index_set = full_tensor(d, best.parameter)
    else:
        index_set = total_degree(d, best.size)
    return index_set, BasisChoice(basis, smoothness, best, tuple(candidates), t_paper)


def _thinned(size: Callable[[int], int], first: int, limit: int) -> list[int]:
    """Parameters ``p = first, first+1, ...`` with ``size(p) <= limit``, each kept only if
    its size exceeds the last kept one by 10 % (at most ~100 candidates in small ``d``),
    plus the largest."""
    kept: list[int] = []
    p = first
    last = 0
    while size(p) <= limit:
        if size(p) >= 1.1 * last:
            kept.append(p)
            last = size(p)
        p += 1
    if p - 1 >= first and (not kept or kept[-1] != p - 1):
        kept.append(p - 1)
    return kept


class _RepresentativeQuery:
    """Per-column statistics of ``exp(-(x - c)^2 / (2K))`` with ``c ~ U[-1, 1]``.

    ``a1[k] = E|a_k(c)|`` and ``a2[k] = E a_k(c)^2`` by 64-point Gauss-Legendre quadrature
    over ``c``; ``n1 = E ||a(c)||_1`` plus the proven 1-D tail. Column statistics multiply
    because the centre's coordinates are independent.
    """

    def __init__(self, d: int, smoothness: int, length: int = 64) -> None:
        nodes, weights = np.polynomial.legendre.leggauss(64)
        factors, tails = gaussian_factors(nodes[:, None], np.array([math.sqrt(smoothness)]), length)
        a = factors[:, 0, :]
        self.d = d
        self.a1 = (weights / 2.0) @ np.abs(a)
        self.a2 = (weights / 2.0) @ (a * a)
        self.total_l1 = float((self.a1.sum() + tails[0]) ** d)

    def _graded(self, a: NDArray[np.float64], degree: int) -> float:
        """``sum_{|r| <= degree} prod_i a[r_i]`` by a truncated polynomial power."""
        base = a[: min(degree + 1, a.size)]  # short: the tail past len(a) is ~0
        power = np.zeros(degree + 1)
        power[0] = 1.0
        for _ in range(self.d):
            power = np.convolve(power, base)[: degree + 1]
        return float(power.sum())

    def total_degree_sums(self, degree: int) -> tuple[float, float]:
        """``(sum_{r in S} prod a2, sum_{r in S u 0} prod a1)`` for ``S = {0 < |r| <= degree}``."""
        v = self._graded(self.a2, degree) - float(self.a2[0]) ** self.d
        return v, self._graded(self.a1, degree)

    def full_tensor_sums(self, t: int) -> tuple[float, float]:
        v = float(self.a2[:t].sum()) ** self.d - float(self.a2[0]) ** self.d
        return v, float(self.a1[:t].sum()) ** self.d

    def index_set_sums(self, index_set: IndexSet) -> tuple[float, float]:
        # degrees past the computed length have coefficients below the proven 1-D tail
        a1 = np.zeros(max(self.a1.size, index_set.max_degree + 1))
        a2 = np.zeros_like(a1)
        a1[: self.a1.size] = self.a1
        a2[: self.a2.size] = self.a2
        deg = index_set.degrees
        v = float(np.prod(a2[deg], axis=1).sum())
        kept = float(np.prod(a1[deg], axis=1).sum()) + float(a1[0]) ** self.d
        return v, kept


# --- the synopsis ------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One answer: ``value``, its ``stderr`` and the ``level`` interval.

    ``low, high = value -+ (noise_halfwidth + truncation_bound)`` with
    ``noise_halfwidth = q_level * stderr`` (module docstring).
    """

    value: float
    stderr: float
    truncation_bound: float
    noise_halfwidth: float
    level: float
    method: str
    rigorous: bool

    @property
    def low(self) -> float:
        return self.value - self.noise_halfwidth - self.truncation_bound

    @property
    def high(self) -> float:
        return self.value + self.noise_halfwidth + self.truncation_bound

    @property
    def interval(self) -> tuple[float, float]:
        return self.low, self.high

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form: value, stderr, interval and how it is made up."""
        return {
            "value": self.value,
            "stderr": self.stderr,
            "interval": [self.low, self.high],
            "level": self.level,
            "noise_halfwidth": self.noise_halfwidth,
            "truncation_bound": self.truncation_bound,
            "method": self.method,
            "rigorous": self.rigorous,
        }


@dataclass(frozen=True, eq=False)
class Answers:
    """Vectorised :class:`Answer` for ``Q`` queries (arrays of shape ``(Q,)``)."""

    values: NDArray[np.float64]
    stderr: NDArray[np.float64]
    truncation_bound: NDArray[np.float64]
    noise_halfwidth: NDArray[np.float64]
    level: float
    rigorous: NDArray[np.bool_]
    methods: tuple[str, ...]

    @property
    def low(self) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self.values - self.noise_halfwidth - self.truncation_bound
        return out

    @property
    def high(self) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self.values + self.noise_halfwidth + self.truncation_bound
        return out

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def __getitem__(self, i: int) -> Answer:
        return Answer(
            value=float(self.values[i]),
            stderr=float(self.stderr[i]),
            truncation_bound=float(self.truncation_bound[i]),
            noise_halfwidth=float(self.noise_halfwidth[i]),
            level=self.level,
            method=self.methods[i],
            rigorous=bool(self.rigorous[i]),
        )


@dataclass(frozen=True, eq=False)
class Synopsis:
    """A released ``smooth_synopsis``: the noisy moments and everything needed to use them.

    ``moments[j]`` is the noisy ``b_hat_r`` of the ``j``-th index of ``index_set``;
    ``calibration`` is the public noise law (distribution, scale, sensitivity, charged
    cost). Data live on ``[-1, 1]^d`` (the service normalises with declared bounds).
    """

    index_set: IndexSet
    moments: NDArray[np.float64]
    calibration: noise.NoiseCalibration
    n: int
    smoothness: int
    basis: BasisChoice

    def __post_init__(self) -> None:
        values = np.array(self.moments, dtype=np.float64, copy=True)
        if values.shape != (self.index_set.size,):
            raise MechanismError(
                f"moments must be a vector of length R = {self.index_set.size}; "
                f"got shape {values.shape}"
            )
        if not np.all(np.isfinite(values)):
            raise MechanismError("moments must be finite")
        if self.calibration.dimension != self.index_set.size:
            raise MechanismError(
                f"the noise calibration is for {self.calibration.dimension} values; "
                f"the index set has R = {self.index_set.size}"
            )
        _check_positive("n", self.n)
        _check_positive("smoothness", self.smoothness)
        values.setflags(write=False)
        object.__setattr__(self, "moments", values)

    # -- public noise law and cost

    @property
    def d(self) -> int:
        return self.index_set.dim

    @property
    def size(self) -> int:
        """``R``, the number of released moments."""
        return self.index_set.size

    @property
    def noise_distribution(self) -> str:
        return self.calibration.distribution

    @property
    def noise_scale(self) -> float:
        """Laplace scale ``b`` or Gaussian standard deviation ``sigma`` of each coordinate."""
        return self.calibration.scale

    @property
    def privacy_cost(self) -> PrivacyCost:
        return PrivacyCost.compose([self.calibration.cost_part(MEASURE_STEP)])

    # -- answering

    def coefficients(
        self, query: object, *, rng: np.random.Generator | None = None
    ) -> QueryCoefficients:
        """``c_0``, ``c_S`` and the truncation bound of ``query`` (:mod:`.chebyshev`)."""
        return query_coefficients(query, self.index_set, smoothness=self.smoothness, rng=rng)

    def evaluate(
        self, query: object, *, level: float = 0.95, rng: np.random.Generator | None = None
    ) -> Answer:
        """Answer, standard error and ``level`` interval of one query (Algorithm 2)."""
        coef = self.coefficients(query, rng=rng)
        if coef.n_queries != 1:
            raise MechanismError("evaluate() takes one query; use answer_many() for a batch")
        out = self._answers(coef, level)
        return Answer(
            value=float(out.values[0]),
            stderr=float(out.stderr[0]),
            truncation_bound=float(out.truncation_bound[0]),
            noise_halfwidth=float(out.noise_halfwidth[0]),
            level=level,
            method=coef.method,
            rigorous=coef.rigorous,
        )

    def answer(self, query: object) -> float:
        """``c_0 + <c_S, b_hat>``: the public evaluation of paper 001, Algorithm 2."""
        return self.evaluate(query).value

    def stderr(self, query: object) -> float:
        """Standard error of :meth:`answer` from the known noise: ``s ||c_S||_2``."""
        return self.evaluate(query).stderr

    def interval(self, query: object, level: float = 0.95) -> tuple[float, float]:
        """``answer -+ (q_level * stderr + truncation_bound)`` (module docstring)."""
        return self.evaluate(query, level=level).interval

    def answer_many(
        self,
        queries: GaussianMixtureBatch | Sequence[object],
        *,
        level: float = 0.95,
        block: int = ANSWER_BLOCK,
    ) -> Answers:
        """Answers of many queries, vectorised.

        A :class:`GaussianMixtureBatch` (and runs of Gaussian mixtures with the same
        number of centres and widths in a sequence) is expanded ``block`` queries at a
        time: 1-D coefficient tables from one DCT per block, the ``(block, R)``
        coefficient matrix by products over each index's nonzero entries, then one
        matrix-vector product with the moments.
        """
        _check_level(level)
        if isinstance(queries, GaussianMixtureBatch):
            return self._answer_batch(queries, level, block)
        items = list(queries)
        if not items:
            raise MechanismError("answer_many() needs at least one query")
        parts: list[tuple[NDArray[np.int64], Answers]] = []
        groups: dict[tuple[Any, ...], list[int]] = {}
        others: list[int] = []
        for i, q in enumerate(items):
            if isinstance(q, GaussianMixtureBatch):
                raise MechanismError(
                    f"item {i} is a GaussianMixtureBatch; pass a batch on its own, not in a list"
                )
            key = _gaussian_key(q)
            if key is None:
                others.append(i)
            else:
                groups.setdefault(key, []).append(i)
        for indices in groups.values():
            members = [items[i] for i in indices]
            centers = np.stack([_mixture_arrays(m)[0] for m in members])
            weights = np.stack([_mixture_arrays(m)[1] for m in members])
            sigma = np.broadcast_to(_mixture_arrays(members[0])[2], (centers.shape[2],))
            if centers.shape[2] != self.d:
                raise MechanismError(
                    f"the query has d = {centers.shape[2]} columns but the synopsis has "
                    f"d = {self.d}"
                )
            answers = self._answer_gaussian(centers, weights, sigma, level, block)
            parts.append((np.asarray(indices), answers))
        expansions: list[TensorExpansion] = []
        separable: list[int] = []
        general: list[int] = []
        for i in others:
            expansion = expand(items[i], self.d, min_length=self.index_set.max_degree + 1)
            if expansion is None:
                general.append(i)
            else:
                expansions.append(expansion)
                separable.append(i)
        for start in range(0, len(expansions), block):
            stacked = stack_expansions(expansions[start : start + block])
            parts.append(
                (
                    np.asarray(separable[start : start + block]),
                    self._answers(restrict(stacked, self.index_set), level),
                )
            )
        for i in general:
            parts.append((np.asarray([i]), self._answers(self.coefficients(items[i]), level)))
        return _merge(parts, len(items), level)

    # -- internals

    def _answer_batch(self, batch: GaussianMixtureBatch, level: float, block: int) -> Answers:
        if batch.dim != self.d:
            raise MechanismError(
                f"the queries have d = {batch.dim} columns but the synopsis has d = {self.d}"
            )
        sigma = np.full(self.d, batch.sigma)
        return self._answer_gaussian(batch.centers, batch.weights, sigma, level, block)

    def _answer_gaussian(
        self,
        centers: NDArray[np.float64],
        weights: NDArray[np.float64],
        sigma: NDArray[np.float64],
        level: float,
        block: int,
    ) -> Answers:
        pieces = []
        min_length = self.index_set.max_degree + 1
        for start in range(0, centers.shape[0], block):
            expansion = gaussian_expansion(
                centers[start : start + block],
                weights[start : start + block],
                sigma,
                min_length=min_length,
            )
            pieces.append(self._answers(restrict(expansion, self.index_set), level))
        return _concatenate(pieces, level)

    def _answers(self, coef: QueryCoefficients, level: float) -> Answers:
        _check_level(level)
        c = coef.coefficients
        values = coef.constant + c @ self.moments
        norm2 = np.sqrt(np.einsum("qr,qr->q", c, c))
        stderr = self.calibration.stddev * norm2
        factor = noise_quantile_factor(self.noise_distribution, c, level)
        return Answers(
            values=values,
            stderr=stderr,
            truncation_bound=coef.truncation_bound.copy(),
            noise_halfwidth=factor * stderr,
            level=level,
            rigorous=np.full(c.shape[0], coef.rigorous),
            methods=(coef.method,) * c.shape[0],
        )

    # -- JSON

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (what analysts download); :meth:`from_dict` restores it exactly."""
        return {
            "format": MECHANISM_ID,
            "format_version": FORMAT_VERSION,
            "paper": "001: Wang, Fan, Zhang, Wang (NIPS 2013), Algorithms 1 and 2",
            "n": self.n,
            "d": self.d,
            "domain": {
                "bounds": [-1.0, 1.0],
                "basis": "T_r(x) = prod_i cos(r_i arccos x_i), x in [-1, 1]^d",
                "constant_moment": 1.0,
                "answer": "c_0 + sum_j c_{r_j} moments[j]",
            },
            "smoothness": self.smoothness,
            "index_set": self.index_set.to_dict(),
            "moments": [float(v) for v in self.moments],
            "noise": self.calibration.to_dict(),
            "privacy_cost": self.privacy_cost.as_dict(),
            "basis_choice": self.basis.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Synopsis:
        if data.get("format") != MECHANISM_ID:
            raise MechanismError(f"not a {MECHANISM_ID} document (format = {data.get('format')!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise MechanismError(
                f"format_version ({data.get('format_version')!r}) is not supported; "
                f"expected {FORMAT_VERSION}"
            )
        if data.get("domain", {}).get("bounds") != [-1.0, 1.0]:
            raise MechanismError("the synopsis must be on the [-1, 1]^d domain")
        index_set = IndexSet.from_dict(data["index_set"])
        if index_set.dim != int(data["d"]):
            raise MechanismError(f"index set has d = {index_set.dim}; the record says {data['d']}")
        synopsis = cls(
            index_set=index_set,
            moments=np.asarray(data["moments"], dtype=np.float64),
            calibration=noise.NoiseCalibration.from_dict(data["noise"]),
            n=int(data["n"]),
            smoothness=int(data["smoothness"]),
            basis=BasisChoice.from_dict(data["basis_choice"]),
        )
        if synopsis.privacy_cost.as_dict() != data["privacy_cost"]:
            raise MechanismError("the recorded privacy cost does not match the noise calibration")
        return synopsis


def measure(
    X: ArrayLike | RowSource,
    epsilon: float,
    delta: float = 0.0,
    smoothness: int = 4,
    basis_size: int | None = None,
    rng: np.random.Generator | None = None,
    *,
    basis: str | IndexSet = "auto",
    max_basis_size: int = DEFAULT_MAX_BASIS_SIZE,
    mechanism: str | None = None,
) -> Synopsis:
    """Release the noisy moment summary of ``X`` (paper 001, Algorithm 1).

    ``X`` is an ``(n, d)`` array or a :class:`RowSource` on ``[-1, 1]^d``. Noise: Laplace
    for ``delta = 0``, Gaussian for ``delta > 0`` (``mechanism`` overrides: one of
    :data:`app.mechanisms.noise.MECHANISMS`). The index set follows ``basis`` /
    ``basis_size`` (:func:`choose_basis`), from ``n``, ``d``, ``epsilon``, ``delta`` and
    ``smoothness`` only. ``rng`` is accepted for the library-wide signature; the synopsis
    uses no post-processing randomness (the privacy noise comes from OpenDP, which
    cannot be seeded).
    """
    check_budget(epsilon, delta)
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise MechanismError("rng must be a numpy.random.Generator or None")
    source = as_source(X)
    n, d = source.n_rows, source.n_cols
    mech = _mechanism(delta, mechanism)
    index_set, choice = choose_basis(
        n,
        d,
        epsilon=epsilon,
        delta=delta,
        smoothness=smoothness,
        basis=basis,
        basis_size=basis_size,
        max_basis_size=max_basis_size,
        mechanism=mech,
    )
    exact = moments(source, index_set)
    sensitivity = noise.moment_sensitivity(n, index_set.size)
    calibration = noise.calibrate(
        mech,
        sensitivity=sensitivity[_METRIC[mech]],
        epsilon=epsilon,
        delta=delta,
        dimension=index_set.size,
    )
    noisy = noise.sample(calibration, exact)
    return Synopsis(
        index_set=index_set,
        moments=noisy,
        calibration=calibration,
        n=n,
        smoothness=smoothness,
        basis=choice,
    )


# --- noise quantiles ---------------------------------------------------------------------


def noise_quantile_factor(
    distribution: str, coefficients: ArrayLike, level: float = 0.95
) -> NDArray[np.float64]:
    """``q`` with ``P(|<c, eta>| <= q * sd(<c, eta>)) = level`` for each row ``c``.

    Gaussian noise: ``ndtri((1 + level) / 2)`` exactly. Laplace noise (i.i.d., any
    scale): the Lugannani-Rice saddlepoint approximation of the weighted Laplace sum
    (module docstring), from its ``64`` largest ``|c_r|`` exactly and the rest as a
    Gaussian term of the same variance; rows whose effective number of coordinates
    ``(sum c^2)^2 / sum c^4`` exceeds ``10^4`` use the normal quantile (excess kurtosis
    ``< 3 10^-4``). Rows with ``c = 0`` get the normal quantile (their stderr is 0).
    """
    _check_level(level)
    c = np.atleast_2d(np.asarray(coefficients, dtype=np.float64))
    z = float(ndtri(0.5 + level / 2.0))
    out = np.full(c.shape[0], z)
    if distribution == "gaussian":
        return out
    if distribution != "laplace":
        raise MechanismError(f"noise distribution ({distribution!r}) must be laplace or gaussian")
    sq = c * c
    s2 = sq.sum(axis=1)
    s4 = (sq * sq).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        n_eff = np.where(s4 > 0, s2 * s2 / np.where(s4 > 0, s4, 1.0), np.inf)
    rows = np.flatnonzero(n_eff < _NORMAL_NEFF)
    if rows.size:
        out[rows] = _laplace_saddlepoint_factor(c[rows], 1.0 - level)
    return out


def _laplace_saddlepoint_factor(c: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    """Solve ``2 P_LR(X >= x) = alpha`` for ``X = sum_r c_r L_r``, ``L_r ~ Laplace(1)``.

    Parametrised by the saddlepoint ``u = tau / max|c|``, ``tau in (0, 1)``:
    ``x = K'(u)``, ``w = sqrt(2 (u x - K(u)))``, ``v = u sqrt(K''(u))``,
    ``P(X >= x) ~ Phi(-w) + phi(w) (1/v - 1/w)``; bisection on ``log tau``.
    """
    a = np.abs(c)
    m = min(_SADDLEPOINT_TERMS, a.shape[1])
    top = -np.partition(-a, m - 1, axis=1)[:, :m] if m < a.shape[1] else a
    rest = np.maximum((a * a).sum(axis=1) - (top * top).sum(axis=1), 0.0)  # Gaussian lump
    umax = top.max(axis=1)
    sd = np.sqrt(2.0 * (a * a).sum(axis=1))
    lo = np.full(a.shape[0], math.log(1e-12))
    hi = np.full(a.shape[0], math.log1p(-1e-12))
    top_scaled = top / umax[:, None]
    rest_scaled = rest / (umax * umax)

    def tail(log_tau: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        tau = np.exp(log_tau)[:, None]
        y = (top_scaled * tau) ** 2  # c_r^2 u^2 with u = tau / umax
        one = 1.0 - y
        k = -np.log(one).sum(axis=1) + rest_scaled * tau[:, 0] ** 2
        k1 = (2.0 * y / one).sum(axis=1) + 2.0 * rest_scaled * tau[:, 0] ** 2  # u K'(u)
        k2 = (2.0 * y * (1.0 + y) / one**2).sum(axis=1) + 2.0 * rest_scaled * tau[:, 0] ** 2
        w = np.sqrt(np.maximum(2.0 * (k1 - k), 1e-300))  # u x - K(u) with x = K'(u)
        v = np.sqrt(k2)  # u sqrt(K''(u))
        x = k1 / (tau[:, 0] / umax)
        p = ndtr(-w) + np.exp(-0.5 * w * w) / math.sqrt(2.0 * math.pi) * (1.0 / v - 1.0 / w)
        return 2.0 * p, x

    # Phase 1: the saddlepoint where x(u) = z sd / 2. Below it w is small and the
    # Lugannani-Rice correction 1/v - 1/w cancels catastrophically; the quantile lies above.
    target = 0.5 * float(ndtri(1.0 - alpha / 2.0)) * sd
    for _ in range(40):  # 2^-40 of the log-bracket: ~3e-11 relative in tau
        mid = 0.5 * (lo + hi)
        _, x = tail(mid)
        below = x < target
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    hi = np.full(a.shape[0], math.log1p(-1e-12))
    # Phase 2: 2 P(X >= x(u)) decreases in u; bisection for alpha.
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        p, _ = tail(mid)
        above = p > alpha
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    _, x = tail(0.5 * (lo + hi))
    out: NDArray[np.float64] = x / sd
    return out


# --- helpers -----------------------------------------------------------------------------

_METRIC = {"laplace": "l1", "laplace_approx": "linf", "gaussian": "l2"}


def _mechanism(delta: float, mechanism: str | None) -> str:
    if mechanism is None:
        return "laplace" if delta == 0.0 else "gaussian"
    if mechanism not in noise.MECHANISMS:
        raise MechanismError(f"mechanism ({mechanism!r}) must be one of {noise.MECHANISMS}")
    return mechanism


def _coordinate_stddev(mechanism: str, n: int, R: int, epsilon: float, delta: float) -> float:
    """Noise standard deviation of one coordinate when ``R`` moments are released.

    Laplace and Gaussian scales are linear in the sensitivity and do not depend on ``R``
    otherwise, so one OpenDP calibration at unit sensitivity serves every candidate (the
    release itself is calibrated exactly in :func:`measure`).
    """
    sensitivity = noise.moment_sensitivity(n, R)[_METRIC[mechanism]]
    if mechanism in ("laplace", "gaussian"):
        return sensitivity * _unit_stddev(mechanism, epsilon, delta)
    calibration = noise.calibrate(
        mechanism, sensitivity=sensitivity, epsilon=epsilon, delta=delta, dimension=R
    )
    return calibration.stddev


@functools.lru_cache(maxsize=64)
def _unit_stddev(mechanism: str, epsilon: float, delta: float) -> float:
    return noise.calibrate(
        mechanism, sensitivity=1.0, epsilon=epsilon, delta=delta, dimension=1
    ).stddev


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise MechanismError(f"{name} ({value!r}) must be a positive integer")


def _check_level(level: float) -> None:
    if not (isinstance(level, float | int) and 0.0 < level < 1.0):
        raise MechanismError(f"level ({level!r}) must lie in (0, 1)")


def _gaussian_key(query: object) -> tuple[Any, ...] | None:
    if isinstance(query, GaussianMixture):
        return ("iso", query.centers.shape, float(query.sigma))
    if isinstance(query, AnisotropicGaussianMixture):
        return ("aniso", query.centers.shape, query.sigma.tobytes())
    return None


def _mixture_arrays(
    query: object,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    if not isinstance(query, GaussianMixture | AnisotropicGaussianMixture):
        raise MechanismError("expected a Gaussian mixture query")
    return query.centers, query.weights, np.asarray(query.sigma, dtype=np.float64)


def _concatenate(pieces: Sequence[Answers], level: float) -> Answers:
    return Answers(
        values=np.concatenate([p.values for p in pieces]),
        stderr=np.concatenate([p.stderr for p in pieces]),
        truncation_bound=np.concatenate([p.truncation_bound for p in pieces]),
        noise_halfwidth=np.concatenate([p.noise_halfwidth for p in pieces]),
        level=level,
        rigorous=np.concatenate([p.rigorous for p in pieces]),
        methods=tuple(m for p in pieces for m in p.methods),
    )


def _merge(parts: Sequence[tuple[NDArray[np.int64], Answers]], size: int, level: float) -> Answers:
    values = np.empty(size)
    stderr = np.empty(size)
    bound = np.empty(size)
    half = np.empty(size)
    rigorous = np.empty(size, dtype=bool)
    methods = [""] * size
    for indices, answers in parts:
        values[indices] = answers.values
        stderr[indices] = answers.stderr
        bound[indices] = answers.truncation_bound
        half[indices] = answers.noise_halfwidth
        rigorous[indices] = answers.rigorous
        for i, method in zip(indices, answers.methods, strict=True):
            methods[int(i)] = method
    return Answers(values, stderr, bound, half, level, rigorous, tuple(methods))
